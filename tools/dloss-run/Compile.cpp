// Compiles a .mlir loss by exec'ing dlossc, so that dloss-run stays MLIR-free.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/support/Error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace dloss {
namespace tools {

/// Compiles LOSS.mlir with dlossc (next to this binary unless --dlossc).
std::string compile(const Options &o) {
  std::string dlossc = o.dlossc;
  if (dlossc.empty()) {
    std::string self = selfPath();
    dlossc = self.substr(0, self.find_last_of('/') + 1) + "dlossc";
  }
  if (access(dlossc.c_str(), X_OK) != 0)
    throw Error(
        "cannot compile '" + o.loss +
            "': the compiler dlossc was not found at '" + dlossc + "'",
        "build with DLOSS_BUILD_COMPILER=ON, pass --dlossc PATH, or compile "
        "elsewhere with `dlossc LOSS.mlir -o LOSS.plan` and run the .plan");
  makeDirectories(o.out);
  // Ranks started one by one (RANK, WORLD_SIZE) may share --out and compile
  // at once: each writes its own file and renames it into place, so no rank
  // reads a plan another is still writing.
  std::string plan = o.out + "/loss.plan";
  std::string partial = plan + "." + std::to_string(getpid()) + ".partial";
  std::vector<std::string> args = {dlossc, o.loss, "-o", partial};
  if (!o.gradMode.empty())
    args.push_back("--grad-mode=" + o.gradMode);
  if (o.noFuse)
    args.push_back("--no-fuse");
  if (o.generalOnly)
    args.push_back("--general-fusion-only");
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execv(dlossc.c_str(), argv.data());
    std::perror("dloss-run: exec dlossc");
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::remove(partial.c_str());
    throw Error("dlossc could not compile '" + o.loss +
                    "' (its messages are above)",
                "fix the loss at the location dlossc names");
  }
  if (std::rename(partial.c_str(), plan.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    throw Error("cannot move the compiled plan '" + partial + "' to '" +
                    plan + "': " + why,
                "check that --out is a writable directory");
  }
  return plan;
}

} // namespace tools
} // namespace dloss
