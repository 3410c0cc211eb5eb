// dloss-run: runs a compiled distributed loss on N local ranks (or as one rank of a launcher's job).
//
//   dloss-run LOSS.mlir|LOSS.plan --world N --input NAME=PATH ... --out DIR
//             [--entry F] [--iters K] [--check] [--tolerance T] [--timeout S]
//             [--runtime-checks] [--no-fuse]
//
// With --world N it is its own launcher: it compiles the loss once (dlossc),
// starts N processes of itself with the torchrun variables set (Gloo on
// loopback), waits for them, and with --check compares their gradients with
// the same loss run on one process over the concatenated global batch. With
// RANK/WORLD_SIZE already in the environment it runs as that one rank.
//
// As a launcher it leaves nothing behind: a rank that fails makes the launcher
// exit non-zero once the others have stopped (they fail within the deadline);
// ranks still running 10 s past the deadline are killed; SIGINT/SIGTERM/SIGHUP
// stop every rank; and a rank dies with its launcher (PR_SET_PDEATHSIG) even
// if the launcher is killed outright. It signals only processes it started.
//
// Each rank's result.json has the median time of one forward+backward and
// the loss's memory: loss_mem_mb = peak RSS (VmHWM) after the timed calls
// minus the RSS right before the first call (LossMemory.h).
#include "runtime/comm/Communicator.h"
#include "runtime/support/Error.h"
#include "runtime/exec/Executor.h"
#include "runtime/io/Npy.h"
#include "runtime/plan/PlanFile.h"
#include "tools/dloss-run/LossMemory.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using dloss::Error;

namespace {

struct Options {
  std::string loss;
  int world = 0; // 0: not a launcher
  std::string entry;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::string out = "dloss-run-out";
  int iters = 5;
  bool check = false;
  double tolerance = 1e-5;
  std::string dlossc;
  std::string gradMode; // passed to dlossc --grad-mode
  int timeoutSeconds = 0; // 0: the runtime's default (DLOSS_TIMEOUT_S or 300)
  bool runtimeChecks = false; // else DLOSS_CHECK decides
  bool noFuse = false;        // passed to dlossc --no-fuse
};

const char *kUsage =
    "usage: dloss-run LOSS.mlir|LOSS.plan [--world N] [--entry F]\n"
    "                 --input NAME=PATH|NAME=SCALAR ... [--out DIR] [--iters K]\n"
    "                 [--check] [--tolerance T] [--timeout S] [--grad-mode ddp|global]\n"
    "                 [--runtime-checks] [--no-fuse] [--dlossc PATH]\n"
    "\n"
    "  --world N     start N local ranks (processes, Gloo on loopback); without it,\n"
    "                run as the rank given by RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT\n"
    "  --entry F     the loss to run (default: the plan's only loss)\n"
    "  --input       one per argument; PATH is a .npy file and may contain {rank};\n"
    "                a number gives a scalar (--input scale=14.28)\n"
    "  --out DIR     writes DIR/rank<r>/result.json and grad_<NAME>.npy; result.json\n"
    "                has median_ms, loss_mem_mb (peak RSS minus the RSS right before\n"
    "                the first call) and peak_rss_mb (the rank's total peak RSS)\n"
    "  --iters K     timed forward+backward calls (after one warm-up call)\n"
    "  --check       compare with one process on the concatenated global batch\n"
    "  --tolerance T the largest relative gradient error --check accepts (1e-5)\n"
    "  --timeout S   deadline of the rendezvous and of every collective, in seconds\n"
    "                (default: DLOSS_TIMEOUT_S, else 300)\n"
    "  --runtime-checks  the runtime's check mode (as DLOSS_CHECK=1): NaN/Inf inputs\n"
    "                are rejected, global-mode replicated gradients must agree\n"
    "  --grad-mode   compile a .mlir loss with this gradient contract (dlossc)\n"
    "  --no-fuse     compile a .mlir loss without fusing gather + similarity into\n"
    "                ring-tiled kernels (dlossc --no-fuse): the plan materialises\n"
    "                the B_local x B_global matrices\n"
    "  --dlossc PATH the compiler for a .mlir loss (default: dlossc beside dloss-run)\n"
    "\n"
    "A rank whose collective fails writes its flight record (its last 64\n"
    "collectives) to DIR/rank<r>/dloss-flight-rank<r>.json, or to DLOSS_FLIGHT_DIR.\n";

[[noreturn]] void usageError(const std::string &message) {
  std::cerr << "dloss-run: " << message << "\n\n" << kUsage;
  std::exit(2);
}

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
      usageError(std::string(what) + " must be a non-negative integer, got '" + v + "'");
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
    } else if (a == "--no-fuse") {
      o.noFuse = true;
    } else if (a == "--dlossc") {
      o.dlossc = value(i);
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

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string selfPath() {
  char buffer[4096];
  ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0)
    return "dloss-run";
  buffer[n] = 0;
  return buffer;
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
      throw Error("cannot create the directory '" + partial + "': " +
                      std::strerror(errno),
                  "choose an --out directory you can write to");
  }
}

