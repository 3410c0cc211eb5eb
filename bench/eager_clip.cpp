// dloss-bench-eager-clip: the eager LibTorch baseline of OpenCLIP's ClipLoss
// with local_loss=True and gather_with_grad=True, as one rank of a job.
// Built a second time with DLOSS_BENCH_JIT as dloss-bench-jit-clip: the same
// rank, data and timing, calling dloss::jit::compile(losses::clip()) instead
// (the C++ JIT that `import dloss` wraps; bench/python_clip_bench.py measures
// the Python layer's overhead against it).
//
// Rank r holds random L2-normalised image and text features [B_local, d]
// (requires_grad) and a replicated logit scale. Per call:
//   all_image = all_gather_with_grad(image), all_text =
//   all_gather_with_grad(text) logits_per_image = scale * image @ all_text^T
//   [B_local, B_global] logits_per_text  = scale * text  @ all_image^T
//   [B_local, B_global] labels = arange(B_local) + B_local * rank loss =
//   (CE(logits_per_image, labels) + CE(logits_per_text, labels)) / 2
//   loss.backward()
// The gather's backward is torch.distributed.nn's: all_reduce(sum) of the
// gradient of the gathered tensor, then this rank's rows.
//
// usage: RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P
//          dloss-bench-eager-clip [--b-local B] [--dim D] [--iters K]
//                                 [--warmup W] [--out FILE.json] [--threads T]
// Or: dloss-bench-eager-clip --world N ... (forks N local ranks; rank r
// writes FILE.json with ".rank<r>" before the extension, or prints its JSON).
//
// Prints one JSON line per rank: median_ms over the K timed calls (each
// started with the ranks lined up), and loss_mem_mb = VmHWM after the calls -
// VmRSS right before the first call (VmHWM is reset through
// /proc/self/clear_refs first where the kernel allows it; "hwm_reset" says
// whether it did), steady_mem_mb = the same for the calls after the first
// (LossMemory::steady), plus peak_rss_mb, the rank's total peak RSS. All are
// measured as dloss-run measures them (CallTiming.h, LossMemory.h).
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"
#ifdef DLOSS_BENCH_JIT
#include "frontend/Jit.h"
#include "frontend/Losses.h"
#endif
#include "tools/dloss-run/CallTiming.h"
#include "tools/dloss-run/LossMemory.h"

#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

dloss::Communicator *gComm = nullptr;

/// all_gather along axis 0 whose backward sums the gradient over the ranks
/// and keeps this rank's rows (torch.distributed.nn.functional.all_gather).
struct AllGatherWithGrad : public torch::autograd::Function<AllGatherWithGrad> {
  static torch::Tensor forward(AutogradContext *ctx, torch::Tensor x) {
    std::vector<int64_t> sizes = gComm->allGatherInts({x.size(0)});
    int64_t offset = 0;
    for (int r = 0; r < gComm->rank(); ++r)
      offset += sizes[r];
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["rows"] = x.size(0);
    return gComm->allGather(x.contiguous(), 0, sizes);
  }
  static tensor_list backward(AutogradContext *ctx, tensor_list grads) {
    int64_t offset = ctx->saved_data["offset"].toInt();
    int64_t rows = ctx->saved_data["rows"].toInt();
    at::Tensor summed =
        gComm->allReduce(grads[0].contiguous(), dloss::Reduction::Sum);
    return {summed.narrow(0, offset, rows).clone()};
  }
};

struct Options {
  int64_t bLocal = 1024, dim = 256;
  int iters = 3, warmup = 1, world = 0, threads = 0;
  std::string out;
  uint64_t seed = 0;
};

std::string rankPath(const std::string &out, int rank) {
  if (out.empty())
    return out;
  size_t dot = out.rfind('.');
  std::string suffix = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || out.find('/', dot) != std::string::npos)
    return out + suffix;
  return out.substr(0, dot) + suffix + out.substr(dot);
}

