// Where dloss-run writes its results.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/support/Error.h"

#include <cerrno>
#include <cstring>
#include <sstream>

#include <sys/stat.h>

namespace dloss {
namespace tools {

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void makeDirectories(const std::string &path) {
  std::string partial;
  std::stringstream ss(path);
  std::string piece;
  if (!path.empty() && path[0] == '/')
    partial = "/";
  while (std::getline(ss, piece, '/')) {
    if (piece.empty())
      continue;
    partial += piece + "/";
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("cannot create the directory '" + partial +
                      "': " + std::strerror(errno),
                  "Choose an --out directory you can write to");
  }
}

std::string rankDir(const Options &o, int rank) {
  return o.out + "/rank" + std::to_string(rank);
}

} // namespace tools
} // namespace dloss
