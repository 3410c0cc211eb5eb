// What dloss-run's files share: its options and the pieces main() runs.
#ifndef DLOSS_TOOLS_DLOSS_RUN_DLOSSRUN_H
#define DLOSS_TOOLS_DLOSS_RUN_DLOSSRUN_H

#include "runtime/comm/Communicator.h"
#include "runtime/plan/PlanFile.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dloss {
namespace tools {

/// The command line (Options.cpp has the usage text).
struct Options {
  std::string loss;
  int world = 0; // 0: not a launcher
  std::string entry;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::string out = "dloss-run-out";
  int iters = 5;
  bool check = false;
  double tolerance = 1e-5;
  std::string gradMode;   // a .mlir loss's gradient contract ("": its own)
  int timeoutSeconds = 0; // 0: the runtime's default (DLOSS_TIMEOUT_S or 300)
  bool runtimeChecks = false; // else DLOSS_CHECK decides
  bool noFuse = false;        // compile without fusion (dlossc --no-fuse)
  bool generalOnly = false;   // as dlossc --general-fusion-only
  std::string schedule; // the fused ops' schedule ("": DLOSS_SCHEDULE decides)
  int threads = 0; // intra-op threads per rank; 0: intraOpThreads() decides
};

//===----------------------------------------------------------------------===//
// Options.cpp
//===----------------------------------------------------------------------===//

/// Parses the command line; prints the usage and exits 2 on a mistake
/// (0 for --help).
Options parseOptions(int argc, char **argv);

/// Each rank's intra-op thread count: --threads, else OMP_NUM_THREADS, else
/// the machine's cores divided by the ranks on this machine (LOCAL_WORLD_SIZE,
/// which the launcher sets; 1 when unset), at least 1. Ranks that share the
/// cores would otherwise each start one thread per core (20-30% slower with
/// 4 ranks on 2 cores).
int intraOpThreads(const Options &o);

/// The loss --entry names (or the plan's only loss) and its gradient
/// function: PlanFile::entry, with hints that name --entry.
inline PlanEntry entryOf(const PlanFile &plan, const Options &o) {
  return plan.entry(o.entry, "--entry F");
}

//===----------------------------------------------------------------------===//
// Paths.cpp
//===----------------------------------------------------------------------===//

bool endsWith(const std::string &s, const std::string &suffix);
/// `mkdir -p`; a dloss::Error naming the directory when it cannot.
void makeDirectories(const std::string &path);
/// Where rank `rank` writes its results: OUT/rank<r>.
std::string rankDir(const Options &o, int rank);

//===----------------------------------------------------------------------===//
// Compile.cpp
//===----------------------------------------------------------------------===//

/// Compiles the .mlir loss into OUT/loss.plan, through the plan cache and the
/// compiler library (jit::compilePlan); returns its path.
std::string compile(const Options &o);

//===----------------------------------------------------------------------===//
// Inputs.cpp
//===----------------------------------------------------------------------===//

/// An input this rank could not load: its argument (-1: none) and a reason
/// code that every rank can explain, so that the peers can be told.
struct InputFailure {
  int64_t argument = -1;
  int64_t reason = 0;
};

/// Checks that every --input names an argument and every argument has one.
/// The same on every rank (they share the command line), so it may raise
/// before the ranks meet.
void checkInputNames(const Options &o, const plan::Function &f);

/// Rank `rank`'s inputs, in argument order. With `failure` given, an input
/// file that cannot be loaded does not raise: its argument and reason go
/// there, so that the rank can tell its peers instead of leaving them
/// waiting.
std::vector<at::Tensor> loadInputs(const Options &o, const plan::Function &f,
                                   int rank, InputFailure *failure = nullptr);

/// Every rank learns which ranks could not load an input, and all raise the
/// same error naming them, their files and why. Collective.
void agreeOnInputs(const Options &o, const plan::Function &f,
                   Communicator &comm, InputFailure mine);

//===----------------------------------------------------------------------===//
// RankRunner.cpp
//===----------------------------------------------------------------------===//

/// Runs this process's rank: the gradient function, timed, results written.
/// Returns the process exit code.
int runRank(const Options &o, const std::string &planPath);

//===----------------------------------------------------------------------===//
// ReferenceCheck.cpp
//===----------------------------------------------------------------------===//

/// Compares the ranks' results with one process over the global batch, per
/// the gradient contract. Returns the process exit code.
int checkAgainstReference(const Options &o, const std::string &planPath,
                          int world);

//===----------------------------------------------------------------------===//
// Launcher.cpp
//===----------------------------------------------------------------------===//

/// Starts o.world ranks (forks of this process, each running runRank) and
/// waits for them. Returns the process exit code: 0 when every rank succeeded.
int launch(const Options &o, const std::string &planPath);

} // namespace tools
} // namespace dloss

#endif // DLOSS_TOOLS_DLOSS_RUN_DLOSSRUN_H
