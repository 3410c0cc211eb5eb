// dloss-run's main: picks this process's role (launcher or rank) and runs it.
//
//   dloss-run LOSS.mlir|LOSS.plan --world N --input NAME=PATH ... --out DIR
//             [--entry F] [--iters K] [--check] [--tolerance T] [--timeout S]
//             [--runtime-checks] [--no-fuse]
//
// With --world N it is its own launcher (Launcher.cpp): it compiles the loss
// once (Compile.cpp: the plan cache, else libdloss_compiler), starts N
// processes of itself with the torchrun variables set (Gloo on loopback), waits
// for them, and with --check compares their gradients with the same loss run on
// one process over the concatenated global batch (ReferenceCheck.cpp). With
// RANK/WORLD_SIZE already in the environment it runs as that one rank
// (RankRunner.cpp).
#include "tools/dloss-run/DlossRun.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <unistd.h>

using namespace dloss::tools;

namespace {

int runProcess(int argc, char **argv) {
  Options o = parseOptions(argc, argv);
  try {
    const char *compiled = std::getenv("DLOSS_RUN_PLAN");
    bool isRank = std::getenv("RANK") || std::getenv("WORLD_SIZE");
    if (isRank && compiled)
      return runRank(o, compiled); // a rank we launched
    std::string plan = endsWith(o.loss, ".mlir") ? compile(o) : o.loss;
    if (o.world > 0 && !isRank) {
      int code = launch(o, plan);
      if (code == 0 && o.check)
        return checkAgainstReference(o, plan, o.world);
      return code;
    }
    int code = runRank(o, plan);
    if (code == 0 && o.check) {
      // Under an external launcher: rank 0 checks once every rank has written.
      std::cerr
          << "dloss-run: --check needs --world N (dloss-run as the launcher)\n";
      return 2;
    }
    return code;
  } catch (const std::exception &e) {
    std::cerr << "dloss-run: " << e.what() << "\n";
    return 1;
  }
}

} // namespace

// What runProcess() made is gone when it returns; std::exit would add only
// libtorch's teardown (every operator deregistered), a third of a one-rank
// run's CPU time. Ranks end the same way (Launcher.cpp).
int main(int argc, char **argv) {
  int code = runProcess(argc, argv);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(code);
}