/// Compiles LOSS.mlir with dlossc (next to this binary unless --dlossc).
std::string compile(const Options &o) {
  std::string dlossc = o.dlossc;
  if (dlossc.empty()) {
    std::string self = selfPath();
    dlossc = self.substr(0, self.find_last_of('/') + 1) + "dlossc";
  }
  if (access(dlossc.c_str(), X_OK) != 0)
    throw Error("cannot compile '" + o.loss + "': the compiler dlossc was not found at '" +
                    dlossc + "'",
                "build with DLOSS_BUILD_COMPILER=ON, pass --dlossc PATH, or compile "
                "elsewhere with `dlossc LOSS.mlir -o LOSS.plan` and run the .plan");
  makeDirectories(o.out);
  std::string plan = o.out + "/loss.plan";
  std::vector<std::string> args = {dlossc, o.loss, "-o", plan};
  if (!o.gradMode.empty())
    args.push_back("--grad-mode=" + o.gradMode);
  if (o.noFuse)
    args.push_back("--no-fuse");
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
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("dlossc could not compile '" + o.loss + "' (its messages are above)",
                "fix the loss at the location dlossc names");
  return plan;
}

/// The loss to run and its derived gradient function.
struct Entry {
  const dloss::plan::Function *loss = nullptr;
  const dloss::plan::Function *grad = nullptr;
};

Entry findEntry(const dloss::PlanFile &plan, const std::string &requested) {
  std::vector<const dloss::plan::Function *> losses;
  for (const auto *f : *plan.plan().functions()) {
    bool isLoss = f->grad_mode() && f->grad_mode()->size() &&
                  !(f->gradient_of() && f->gradient_of()->size());
    if (isLoss && (requested.empty() || f->name()->str() == requested))
      losses.push_back(f);
  }
  if (losses.size() != 1) {
    std::string names;
    for (const auto *f : *plan.plan().functions())
      if (f->grad_mode() && f->grad_mode()->size() &&
          !(f->gradient_of() && f->gradient_of()->size()))
        names += (names.empty() ? "" : ", ") + f->name()->str();
    if (losses.empty())
      throw Error(requested.empty()
                      ? "plan '" + plan.name() + "' has no loss entry point"
                      : "plan '" + plan.name() + "' has no loss called '" + requested + "'",
                  names.empty() ? "Mark the loss function with the dloss.loss attribute"
                                : "Choose one of: " + names + " (--entry F)");
    throw Error("plan '" + plan.name() + "' has several losses: " + names,
                "Choose one with --entry F");
  }
  Entry e;
  e.loss = losses.front();
  for (const auto *f : *plan.plan().functions())
    if (f->gradient_of() && f->gradient_of()->str() == e.loss->name()->str())
      e.grad = f;
  if (!e.grad)
    throw Error("plan '" + plan.name() + "' has no gradient function for @" +
                    e.loss->name()->str(),
                "Compile the loss with dlossc, which derives @" +
                    e.loss->name()->str() + "_grad");
  return e;
}

