// The schedules of the fused ops' passes: column chunks travel round the ranks
// while each rank computes its tiles (the ring), or arrive all at once (the
// gather, for small batches: Schedule.h).
//
// Rank r keeps its rows; the column chunks travel round the ring. At step
// k = 0..N-1 it holds the chunk owned by q = (r - k) mod N.
//   * Features (the chunk's cols, targets and, for the backward, its lse and
//     cotangents) never change. At the start of step k the rank posts the
//     recv of the next chunk from r-1 and the send of the held one to r+1,
//     computes the held chunk's tiles meanwhile, and waits at the end of the
//     step: two chunk buffers, the transfer hidden behind the tiles.
//   * A carry (the forward's column statistics, the backward's column
//     gradient) accumulates as the chunk travels. The rank computes its own
//     contribution, merges the carry r-1 sent after processing the same chunk
//     at step k-1, and passes the sum to r+1. After step N-1 the held chunk
//     belongs to r+1 and its carry is complete: one more hop takes it home,
//     and r receives its own from r-1.
//   * Row state (online log-sum-exp, row gradients) never moves.
// Every wait on a rank at step k depends only on peers' progress at earlier
// steps or at the start of step k (a carry send is waited on one step after
// it is posted), so the waits form no cycle. With N == 1 nothing is sent.
//
// A buffer whose transfer or merge is over is kept for the next step that
// needs one of its length, instead of being freed and another allocated: a
// pass then allocates two feature chunks and three carries whatever N, and
// the kernel does not map and clear fresh pages for every step's megabytes.
// A spare lives only until the next allocation, so the pass holds no more
// memory at once than it would without them.
#ifndef DLOSS_RUNTIME_FUSED_RINGDRIVER_H
#define DLOSS_RUNTIME_FUSED_RINGDRIVER_H

#include "runtime/comm/Communicator.h"
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/Schedule.h"

#include <functional>

namespace dloss::fused {

/// The chunk a rank holds at one step.
struct Chunk {
  /// Global index of the chunk's first column.
  int64_t offset;
  const Tensors &features;
  int64_t length() const { return features[0].size(0); }
};

/// What one pass round the ring moves and computes.
struct RingPass {
  /// This rank's chunk: contiguous tensors whose axis 0 is its length.
  Tensors features;
  /// Per feature, the plan register of the operand it is (KernelContext::
  /// operandKey, converted to the compute type), or -1; empty: none. The
  /// gather schedule reuses an operand an earlier pass of the same call
  /// gathered (the backward after its forward) instead of gathering it
  /// again (Schedule.h, gatheredOperand).
  std::vector<int64_t> keys;
  /// Every rank's chunk length, in rank order.
  std::vector<int64_t> lengths;
  /// An uninitialised carry for a chunk of `length`; null: nothing carried.
  std::function<Tensors(int64_t length)> newCarry;
  /// Computes this rank's tiles of the chunk and writes its part of the
  /// chunk's carry into `carry`: newCarry(length)'s tensors, perhaps a
  /// buffer an earlier step used (every element must be set), or empty when
  /// nothing is carried.
  std::function<void(const Chunk &, Tensors &carry)> visit;
  /// Adds the carry from upstream into this rank's part, in place.
  std::function<void(Tensors &mine, const Tensors &upstream)> merge;
};

/// The bytes of one row of `tensor` (axis 0 is the batch).
int64_t rowBytes(const at::Tensor &tensor);
/// `features`' bytes, one after another (writeDense's layout): what a rank
/// sends in the gather of several operands of any types.
at::Tensor packRows(const Tensors &features);
/// The inverse across ranks: packed[q] is rank q's packRows of tensors shaped
/// like `like` but with lengths[k][q] rows of feature k; returns each
/// feature's rows of every rank, concatenated in rank order.
Tensors unpackRows(const std::vector<at::Tensor> &packed, const Tensors &like,
                   const std::vector<std::vector<int64_t>> &lengths);

/// Every rank's rows of each of `features` (axis 0: this rank's
/// lengths[i][rank] rows; every rank's in lengths[i]), concatenated in rank
/// order. Those an earlier pass of this call gathered (by key, as
/// RingPass::keys) as they are, the others in one all-gather of their bytes
/// (so that tensors of several types and lengths are still one
/// collective), none when every one is known.
Tensors gatherOperands(Communicator &comm, const Tensors &features,
                       const std::vector<std::vector<int64_t>> &lengths,
                       const std::vector<int64_t> &keys);

/// The schedule of a pass that moves `features` (every rank's lengths as in
/// gatherOperands): the call's setting or, under auto, the cost model's
/// choice from the global bytes. Not counted: the pass that runs counts
/// itself (countPass, Schedule.h), as runRing does.
Schedule passSchedule(Communicator &comm, const Tensors &features,
                      const std::vector<std::vector<int64_t>> &lengths);

/// Whether a CPU op over `rows` x `cols` (every rank's sizes in rowSizes,
/// colSizes) runs as the gather of both sides (CLIP's and SigLIP's ops:
/// RingSoftmaxCE.cpp, RingSigmoidPairs.cpp): the call's setting is the
/// gather, or auto's choice for moving both operands is and computing
/// `tilesTwice` similarity-sized products a second time costs less than the
/// `savedExchanges` exchanges it saves (schedule::bothSidesPay). Only
/// global sizes enter, so every rank decides alike. Counted as a gather
/// pass when it does; otherwise the op runs runRing's passes.
bool gathersBothSides(Communicator &comm, const at::Tensor &rows,
                      const at::Tensor &cols,
                      const std::vector<int64_t> &rowSizes,
                      const std::vector<int64_t> &colSizes, int tilesTwice,
                      int savedExchanges);

/// Runs `pass` on every rank's chunk; returns this rank's own chunk's
/// complete carry. The schedule is the call's setting (currentSchedule(),
/// fused/Schedule.h) or, under auto, the cost model's choice from the
/// chunks' sizes: the ring above, or the gather (one all-gather of every
/// chunk, each visited in the ring's order, and one exchange that sends each
/// chunk's carries straight to its owner, merged there in the ring's order,
/// so both give the same sums). The gather holds every rank's chunk at once.
Tensors runRing(Communicator &comm, const RingPass &pass);

/// The backward's ring: the carry is each chunk's column gradient [length,
/// width] and its owner's shares of the 0-d parameters' gradients ([shares]
/// f64), summed on their way home. Returns the gradient of this rank's own
/// columns and its shares.
struct ColumnGradient {
  at::Tensor dCols, share;
};

/// tiles(chunk, dCols) adds this rank's part of the chunk's column gradient
/// to dCols (zeroed) and returns its part of the shares ([shares] f64).
/// `keys` as RingPass::keys.
ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, int64_t shares, at::TensorOptions options,
    const std::function<at::Tensor(const Chunk &, at::Tensor &)> &tiles,
    std::vector<int64_t> keys = {});

/// One share: tiles(chunk, dCols, share) adds to a double share.
ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, at::TensorOptions options,
    const std::function<void(const Chunk &, at::Tensor &, double &)> &tiles,
    std::vector<int64_t> keys = {});

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_RINGDRIVER_H
