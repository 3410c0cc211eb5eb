// Compiles a .mlir loss with the compiler library, through the JIT's plan
// cache, so that dloss-run itself stays MLIR-free and a machine without the
// compiler runs losses compiled elsewhere.
#include "tools/dloss-run/DlossRun.h"

#include "frontend/Jit.h"
#include "runtime/support/Error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <unistd.h>

namespace dloss {
namespace tools {

/// Compiles LOSS.mlir into OUT/loss.plan (jit::compilePlan: the plan cache,
/// else libdloss_compiler).
std::string compile(const Options &o) {
  std::ifstream in(o.loss, std::ios::binary);
  if (!in)
    throw Error("cannot read the loss '" + o.loss +
                    "': " + std::strerror(errno),
                "Pass the path of a .mlir loss or a compiled .plan");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  auto plan =
      jit::compilePlan(text, o.gradMode, o.loss, !o.noFuse, o.generalOnly);

  makeDirectories(o.out);
  // Ranks started one by one (RANK, WORLD_SIZE) may share --out and compile
  // at once: each writes its own file and renames it into place, so no rank
  // reads a plan another is still writing.
  std::string path = o.out + "/loss.plan";
  std::string partial = path + "." + std::to_string(getpid()) + ".partial";
  const std::vector<uint8_t> &bytes = plan->bytes();
  std::ofstream out(partial, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out.good() || std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    throw Error("cannot write the compiled plan '" + path + "': " + why,
                "Check that --out is a writable directory");
  }
  return path;
}

} // namespace tools
} // namespace dloss