std::string argumentName(const dloss::plan::Function &f, unsigned i) {
  const auto *a = f.arguments()->Get(i);
  if (a->name() && a->name()->size())
    return a->name()->str();
  return "arg" + std::to_string(i);
}

std::string substituteRank(std::string path, int rank) {
  const std::string key = "{rank}";
  for (size_t at; (at = path.find(key)) != std::string::npos;)
    path.replace(at, key.size(), std::to_string(rank));
  return path;
}

at::ScalarType scalarTypeOf(dloss::plan::DType dtype) {
  using dloss::plan::DType;
  switch (dtype) {
  case DType::f16: return at::kHalf;
  case DType::bf16: return at::kBFloat16;
  case DType::f32: return at::kFloat;
  case DType::f64: return at::kDouble;
  case DType::i8: return at::kChar;
  case DType::i16: return at::kShort;
  case DType::i32: return at::kInt;
  case DType::i64: return at::kLong;
  case DType::u8: return at::kByte;
  case DType::boolean: return at::kBool;
  }
  return at::kFloat;
}

/// Checks that every --input names an argument and every argument has one.
/// The same on every rank (they share the command line), so it may raise
/// before the ranks meet.
void checkInputNames(const Options &o, const dloss::plan::Function &f) {
  unsigned n = f.arguments() ? f.arguments()->size() : 0;
  std::vector<bool> given(n, false);
  for (const auto &input : o.inputs) {
    unsigned i = 0;
    while (i < n && argumentName(f, i) != input.first)
      ++i;
    if (i == n) {
      std::string names;
      for (unsigned j = 0; j < n; ++j)
        names += (j ? ", " : "") + argumentName(f, j);
      throw Error("--input " + input.first + ": @" + f.name()->str() +
                      " has no argument called '" + input.first + "'",
                  "Its arguments are: " + names);
    }
    given[i] = true;
  }
  for (unsigned i = 0; i < n; ++i)
    if (!given[i])
      throw Error("no input for argument '" + argumentName(f, i) + "' of @" +
                      f.name()->str(),
                  "Pass --input " + argumentName(f, i) + "=PATH.npy (or a number)");
}

/// The .npy path of input `name` on rank `rank`, or "" for an inline number.
std::string inputPath(const std::string &source, int rank) {
  char *end = nullptr;
  std::strtod(source.c_str(), &end);
  if (!source.empty() && *end == 0 && !endsWith(source, ".npy"))
    return "";
  return substituteRank(source, rank);
}

/// Why an input file could not be loaded, as a code every rank can explain.
enum LoadFailure : int64_t { Loaded = 0, Missing = 1, Unreadable = 2, Invalid = 3 };

const char *explain(int64_t reason) {
  switch (reason) {
  case Missing: return "the file does not exist";
  case Unreadable: return "the file cannot be read";
  default: return "it is not a valid .npy file";
  }
}

/// Rank `rank`'s inputs, in argument order. With `failure` given, an input
/// that cannot be loaded does not raise: its argument and reason go there,
/// so that the rank can tell its peers instead of leaving them waiting.
std::vector<at::Tensor> loadInputs(const Options &o, const dloss::plan::Function &f,
                                   int rank, std::pair<int64_t, int64_t> *failure = nullptr) {
  checkInputNames(o, f);
  unsigned n = f.arguments() ? f.arguments()->size() : 0;
  std::vector<at::Tensor> inputs(n);
  for (const auto &[name, source] : o.inputs) {
    unsigned i = 0;
    while (argumentName(f, i) != name)
      ++i;
    std::string path = inputPath(source, rank);
    try {
      if (path.empty())
        inputs[i] = at::scalar_tensor(std::strtod(source.c_str(), nullptr), at::kDouble)
                        .to(scalarTypeOf(f.arguments()->Get(i)->type()->dtype()));
      else
        inputs[i] = dloss::npy::load(path);
    } catch (const std::exception &) {
      if (!failure)
        throw;
      if (failure->first < 0)
        *failure = {i, access(path.c_str(), F_OK) != 0   ? Missing
                       : access(path.c_str(), R_OK) != 0 ? Unreadable
                                                         : Invalid};
    }
  }
  return inputs;
}

