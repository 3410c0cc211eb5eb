// dloss-coalesce-all-reduces: independent small all-reduces of one kind and
// element type made adjacent and marked to run as one collective.
#include "passes/Passes.h"

#include "dialect/DlossOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_COALESCEALLREDUCESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

namespace {

/// The bytes of a statically shaped tensor, or nullopt.
std::optional<int64_t> staticBytes(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape() ||
      !tensor.getElementType().isIntOrFloat())
    return std::nullopt;
  return tensor.getNumElements() *
         static_cast<int64_t>(
             (tensor.getElementType().getIntOrFloatBitWidth() + 7) / 8);
}

/// Whether an all-reduce's operand is small enough that its collective's
/// cost is its latency: joining it to another costs a copy of it and saves
/// a round trip. Not a 0-d one: the runtime already defers those to ride
/// on the call's next gather, or flushes them together at its end
/// (Communicator::deferReduction).
bool small(AllReduceOp op, int64_t limit) {
  auto type = cast<RankedTensorType>(op.getInput().getType());
  std::optional<int64_t> bytes = staticBytes(type);
  return type.getRank() > 0 && bytes && *bytes <= limit;
}

/// The ops after `after` in its block that `value` is computed from, in
/// block order; nullopt when one of them is in `avoid`, or is a collective
/// or an op with a large result (moving either above `after` could change
/// the order of collectives or raise the peak memory).
std::optional<SmallVector<Operation *>>
sliceAfter(Value value, Operation *after,
           const llvm::SmallPtrSetImpl<Operation *> &avoid, int64_t limit) {
  llvm::SetVector<Operation *> slice;
  SmallVector<Value> work = {value};
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (def && avoid.contains(def))
      return std::nullopt;
    if (!def || def->getBlock() != after->getBlock() ||
        !after->isBeforeInBlock(def) || slice.contains(def))
      continue;
    if (def->hasTrait<IsCollective>() || def->getNumRegions() != 0)
      return std::nullopt;
    for (Value result : def->getResults()) {
      std::optional<int64_t> bytes = staticBytes(result.getType());
      if (!isa<IndexType>(result.getType()) && (!bytes || *bytes > limit))
        return std::nullopt;
    }
    slice.insert(def);
    work.append(def->getOperands().begin(), def->getOperands().end());
  }
  SmallVector<Operation *> ordered(slice.begin(), slice.end());
  llvm::sort(ordered,
             [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return ordered;
}

void coalesceBlock(Block &block, int64_t limit) {
  SmallVector<AllReduceOp> reduces;
  for (Operation &op : block)
    if (auto reduce = dyn_cast<AllReduceOp>(op))
      reduces.push_back(reduce);
  llvm::SmallPtrSet<Operation *, 8> placed;
  for (size_t i = 0; i < reduces.size(); ++i) {
    AllReduceOp head = reduces[i];
    if (placed.contains(head) || !small(head, limit))
      continue;
    auto elementOf = [](AllReduceOp op) {
      return cast<RankedTensorType>(op.getInput().getType()).getElementType();
    };
    llvm::SmallPtrSet<Operation *, 8> group = {head};
    Operation *last = head;
    for (size_t j = i + 1; j < reduces.size(); ++j) {
      AllReduceOp next = reduces[j];
      if (placed.contains(next) || next.getKind() != head.getKind() ||
          elementOf(next) != elementOf(head) || !small(next, limit))
        continue;
      // What it reads, computed after the head: moved above the head, so
      // the all-reduce can follow the group's last one.
      std::optional<SmallVector<Operation *>> slice =
          sliceAfter(next.getInput(), head, group, limit);
      if (!slice)
        continue;
      for (Operation *op : *slice)
        op->moveBefore(head);
      next->moveAfter(last);
      last = next;
      group.insert(next);
      placed.insert(next);
    }
    if (group.size() > 1)
      head->setAttr("coalesce",
                    IntegerAttr::get(IntegerType::get(head->getContext(), 64),
                                     static_cast<int64_t>(group.size())));
  }
}

struct CoalesceAllReducesPass
    : mlir::dloss::impl::CoalesceAllReducesPassBase<CoalesceAllReducesPass> {
  using CoalesceAllReducesPassBase::CoalesceAllReducesPassBase;
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp func) {
      if (!func.isExternal() && func.getBody().hasOneBlock())
        coalesceBlock(func.getBody().front(), maxBytes);
    });
  }
};

} // namespace
