// dloss-bench-gemm-peak: the sgemm peak that the fused CLIP kernels are
// measured against, as one rank of a job (bench/run_family_bench.py).
//
// The fused CLIP step (ring_softmax_ce + ring_softmax_ce_grad) does four
// GEMM-equivalents per rank, each n x M x d multiply-adds (n = B_local,
// M = B_global): the forward tile GEMM S = A B^T, and in the backward its
// recomputation, dA = G B and dB = G^T A. This program runs exactly those
// four GEMMs as plain ATen calls (at::mm_out into preallocated outputs, so
// that no allocation or first-touch page fault is timed), on every rank at
// once, with the same intra-op threads as the loss, and times them as
// dloss-run times a loss (CallTiming.h: warm-up calls, then the ranks line
// up before each timed call, the median of the timed calls). The fraction
// of peak the fused step reaches is this time over the fused step's.
//
// --tile auto (or RxC) runs the same multiply-adds as tiles of the shape the
// CPU kernels use (runtime/fused/TileShape.cpp: from the L2 cache, or
// DLOSS_TILE), the output tile reused: the peak of cache-resident tile GEMMs.
// Without it (the default) the four GEMMs have the full shapes [n,d]x[d,M],
// [n,d]x[d,M], [n,M]x[M,d], [M,n]x[n,d].
//
// usage: dloss-bench-gemm-peak --world N [--b-local n] [--dim d] [--iters K]
//                              [--warmup W] [--threads T] [--tile auto|RxC]
//                              [--out FILE.json]
// Without --world: one rank, from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.
// Prints one JSON line per rank (and writes FILE.rank<r>.json with --out).
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/fused/TileMath.h"
#include "tools/dloss-run/CallTiming.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Options {
  int64_t bLocal = 4096, dim = 256, tileRows = 0, tileCols = 0;
  int iters = 3, warmup = 1, world = 0, threads = 0;
  bool tiled = false; // --tile: tile GEMMs instead of the full shapes
  std::string out;
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
  std::unique_ptr<dloss::Communicator> comm =
      dloss::connectProcessGroup(rendezvous);
  int rank = comm->rank(), world = comm->worldSize();
  const int64_t n = o.bLocal, m = o.bLocal * world, d = o.dim;

  at::manual_seed(rank);
  // Unit rows, as the features are: S stays in [-1, 1], like the loss's.
  at::Tensor a = at::randn({n, d});
  a = a / a.norm(2, {1}, true);
  at::Tensor b = at::randn({m, d});
  b = b / b.norm(2, {1}, true);
  at::Tensor dA = at::zeros({n, d}), dB = at::zeros({m, d});

  std::function<void()> step;
  std::string tileText = "full";
  if (!o.tiled) {
    at::Tensor s = at::empty({n, m}), g = at::rand({n, m});
    step = [=]() mutable {
      at::mm_out(s, a, b.t());  // forward
      at::mm_out(s, a, b.t());  // backward: the tile recomputed
      at::mm_out(dA, g, b);     // dA = G B
      at::mm_out(dB, g.t(), a); // dB = G^T A
    };
  } else {
    // The CPU kernels' tile (--tile auto) or the given one; one output tile,
    // reused as the ring kernels reuse theirs, visited in their order.
    dloss::TileShape tile = o.tileRows > 0
                                ? dloss::TileShape{o.tileRows, o.tileCols}
                                : dloss::fused::clippedTile(n, m, at::kFloat);
    tileText = std::to_string(tile.rows) + "x" + std::to_string(tile.cols);
    at::Tensor s = at::empty({tile.rows, tile.cols});
    step = [=]() mutable {
      dloss::fused::forEachBlock(n, m, tile, [&](dloss::fused::Block k) {
        at::Tensor ai = a.narrow(0, k.row, k.rows);
        at::Tensor bj = b.narrow(0, k.col, k.cols);
        at::Tensor t = s.narrow(0, 0, k.rows).narrow(1, 0, k.cols);
        at::mm_out(t, ai, bj.t()); // forward
        at::mm_out(t, ai, bj.t()); // backward: the tile recomputed
        dA.narrow(0, k.row, k.rows).addmm_(t, bj);
        dB.narrow(0, k.col, k.cols).addmm_(t.t(), ai);
      });
    };
  }

  double median = dloss::tools::timeCalls(*comm, "", o.warmup, o.iters, step);
  double gflop = 4.0 * 2.0 * n * m * d / 1e9;
  std::ostringstream json;
  json.precision(9);
  json << "{\"impl\": \"gemm-peak\", \"rank\": " << rank
       << ", \"world_size\": " << world << ", \"b_local\": " << n
       << ", \"b_global\": " << m << ", \"d\": " << d << ", \"tile\": \""
       << tileText << "\", \"intra_op_threads\": " << at::get_num_threads()
       << ", \"iters\": " << o.iters << ", \"median_ms\": " << median
       << ", \"gflops\": " << (median > 0 ? gflop / (median / 1e3) : 0)
       << "}\n";
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
  std::cerr << "usage: dloss-bench-gemm-peak [--world N] [--b-local n] "
               "[--dim d] [--iters K] [--warmup W] [--threads T] "
               "[--tile auto|RxC] [--out FILE.json]\n"
               "  without --world: one rank, from "
               "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT\n";
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::cerr << "dloss-bench-gemm-peak: " << a << " needs a value\n";
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
      else if (a == "--tile") {
        std::string t = next();
        o.tiled = true;
        if (t == "auto")
          continue;
        size_t x = t.find('x');
        if (x == std::string::npos)
          throw std::invalid_argument("--tile takes RxC or auto, got '" + t +
                                      "'");
        o.tileRows = std::stoll(t.substr(0, x));
        o.tileCols = std::stoll(t.substr(x + 1));
        if (o.tileRows <= 0 || o.tileCols <= 0)
          throw std::invalid_argument("--tile sizes must be positive");
      } else if (a == "--out")
        o.out = next();
      else if (a == "--help" || a == "-h")
        return usage(), 0;
      else {
        std::cerr << "dloss-bench-gemm-peak: unknown argument " << a << "\n";
        return usage();
      }
    }
  } catch (const std::exception &e) {
    std::cerr << "dloss-bench-gemm-peak: bad argument: " << e.what() << "\n";
    return usage();
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
          std::cerr << "dloss-bench-gemm-peak: rank " << r << ": " << e.what()
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
      std::cerr << "dloss-bench-gemm-peak: " << failed << " rank(s) failed\n";
    return failed ? 1 : 0;
  } catch (const std::exception &e) {
    std::cerr << "dloss-bench-gemm-peak: " << e.what() << "\n";
    return 1;
  }
}