/// Every rank learns which ranks could not load an input, and all raise the
/// same error naming them, their files and why.
void agreeOnInputs(const Options &o, const dloss::plan::Function &f,
                   dloss::Communicator &comm, std::pair<int64_t, int64_t> mine) {
  std::vector<int64_t> all = comm.allGatherInts({mine.first, mine.second});
  std::string problem;
  for (int r = 0; r < comm.worldSize(); ++r) {
    int64_t arg = all[2 * r], reason = all[2 * r + 1];
    if (arg < 0)
      continue;
    std::string name = argumentName(f, static_cast<unsigned>(arg));
    std::string source;
    for (const auto &input : o.inputs)
      if (input.first == name)
        source = input.second;
    problem += std::string(problem.empty() ? "" : "; ") + "rank " + std::to_string(r) +
               " could not load input '" + name + "' from '" + inputPath(source, r) +
               "': " + explain(reason);
  }
  if (!problem.empty())
    throw Error(problem, "Check those ranks' input files (--input NAME=PATH, with "
                         "{rank} for per-rank files)");
}

std::string rankDir(const Options &o, int rank) {
  return o.out + "/rank" + std::to_string(rank);
}

/// Runs this process's rank: the gradient function, timed, results written.
int runRank(const Options &o, const std::string &planPath) {
  dloss::RendezvousOptions rendezvous = dloss::RendezvousOptions::fromEnvironment();
  if (o.timeoutSeconds > 0)
    rendezvous.timeout = std::chrono::seconds(o.timeoutSeconds);
  int rank = rendezvous.rank;
  // Outlives the try block, so that an error is printed before the
  // communicator's teardown (which may wait briefly for the peers).
  std::unique_ptr<dloss::Communicator> comm;
  try {
    auto plan = dloss::PlanFile::load(planPath);
    Entry entry = findEntry(*plan, o.entry);
    checkInputNames(o, *entry.grad);
    dloss::ExecutorOptions executorOptions = dloss::ExecutorOptions::fromEnvironment();
    if (o.runtimeChecks)
      executorOptions.check = true;
    // Flight records go beside the rank's results unless DLOSS_FLIGHT_DIR says.
    if (!std::getenv("DLOSS_FLIGHT_DIR")) {
      rendezvous.flightDir = rankDir(o, rank);
      makeDirectories(rendezvous.flightDir);
    }
    // Meet the peers first: from here on, a problem of this rank reaches
    // every rank through the preflight.
    comm = dloss::connectGloo(rendezvous);
    dloss::Executor executor(plan, *comm, executorOptions);
    const std::string gradName = entry.grad->name()->str();
    std::pair<int64_t, int64_t> failure{-1, Loaded};
    std::vector<at::Tensor> inputs = loadInputs(o, *entry.grad, rank, &failure);
    agreeOnInputs(o, *entry.grad, *comm, failure);

    // Inputs loaded, peers met: what the calls add from here is the loss's.
    auto memory = dloss::tools::LossMemory::start();
    std::vector<at::Tensor> outputs = executor.run(gradName, inputs); // warm-up
    std::vector<double> times;
    for (int k = 0; k < o.iters; ++k) {
      auto start = std::chrono::steady_clock::now();
      outputs = executor.run(gradName, inputs);
      times.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
    memory.stop();
    std::sort(times.begin(), times.end());
    double median = times.empty() ? 0.0 : times[times.size() / 2];
    // The summary names the rank that must fit: the largest loss memory.
    std::vector<int64_t> lossKb = comm->allGatherInts({memory.hwmKb - memory.baselineKb});
    double worstLossMb = *std::max_element(lossKb.begin(), lossKb.end()) / 1024.0;

    std::string dir = rankDir(o, rank);
    makeDirectories(dir);
    std::ostringstream json;
    json.precision(9);
    json << "{\n  \"rank\": " << rank << ",\n  \"world_size\": "
         << comm->worldSize() << ",\n  \"loss\": " << outputs[0].item<double>();
    for (unsigned k = 1; k < outputs.size(); ++k) {
      std::string name =
          argumentName(*entry.grad, entry.grad->grad_arguments()->Get(k - 1));
      at::Tensor g = outputs[k].to(at::kFloat).contiguous();
      dloss::npy::save(dir + "/grad_" + name + ".npy", g);
      if (g.dim() == 0)
        json << ",\n  \"grad_" << name << "\": " << g.item<double>();
    }
    json << ",\n  \"median_ms\": " << median << ",\n  \"peak_rss_mb\": "
         << memory.peakRssMb() << ",\n  \"loss_mem_mb\": " << memory.lossMb()
         << ",\n  \"baseline_rss_mb\": " << memory.baselineMb()
         << ",\n  \"vm_hwm_mb\": " << memory.hwmMb()
         << ",\n  \"hwm_reset\": " << (memory.hwmReset ? "true" : "false") << "\n}\n";
    std::ofstream(dir + "/result.json") << json.str();
    if (rank == 0)
      std::cout << "dloss-run: @" << entry.loss->name()->str() << " on "
                << comm->worldSize() << " ranks: loss " << outputs[0].item<double>()
                << ", " << median << " ms per forward+backward (median of "
                << o.iters << ")\n"
                << "dloss-run: loss memory " << worstLossMb
                << " MB per rank at most (peak RSS minus the RSS before the first call"
                << (memory.hwmReset ? "" : "; the peak could not be reset, so it may be "
                                           "an earlier one")
                << ")\n";
    return 0;
  } catch (const std::exception &e) {
    // One write, so that the ranks' lines never interleave.
    std::string line = "dloss-run: rank " + std::to_string(rank) + ": " + e.what() + "\n";
    ssize_t written = ::write(2, line.data(), line.size());
    (void)written;
    return 1;
  }
}

double readLoss(const std::string &resultJson) {
  std::ifstream in(resultJson);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  size_t at = text.find("\"loss\":");
  if (at == std::string::npos)
    throw Error("'" + resultJson + "' has no loss", "rerun dloss-run");
  return std::strtod(text.c_str() + at + 7, nullptr);
}

/// max |got - expected| / max |expected|: the error relative to the
/// gradient's scale, so that near-zero entries do not dominate.
double relativeError(const at::Tensor &got, const at::Tensor &expected) {
  at::Tensor g = got.to(at::kDouble), e = expected.to(at::kDouble);
  double scale = e.numel() ? e.abs().max().item<double>() : 0.0;
  double diff = e.numel() ? (g - e).abs().max().item<double>() : 0.0;
  return diff / std::max(scale, 1e-30);
}

/// Compares the ranks' results with one process over the global batch, per
/// the gradient contract. Returns the process exit code.
int checkAgainstReference(const Options &o, const std::string &planPath, int world) {
  auto plan = dloss::PlanFile::load(planPath);
  Entry entry = findEntry(*plan, o.entry);
  const auto &grad = *entry.grad;
  unsigned n = grad.arguments()->size();

  // The global batch: varying inputs concatenated in rank order, replicated
  // ones as rank 0 holds them.
  std::vector<std::vector<at::Tensor>> perRank;
  for (int r = 0; r < world; ++r)
    perRank.push_back(loadInputs(o, grad, r));
  std::vector<at::Tensor> global(n);
  for (unsigned i = 0; i < n; ++i) {
    if (grad.arguments()->Get(i)->replicated() || perRank[0][i].dim() == 0) {
      global[i] = perRank[0][i];
      continue;
    }
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < world; ++r)
      pieces.push_back(perRank[r][i]);
    global[i] = at::cat(pieces, 0);
  }
  auto single = dloss::makeSingleProcessCommunicator();
  dloss::Executor reference(plan, *single);
  std::vector<at::Tensor> expected = reference.run(grad.name()->str(), global);

  bool global_mode = grad.grad_mode() && grad.grad_mode()->str() == "global";
  double refLoss = expected[0].item<double>();
  double worst = 0.0;
  std::string worstWhat = "loss";
  auto note = [&](double err, const std::string &what) {
    if (err > worst || worstWhat.empty()) {
      worst = std::max(worst, err);
      worstWhat = what;
    }
  };
  // The loss is the global loss on every rank: the same value, bit for bit
  // (result.json prints 9 significant digits, exact for float32).
  double rank0Loss = readLoss(rankDir(o, 0) + "/result.json");
  bool lossIdentical = true;
  for (int r = 0; r < world; ++r) {
    double loss = readLoss(rankDir(o, r) + "/result.json");
    lossIdentical &= loss == rank0Loss;
    note(std::abs(loss - refLoss) / std::max(std::abs(refLoss), 1e-30),
         "loss on rank " + std::to_string(r));
  }
  if (!lossIdentical) {
    std::printf("dloss-run --check: FAIL: the loss differs between ranks (see "
                "%s/rank*/result.json)\n", o.out.c_str());
    return 3;
  }
  for (unsigned k = 1; k < expected.size(); ++k) {
    unsigned arg = grad.grad_arguments()->Get(k - 1);
    std::string name = argumentName(grad, arg);
    std::vector<at::Tensor> got;
    for (int r = 0; r < world; ++r)
      got.push_back(dloss::npy::load(rankDir(o, r) + "/grad_" + name + ".npy"));
    at::Tensor ref = expected[k].to(at::kDouble);
    bool replicated = grad.arguments()->Get(arg)->replicated();
    if (replicated && !global_mode) {
      // ddp: the ranks' gradients average to the global-batch gradient.
      at::Tensor mean = at::zeros_like(ref);
      for (auto &g : got)
        mean = mean + g.to(at::kDouble);
      note(relativeError(mean / world, ref), "grad_" + name + " (mean over ranks)");
      continue;
    }
    int64_t offset = 0;
    for (int r = 0; r < world; ++r) {
      at::Tensor want = ref;
      if (!replicated && ref.dim() > 0) {
        int64_t rows = perRank[r][arg].size(0);
        want = ref.narrow(0, offset, rows);
        offset += rows;
      }
      if (!global_mode)
        want = want * world; // ddp: N * dF/dx_r
      note(relativeError(got[r], want), "grad_" + name + " on rank " + std::to_string(r));
    }
  }
  std::printf("dloss-run --check: global loss %.9g (reference %.9g); worst relative "
              "gradient error %.3g (%s), tolerance %.3g: %s\n",
              readLoss(rankDir(o, 0) + "/result.json"), refLoss, worst,
              worstWhat.c_str(), o.tolerance, worst <= o.tolerance ? "PASS" : "FAIL");
  return worst <= o.tolerance ? 0 : 3;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0)
    throw Error("cannot find a free port on 127.0.0.1 for the rendezvous",
                "set MASTER_PORT and run the ranks under a launcher");
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

