// dloss-run's command line: the usage text and its parsing.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/fused/Schedule.h"
#include "runtime/support/Error.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <thread>

namespace dloss {
namespace tools {

namespace {

const char *kUsage =
    "usage: dloss-run LOSS.mlir|LOSS.plan [--world N] [--entry F]\n"
    "                 --input NAME=PATH|NAME=SCALAR ... [--out DIR] [--iters "
    "K]\n"
    "                 [--check] [--tolerance T] [--timeout S] [--grad-mode "
    "ddp|global]\n"
    "                 [--runtime-checks] [--no-fuse] [--general-fusion-only]\n"
    "                 [--schedule auto|ring|gather] [--threads T]\n"
    "\n"
    "  --world N     start N local ranks (processes, Gloo on loopback); "
    "without it,\n"
    "                run as the rank given by "
    "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT\n"
    "  --entry F     the loss to run (default: the plan's only loss)\n"
    "  --input       one per argument; PATH is a .npy file and may contain "
    "{rank};\n"
    "                a number gives a scalar (--input scale=14.28)\n"
    "  --out DIR     writes DIR/rank<r>/result.json and grad_<NAME>.npy; "
    "result.json\n"
    "                has median_ms, loss_mem_mb (peak RSS minus the RSS right "
    "before\n"
    "                the first call) and peak_rss_mb (the rank's total peak "
    "RSS)\n"
    "  --iters K     timed forward+backward calls (after one warm-up call)\n"
    "  --check       compare with one process on the concatenated global "
    "batch\n"
    "  --tolerance T the largest relative gradient error --check accepts "
    "(1e-5)\n"
    "  --timeout S   deadline of the rendezvous and of every collective, in "
    "seconds\n"
    "                (default: DLOSS_TIMEOUT_S, else 300)\n"
    "  --runtime-checks  the runtime's check mode (as DLOSS_CHECK=1): NaN/Inf "
    "inputs\n"
    "                are rejected, global-mode replicated gradients must "
    "agree\n"
    "  --grad-mode   compile a .mlir loss with this gradient contract\n"
    "  --no-fuse     compile a .mlir loss without fusing gather + similarity "
    "into\n"
    "                ring-tiled kernels: the plan "
    "materialises\n"
    "                the B_local x B_global matrices\n"
    "  --general-fusion-only  fuse CLIP, SigLIP and PartialFC into the "
    "general\n"
    "                dloss.fused_similarity too\n"
    "  --schedule S  the fused ops' schedule: auto (the default, or "
    "DLOSS_SCHEDULE;\n"
    "                the cost model chooses per call), ring or gather\n"
    "  --threads T   intra-op threads per rank (default: OMP_NUM_THREADS, "
    "else the\n"
    "                cores divided by the ranks on this machine, at least 1)\n"
    "\n"
    "A .mlir loss is compiled with libdloss_compiler (DLOSS_COMPILER_LIBRARY,\n"
    "else beside libdloss_jit, else the dloss-compiler wheel's) and its plan\n"
    "cached in DLOSS_CACHE_DIR (default\n"
    "~/.cache/dloss; 'off' disables): a plan found there compiles nothing, "
    "even\n"
    "where the compiler library is missing. DIR/loss.plan is the plan run.\n"
    "\n"
    "A rank whose collective fails writes its flight record (its last 64\n"
    "collectives) to DIR/rank<r>/dloss-flight-rank<r>.json, or to "
    "DLOSS_FLIGHT_DIR.\n";

[[noreturn]] void usageError(const std::string &message) {
  std::cerr << "dloss-run: " << message << "\n\n" << kUsage;
  std::exit(2);
}

} // namespace

Options parseOptions(int argc, char **argv) {
  Options o;
  auto value = [&](int &i) -> std::string {
    if (i + 1 >= argc)
      usageError(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int &i, const char *what) {
    std::string v = value(i);
    char *end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || n < 0)
      usageError(std::string(what) + " must be a non-negative integer, got '" +
                 v + "'");
    return static_cast<int>(n);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--world") {
      o.world = number(i, "--world");
      if (o.world < 1)
        usageError("--world must be at least 1");
    } else if (a == "--entry") {
      o.entry = value(i);
    } else if (a == "--input") {
      std::string v = value(i);
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        usageError("--input takes NAME=PATH or NAME=NUMBER, got '" + v + "'");
      o.inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--out") {
      o.out = value(i);
    } else if (a == "--iters") {
      o.iters = number(i, "--iters");
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--tolerance") {
      o.tolerance = std::atof(value(i).c_str());
    } else if (a == "--timeout") {
      o.timeoutSeconds = number(i, "--timeout");
    } else if (a == "--runtime-checks") {
      o.runtimeChecks = true;
    } else if (a == "--grad-mode") {
      o.gradMode = value(i);
    } else if (a == "--threads") {
      o.threads = number(i, "--threads");
      if (o.threads < 1)
        usageError("--threads must be at least 1");
    } else if (a == "--no-fuse") {
      o.noFuse = true;
    } else if (a == "--schedule") {
      o.schedule = value(i);
      try {
        fused::parseSchedule(o.schedule, "--schedule");
      } catch (const Error &error) {
        usageError(error.problem());
      }
    } else if (a == "--general-fusion-only") {
      o.generalOnly = true;
    } else if (!a.empty() && a[0] == '-') {
      usageError("unknown option '" + a + "'");
    } else if (o.loss.empty()) {
      o.loss = a;
    } else {
      usageError("more than one loss given ('" + o.loss + "' and '" + a + "')");
    }
  }
  if (o.loss.empty())
    usageError("no loss given");
  return o;
}

int intraOpThreads(const Options &o) {
  if (o.threads > 0)
    return o.threads;
  auto positive = [](const char *name) {
    const char *value = std::getenv(name);
    if (!value || !*value)
      return 0;
    char *end = nullptr;
    long n = std::strtol(value, &end, 10);
    return (*end == '\0' && n > 0 && n < 1 << 16) ? static_cast<int>(n) : 0;
  };
  if (int n = positive("OMP_NUM_THREADS"))
    return n;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  int local = std::max(1, positive("LOCAL_WORLD_SIZE"));
  return std::max(1, cores / local);
}

} // namespace tools
} // namespace dloss