int runRank(const Options &o) {
  if (o.threads > 0)
    at::set_num_threads(o.threads);
  auto rendezvous = dloss::RendezvousOptions::fromEnvironment();
  std::shared_ptr<dloss::Communicator> comm =
      dloss::connectProcessGroup(rendezvous);
  gComm = comm.get();
  int rank = comm->rank(), world = comm->worldSize();

  torch::manual_seed(o.seed + rank);
  torch::Tensor image =
      torch::nn::functional::normalize(
          torch::randn({o.bLocal, o.dim}),
          torch::nn::functional::NormalizeFuncOptions().dim(1))
          .requires_grad_(true);
  torch::Tensor text = torch::nn::functional::normalize(
                           torch::randn({o.bLocal, o.dim}),
                           torch::nn::functional::NormalizeFuncOptions().dim(1))
                           .requires_grad_(true);
  torch::Tensor scale = torch::full({}, 14.285714f).requires_grad_(true);
  torch::Tensor labels =
      torch::arange(o.bLocal, torch::kLong) + o.bLocal * rank;

  double loss = 0;
#ifdef DLOSS_BENCH_JIT
  const char *impl = "jit";
  dloss::jit::Options jitOptions;
  jitOptions.communicator = comm;
  dloss::CompiledLoss clip =
      dloss::jit::compile(dloss::losses::clip(), jitOptions);
  auto step = [&]() {
    image.mutable_grad() = torch::Tensor();
    text.mutable_grad() = torch::Tensor();
    scale.mutable_grad() = torch::Tensor();
    torch::Tensor l = clip({image, text, scale});
    l.backward();
    loss = l.item<double>();
  };
#else
  const char *impl = "eager";
  auto step = [&]() {
    image.mutable_grad() = torch::Tensor();
    text.mutable_grad() = torch::Tensor();
    scale.mutable_grad() = torch::Tensor();
    torch::Tensor allImage = AllGatherWithGrad::apply(image);
    torch::Tensor allText = AllGatherWithGrad::apply(text);
    torch::Tensor logitsPerImage = scale * image.matmul(allText.t());
    torch::Tensor logitsPerText = scale * text.matmul(allImage.t());
    torch::Tensor l =
        (torch::nn::functional::cross_entropy(logitsPerImage, labels) +
         torch::nn::functional::cross_entropy(logitsPerText, labels)) /
        2;
    l.backward();
    loss = l.item<double>();
  };
#endif

  // Baseline: inputs built, peers met, right before the first call.
  auto memory = dloss::tools::LossMemory::start();
  int warmup = o.warmup;
  if (warmup > 0) { // the first call; the steady state follows it
    step();
    --warmup;
    memory.steady();
  }
  double median = dloss::tools::timeCalls(*comm, "", warmup, o.iters, step);
  memory.stop();

  std::ostringstream json;
  json.precision(9);
  json << "{\"impl\": \"" << impl << "\", \"rank\": " << rank
       << ", \"world_size\": " << world << ", \"b_local\": " << o.bLocal
       << ", \"d\": " << o.dim << ", \"iters\": " << o.iters
       << ", \"loss\": " << loss << ", \"median_ms\": " << median
       << ", \"baseline_rss_mb\": " << memory.baselineMb()
       << ", \"vm_hwm_mb\": " << memory.hwmMb()
       << ", \"loss_mem_mb\": " << memory.lossMb()
       << ", \"steady_mem_mb\": " << memory.steadyMb()
       << ", \"peak_rss_mb\": " << memory.peakRssMb()
       << ", \"hwm_reset\": " << (memory.hwmReset ? "true" : "false")
       << ", \"mmap_threshold_fixed\": "
       << (memory.mmapThresholdFixed ? "true" : "false") << "}\n";
  std::string path = rankPath(o.out, rank);
  if (!path.empty())
    std::ofstream(path) << json.str();
  std::string line = json.str();
  ssize_t written = ::write(1, line.data(), line.size());
  (void)written;
  comm->allGatherInts({0}); // leave together
  return 0;
}

int usage() {
  std::cerr
      << "usage: dloss-bench-eager-clip [--world N] [--b-local B] [--dim D] "
         "[--iters K] [--warmup W] [--threads T] [--seed S] [--out FILE.json]\n"
         "  without --world: one rank, from "
         "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT\n";
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "dloss-bench-eager-clip: " << a << " needs a value\n";
        std::exit(usage());
      }
      return argv[++i];
    };
    if (a == "--b-local")
      o.bLocal = std::stoll(next());
    else if (a == "--dim")
      o.dim = std::stoll(next());
    else if (a == "--iters")
      o.iters = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--world")
      o.world = std::stoi(next());
    else if (a == "--threads")
      o.threads = std::stoi(next());
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--out")
      o.out = next();
    else if (a == "--help" || a == "-h")
      return usage(), 0;
    else {
      std::cerr << "dloss-bench-eager-clip: unknown argument " << a << "\n";
      return usage();
    }
  }
  try {
    if (o.world <= 0)
      return runRank(o);
    // Fork N local ranks (before LibTorch starts its thread pools).
    // A port of its own, held until the ranks are done (unless given).
    std::string port = std::getenv("MASTER_PORT")
                           ? std::getenv("MASTER_PORT")
                           : std::to_string(dloss::reserveLoopbackPort());
    std::vector<pid_t> children;
    for (int r = 0; r < o.world; ++r) {
      pid_t pid = fork();
      if (pid < 0) {
        perror("fork");
        return 1;
      }
      if (pid == 0) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(o.world).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 0);
        setenv("MASTER_PORT", port.c_str(), 1);
        int rc = 1;
        try {
          rc = runRank(o);
        } catch (const std::exception &e) {
          std::cerr << "dloss-bench-eager-clip: rank " << r << ": " << e.what()
                    << "\n";
        }
        std::fflush(nullptr);
        _exit(rc);
      }
      children.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        ++failed;
    }
    if (failed)
      std::cerr << "dloss-bench-eager-clip: " << failed << " rank(s) failed\n";
    return failed ? 1 : 0;
  } catch (const std::exception &e) {
    std::cerr << "dloss-bench-eager-clip: " << e.what() << "\n";
    return 1;
  }
}