/// The signal that asked the launcher to stop (0: none).
volatile std::sig_atomic_t stopSignal = 0;

extern "C" void onStopSignal(int signal) { stopSignal = signal; }

/// Starts `world` ranks of this program and waits for them. A rank that
/// fails makes its peers fail too (they see it gone); any still running
/// after the deadline are killed, so no process of ours outlives the run.
int launch(const Options &o, int argc, char **argv, const std::string &planPath) {
  {
    // Mistakes every rank would make alike are reported before any starts.
    auto plan = dloss::PlanFile::load(planPath);
    checkInputNames(o, *findEntry(*plan, o.entry).grad);
  }
  int port = freePort();
  // A stop request (Ctrl-C, a job scheduler's SIGTERM) stops the ranks too.
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP})
    sigaction(signal, &action, nullptr);
  pid_t launcher = getpid();
  std::vector<pid_t> children;
  for (int r = 0; r < o.world; ++r) {
    pid_t pid = fork();
    if (pid < 0)
      throw Error(std::string("cannot start rank ") + std::to_string(r) + ": " +
                      std::strerror(errno),
                  "lower --world or free some processes");
    if (pid == 0) {
      // Dies with the launcher, even one killed by SIGKILL (no orphans).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher)
        _exit(1); // the launcher died before prctl
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(o.world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("DLOSS_RUN_PLAN", planPath.c_str(), 1);
      std::string self = selfPath();
      std::vector<char *> args;
      for (int i = 0; i < argc; ++i)
        args.push_back(argv[i]);
      args.push_back(nullptr);
      execv(self.c_str(), args.data());
      std::perror("dloss-run: exec");
      _exit(127);
    }
    children.push_back(pid);
  }

  int failures = 0;
  size_t running = children.size();
  std::vector<bool> done(children.size(), false);
  auto deadline = std::chrono::steady_clock::time_point::max();
  // The ranks' own deadline (as they compute it), plus a margin.
  double timeoutSeconds = o.timeoutSeconds;
  if (timeoutSeconds <= 0) {
    timeoutSeconds = 300;
    try {
      timeoutSeconds = dloss::RendezvousOptions::fromEnvironment().timeout.count() / 1000.0;
    } catch (const std::exception &) {
      // The ranks report a malformed variable themselves.
    }
  }
  int grace = static_cast<int>(std::ceil(timeoutSeconds)) + 10;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = std::find(children.begin(), children.end(), pid);
      if (it == children.end())
        continue;
      done[it - children.begin()] = true;
      --running;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        ++failures;
        if (WIFSIGNALED(status))
          std::cerr << "dloss-run: rank " << (it - children.begin())
                    << " was killed by signal " << WTERMSIG(status) << "\n";
        if (deadline == std::chrono::steady_clock::time_point::max())
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
      }
      continue;
    }
    if (stopSignal) {
      int signal = stopSignal;
      std::cerr << "dloss-run: stopping the ranks (signal " << signal << ")\n";
      for (size_t r = 0; r < children.size(); ++r)
        if (!done[r])
          kill(children[r], SIGTERM);
      // Ranks have no handler, so SIGTERM ends them; SIGKILL the rest.
      auto killAt = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (running > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        auto it = std::find(children.begin(), children.end(), pid);
        if (pid > 0 && it != children.end() && !done[it - children.begin()]) {
          done[it - children.begin()] = true;
          --running;
          continue;
        }
        if (std::chrono::steady_clock::now() > killAt) {
          for (size_t r = 0; r < children.size(); ++r)
            if (!done[r])
              kill(children[r], SIGKILL);
          killAt = std::chrono::steady_clock::time_point::max();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return 128 + signal;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < children.size(); ++r)
        if (!done[r]) {
          std::cerr << "dloss-run: rank " << r << " did not stop after a peer failed; "
                    << "killing it\n";
          kill(children[r], SIGKILL);
        }
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (failures) {
    std::cerr << "dloss-run: " << failures << " of " << o.world
              << " ranks failed (their messages are above)\n";
    return 1;
  }
  if (o.check)
    return checkAgainstReference(o, planPath, o.world);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  Options o = parseOptions(argc, argv);
  try {
    const char *compiled = std::getenv("DLOSS_RUN_PLAN");
    bool isRank = std::getenv("RANK") || std::getenv("WORLD_SIZE");
    if (isRank && compiled)
      return runRank(o, compiled); // a rank we launched
    std::string plan = endsWith(o.loss, ".mlir") ? compile(o) : o.loss;
    if (o.world > 0 && !isRank)
      return launch(o, argc, argv, plan);
    int code = runRank(o, plan);
    if (code == 0 && o.check) {
      // Under an external launcher: rank 0 checks once every rank has written.
      std::cerr << "dloss-run: --check needs --world N (dloss-run as the launcher)\n";
      return 2;
    }
    return code;
  } catch (const std::exception &e) {
    std::cerr << "dloss-run: " << e.what() << "\n";
    return 1;
  }
}
