// The fused ops' two schedules (ring, gather) and the cost model that picks
// one per call from the sizes every rank knows after the preflight.
//
// Ring: the column chunks travel round the ranks, N-1 hops of features and
// N hops of carries per pass, each overlapped with a chunk's tiles; a rank
// holds two chunks, O(B_local d). Gather: one all-gather of every rank's
// chunk, the same per-chunk tiles over the gathered batch, and one exchange
// that sends each chunk's carry straight to its owner; a rank holds the
// whole O(B_global d) operand. Neither builds the B_local x B_global matrix.
// The ring pays a latency per hop, the gather pays the global operand's
// bytes without overlap: at small batches every message is latency and the
// gather wins, at large ones the ring hides its transfers behind the tiles
// and holds less memory (runtime/plan/ScheduleCosts.h has the model;
// docs/Fusion.md, "Choosing the schedule", the measurements).
#ifndef DLOSS_RUNTIME_FUSED_SCHEDULE_H
#define DLOSS_RUNTIME_FUSED_SCHEDULE_H

#include "runtime/plan/ScheduleCosts.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace dloss::fused {

/// A schedule setting: auto lets the cost model choose per call.
enum class Schedule : int64_t { Auto = 0, Ring = 1, Gather = 2 };

/// "auto", "ring" or "gather".
const char *scheduleName(Schedule schedule);
/// The setting `text` names ("auto", "ring", "gather"); a dloss::Error
/// naming `source` (such as "DLOSS_SCHEDULE") otherwise.
Schedule parseSchedule(const std::string &text, const std::string &source);
/// parseSchedule, with "" for no setting of its own (the process default).
std::optional<Schedule> parseOptionalSchedule(const std::string &text,
                                              const std::string &source);

/// The process-wide setting: DLOSS_SCHEDULE when first read (auto when
/// unset), then whatever setDefaultSchedule last set. Thread-safe.
Schedule defaultSchedule();
void setDefaultSchedule(Schedule schedule);

/// The setting of the call this thread runs (the executor's per-loss
/// override or the process default), set for the call's duration; the
/// process default outside any scope.
Schedule currentSchedule();
class ScheduleScope {
public:
  explicit ScheduleScope(Schedule schedule);
  ~ScheduleScope();
  ScheduleScope(const ScheduleScope &) = delete;
  ScheduleScope &operator=(const ScheduleScope &) = delete;

  /// What a call keeps for its later passes (gatheredOperand,
  /// keptSimilarity).
  struct Kept {
    std::unordered_map<int64_t, at::Tensor> gathered;
    std::map<std::pair<int64_t, int64_t>, at::Tensor> similarities;
    /// Every key a gather pass asked gatheredOperand for (gatherWanted).
    std::vector<int64_t> wanted;
  };

private:
  bool hadPrevious;
  Schedule previous;
  Kept previousKept;
};

/// The operands this call's gather passes have already gathered, by key (a
/// plan register: the same on every rank), so that a later pass of the same
/// call that moves the same operand (a backward after its forward) reuses
/// it instead of gathering it again, and every rank decides alike. Held
/// until the call's ScheduleScope ends or the executor frees the register;
/// outside any scope nothing is kept. `like` is the operand as the pass has
/// it now: an entry of another element type or row shape is not reused.
at::Tensor gatheredOperand(int64_t key, const at::Tensor &like,
                           int64_t globalRows);
void keepGathered(int64_t key, at::Tensor gathered);
/// Whether a gather pass of the current call asked for operand `key`,
/// whether it was kept or not: what the call's gathers needed. The
/// executor folds only those into the next call's preflight.
bool gatherWanted(int64_t key);
/// Forgets what the call keeps of register `key`: its gathered rows and
/// the similarities it is a side of.
void forgetGathered(int64_t key);

/// The similarity S = rows cols^T of this rank's rows over every rank's
/// columns (in rank order), which a fused op's forward keeps for its
/// backward in the same call (a drop-in's loss-and-gradient plan), so that
/// the backward reads S instead of computing it again: one GEMM-sized pass
/// of four. Kept on the CPU only, where rows x cols elements take at most
/// kKeptSimilarityBytes: a small batch's matrix, which the eager loss holds
/// too; the ring's memory bound holds above it. Keyed by the rows' and
/// columns' plan registers, held as gatheredOperand's entries are.
/// keepSimilarity returns the [rows, cols] tensor to fill (undefined where
/// nothing is kept); keptSimilarity a filled one, or undefined.
constexpr int64_t kKeptSimilarityBytes = 32 << 20;
at::Tensor keepSimilarity(int64_t rowsKey, int64_t colsKey, int64_t rows,
                          int64_t cols, const at::TensorOptions &options);
at::Tensor keptSimilarity(int64_t rowsKey, int64_t colsKey, int64_t rows,
                          int64_t cols, const at::TensorOptions &options);

/// How many fused passes this process has run as the ring and as the
/// gather: which schedule ran (tests, dloss._C.fused_passes()); and how
/// many backward passes read the similarity their forward kept.
struct PassCounts {
  int64_t ring = 0, gather = 0, kept = 0;
};
PassCounts passCounts();
void countPass(Schedule schedule);

/// What the cost model weighs for one pass of a fused op.
struct PassSize {
  int worldSize = 1;
  /// The bytes of every rank's chunk together (features that travel:
  /// columns, their per-column values): what a gather holds on each rank.
  int64_t globalBytes = 0;
  /// Where the chunks live: the engine (Gloo on the CPU, NCCL on CUDA)
  /// sets the latency and bandwidth.
  c10::DeviceType device = c10::DeviceType::CPU;
};

/// The engine that moves `device`'s tensors: NCCL for CUDA, else Gloo.
schedule::Engine engineFor(c10::DeviceType device);
/// The global operand size up to which auto takes the gather
/// (runtime/plan/ScheduleCosts.h has the model).
int64_t gatherCrossoverBytes(int worldSize, c10::DeviceType device);

/// The schedule a pass runs: `setting`, or the cost model's choice for
/// Auto. The same on every rank for the same sizes and setting (the
/// preflight checks that the settings agree). One rank runs the ring
/// (nothing to move).
Schedule chooseSchedule(Schedule setting, const PassSize &size);

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_SCHEDULE_H
