// The cost model that picks a fused op's schedule (ring or gather): the
// engines' figures and the crossover, torch-free so that the compiler's
// report (dlossc --report) and the runtime (fused/Schedule.cpp) read the
// same numbers. It sits beside Plan.fbs and TileEncoding.h, the other facts
// both halves share.
//
// The ring pays one latency per hop, 2(N-1) hops per pass pair (features
// and carries each way); the gather pays the global operand's bytes without
// overlap. The gather wins while moving the global operand costs less than
// those hops: globalBytes <= 2 (N-1) hopLatency bandwidth, under a memory
// cap on what a gather may hold per rank.
#ifndef DLOSS_RUNTIME_PLAN_SCHEDULECOSTS_H
#define DLOSS_RUNTIME_PLAN_SCHEDULECOSTS_H

#include <algorithm>
#include <cstdint>

namespace dloss::schedule {

/// The engine that moves a pass's chunks.
enum class Engine { Gloo, Nccl };

/// An engine's figures.
struct EngineCosts {
  /// Seconds one ring hop costs beyond its bytes (the message latency, the
  /// wake-up of the peer, the step's bookkeeping).
  double hopLatency;
  /// Bytes per second one rank receives.
  double bandwidth;
  /// The most bytes a gather may hold per rank, whatever the model says.
  int64_t gatherMemoryCap;
  /// Multiply-adds per second one rank's tiles run at.
  double macRate;
};

constexpr EngineCosts engineCosts(Engine engine) {
  if (engine == Engine::Nccl)
    // NCCL within a node: 10-20 us of latency per message plus the host's
    // wait on each step's transfers (NCCL's tuning tables, nccl-tests'
    // small-message figures), and 100 GB/s received per GPU, conservative
    // for NVLink. Not yet measured on a GPU (docs/Cuda.md).
    // 25 T multiply-adds per second: below an H100's f32 peak.
    return {25e-6, 100e9, int64_t{256} << 20, 25e12};
  // Gloo over loopback TCP on the project's 2-core CI machine, 4 ranks of
  // one thread each, fitted to bench/small_batch_bench.py's ring and gather
  // rows (docs/Fusion.md, "Choosing the schedule"); the tiles at one
  // thread's sgemm peak there (45 GFLOP/s, bench/README.md).
  return {0.5e-3, 1.5e9, int64_t{64} << 20, 22.5e9};
}

/// The global operand size (bytes of every rank's travelling chunk
/// together) up to which auto takes the gather at `worldSize` ranks.
constexpr int64_t gatherCrossoverBytes(int worldSize, Engine engine) {
  EngineCosts costs = engineCosts(engine);
  double crossover =
      2.0 * std::max(worldSize - 1, 0) * costs.hopLatency * costs.bandwidth;
  return std::min<int64_t>(static_cast<int64_t>(crossover),
                           costs.gatherMemoryCap);
}

/// Whether a gather of both sides pays (CLIP's and SigLIP's ops,
/// fused/RingDriver.h): computing `extraMacs` multiply-adds more per rank
/// costs less than the `savedExchanges` exchanges with every peer (N-1 hops
/// each) it saves.
constexpr bool bothSidesPay(int worldSize, Engine engine, double extraMacs,
                            int savedExchanges) {
  EngineCosts costs = engineCosts(engine);
  return extraMacs / costs.macRate <=
         savedExchanges * std::max(worldSize - 1, 0) * costs.hopLatency;
}

} // namespace dloss::schedule

#endif // DLOSS_RUNTIME_PLAN_SCHEDULECOSTS_H
