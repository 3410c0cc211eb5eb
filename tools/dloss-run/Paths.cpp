// Where dloss-run writes its results.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/support/Error.h"

#include <filesystem>
#include <system_error>

namespace dloss {
namespace tools {

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void makeDirectories(const std::string &path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error)
    throw Error("cannot create the directory '" + path +
                    "': " + error.message(),
                "Choose an --out directory you can write to");
}

std::string rankDir(const Options &o, int rank) {
  return o.out + "/rank" + std::to_string(rank);
}

} // namespace tools
} // namespace dloss
