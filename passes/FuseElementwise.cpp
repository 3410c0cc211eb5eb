// dloss-fuse-elementwise: groups chains of element-wise ops into
// dloss.fused_elementwise, which runs each chain in one pass over memory.
#include "passes/Passes.h"
#include "passes/TileProgram.h"

#include "runtime/plan/TileEncoding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_FUSEELEMENTWISEPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;
namespace ep = ::dloss::epilogue;

namespace {

/// The opcode of an op the fused program may hold (TileEncoding.h's
/// isElementwiseArithmetic), or nullopt.
std::optional<ep::Op> fusedOpcode(Operation *op) {
  std::optional<ep::Op> code = elementwiseOpcode(op);
  if (code && ep::isElementwiseArithmetic(*code))
    return code;
  return std::nullopt;
}

/// How an operand of a member enters the program.
enum class LeafKind { Element, Row, Col, Scalar };

/// The leaf an operand outside the group becomes: the value it reads
/// (an expand's input, for a broadcast vector) and its kind; nullopt when
/// the op cannot be a member with this operand.
std::optional<std::pair<Value, LeafKind>> leafOf(Value operand,
                                                 RankedTensorType space) {
  auto type = dyn_cast<RankedTensorType>(operand.getType());
  if (!type || type.getElementType() != space.getElementType())
    return std::nullopt;
  if (type == space)
    if (auto expand = operand.getDefiningOp<ExpandOp>();
        expand && space.getRank() == 2) {
      auto input = cast<RankedTensorType>(expand.getInput().getType());
      ArrayRef<int64_t> axes = expand.getAxes();
      if (input.getElementType() == space.getElementType()) {
        if (input.getRank() == 0)
          return std::make_pair(expand.getInput(), LeafKind::Scalar);
        if (input.getRank() == 1 && axes.size() == 1)
          return std::make_pair(expand.getInput(),
                                axes[0] == 0 ? LeafKind::Col : LeafKind::Row);
      }
    }
  if (type == space)
    return std::make_pair(operand, LeafKind::Element);
  if (type.getRank() == 0)
    return std::make_pair(operand, LeafKind::Scalar);
  return std::nullopt;
}

/// The iteration space of an op that may join a group: its result's type
/// (f32 or f64, the fused kernels' types), or null.
RankedTensorType spaceOf(Operation *op) {
  if (!fusedOpcode(op) || op->getNumResults() != 1)
    return {};
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!type || type.getRank() < 1 ||
      !(type.getElementType().isF32() || type.getElementType().isF64()))
    return {};
  for (Value operand : op->getOperands())
    if (!leafOf(operand, type))
      return {};
  return type;
}

/// The sum over the rows of a matrix (`reduce sum axes [0]`), which may
/// end a group as a column sum: its input, or null.
Value summedRows(Operation *op) {
  auto reduce = dyn_cast<ReduceOp>(op);
  if (!reduce || reduce.getKind() != ReduceKind::sum ||
      reduce.getAxes() != ArrayRef<int64_t>{0} ||
      cast<RankedTensorType>(reduce.getInput().getType()).getRank() != 2)
    return {};
  return reduce.getInput();
}

struct Group {
  RankedTensorType space;
  SmallVector<Operation *> ops; ///< in block order
  llvm::SmallPtrSet<Operation *, 16> members;
};

/// Whether `op` may join `groups` (merged into one) with the fused op at
/// op's place: they iterate over `space`, and every reader of their values
/// outside them comes after `op`.
bool canJoin(ArrayRef<const Group *> groups, Operation *op,
             RankedTensorType space) {
  auto inside = [&](Operation *user) {
    return user == op || llvm::any_of(groups, [&](const Group *g) {
             return g->members.contains(user);
           });
  };
  for (const Group *group : groups) {
    if (group->space != space)
      return false;
    for (Operation *member : group->ops)
      for (Operation *user : member->getUsers())
        if (!inside(user) && !op->isBeforeInBlock(user))
          return false;
  }
  return true;
}

/// Replaces the ops of `group` by one dloss.fused_elementwise in the place
/// of its last op. Returns false, changing nothing, for a group with no
/// operand of its own shape.
bool fuseGroup(Group &group) {
  SmallVector<Value> leaves[4]; // by LeafKind
  llvm::DenseMap<Value, int64_t> reg;
  llvm::DenseMap<std::pair<Value, int>, int64_t> leafReg;
  SmallVector<int64_t> program;
  auto emit = [&](ep::Op op, int64_t a = 0, int64_t b = 0) {
    program.append({static_cast<int64_t>(op), a, b, 0});
    return static_cast<int64_t>(program.size() / 4 - 1);
  };
  auto registerOf = [&](Value operand) -> int64_t {
    if (auto it = reg.find(operand); it != reg.end())
      return it->second;
    auto [value, kind] = *leafOf(operand, group.space);
    auto key = std::make_pair(value, static_cast<int>(kind));
    if (auto it = leafReg.find(key); it != leafReg.end())
      return it->second;
    SmallVector<Value> &list = leaves[static_cast<int>(kind)];
    const int64_t index = static_cast<int64_t>(list.size());
    list.push_back(value);
    const ep::Op opcode = kind == LeafKind::Element ? ep::Op::Element
                          : kind == LeafKind::Row   ? ep::Op::RowLeaf
                          : kind == LeafKind::Col   ? ep::Op::ColLeaf
                                                    : ep::Op::Scalar;
    return leafReg[key] = emit(opcode, index);
  };
  // The members the results need: the sums, the values read outside the
  // group, and what they read. A value whose readers all recompute it
  // (rematerialize) is computed here only if a sum needs it.
  llvm::SmallPtrSet<Operation *, 16> live;
  for (Operation *op : llvm::reverse(group.ops)) {
    bool needed = summedRows(op) || live.contains(op) ||
                  llvm::any_of(op->getUsers(), [&](Operation *user) {
                    return !group.members.contains(user);
                  });
    if (!needed)
      continue;
    live.insert(op);
    for (Value operand : op->getOperands())
      if (Operation *def = operand.getDefiningOp();
          def && group.members.contains(def))
        live.insert(def);
  }
  SmallVector<Operation *> sums; // the group's sums over the batch
  for (Operation *op : group.ops) {
    if (!live.contains(op))
      continue;
    if (summedRows(op)) {
      sums.push_back(op);
      continue;
    }
    int64_t a = registerOf(op->getOperand(0));
    int64_t b = op->getNumOperands() > 1 ? registerOf(op->getOperand(1)) : 0;
    reg[op->getResult(0)] = emit(*fusedOpcode(op), a, b);
  }
  if (leaves[static_cast<int>(LeafKind::Element)].empty())
    return false;

  // The results: values read outside the group, then the sums.
  SmallVector<Value> outputs;
  SmallVector<int64_t> outputRegs, sumRegs;
  for (Operation *op : group.ops)
    if (live.contains(op) && !summedRows(op) &&
        llvm::any_of(op->getUsers(), [&](Operation *user) {
          return !group.members.contains(user);
        })) {
      outputs.push_back(op->getResult(0));
      outputRegs.push_back(reg[op->getResult(0)]);
    }
  SmallVector<Type> types(outputs.size(), group.space);
  for (Operation *sum : sums) {
    outputs.push_back(sum->getResult(0));
    sumRegs.push_back(reg[summedRows(sum)]);
    types.push_back(sum->getResult(0).getType());
  }

  SmallVector<Value> operands;
  for (auto &list : leaves)
    operands.append(list.begin(), list.end());
  Operation *last = group.ops.back();
  OpBuilder builder(last);
  auto fused = FusedElementwiseOp::create(
      builder, last->getLoc(), types, operands,
      static_cast<int64_t>(leaves[0].size()),
      static_cast<int64_t>(leaves[1].size()),
      static_cast<int64_t>(leaves[2].size()), program, outputRegs,
      sumRegs.empty() ? DenseI64ArrayAttr()
                      : builder.getDenseI64ArrayAttr(sumRegs));
  for (auto [value, result] : llvm::zip(outputs, fused.getResults()))
    value.replaceAllUsesWith(result);
  llvm::SetVector<Operation *> expands;
  for (Operation *op : llvm::reverse(group.ops)) {
    for (Value operand : op->getOperands())
      if (auto expand = operand.getDefiningOp<ExpandOp>())
        expands.insert(expand);
    op->erase();
  }
  for (Operation *expand : expands)
    if (expand->use_empty())
      expand->erase();
  return true;
}

/// Moves each sum over the batch of a value that may join a group to just
/// after that value's definition. A sum is pure, and where autodiff put it
/// (after a reader of the chain's other sums, say: batch norm's backward
/// sums g and g * x-hat apart) it could not join the chain it ends.
void hoistColumnSums(Block &block) {
  for (Operation &op : llvm::make_early_inc_range(block))
    if (Value input = summedRows(&op))
      if (Operation *def = input.getDefiningOp();
          def && def->getBlock() == &block && spaceOf(def))
        op.moveAfter(def);
}

/// The element leaves (full-size operands from outside) of the ops
/// `ops` of a group over `space`.
llvm::SmallSetVector<Value, 4>
elementLeaves(ArrayRef<Operation *> ops,
              llvm::function_ref<bool(Operation *)> member,
              RankedTensorType space) {
  llvm::SmallSetVector<Value, 4> leaves;
  for (Operation *op : ops) {
    if (summedRows(op))
      continue;
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (def && member(def))
        continue;
      if (auto leaf = leafOf(operand, space);
          leaf && leaf->second == LeafKind::Element)
        leaves.insert(leaf->first);
    }
  }
  return leaves;
}

/// Recomputes a group's value in the other groups that read it, where
/// that costs at most one more read of memory in all than writing the
/// value and reading it back: the value then never reaches memory (batch
/// norm's x - mean, read again after the variance's all-reduce, is
/// recomputed from x). Each reader clones the ops of the group the value
/// is computed from, just before its first op that reads the value.
/// A value read by any other op (an op no group holds) stays a result.
void rematerialize(std::vector<Group> &groups,
                   llvm::DenseMap<Operation *, size_t> &groupOf) {
  for (size_t p = 0; p < groups.size(); ++p) {
    for (Operation *def : SmallVector<Operation *>(groups[p].ops)) {
      if (summedRows(def))
        continue;
      Value value = def->getResult(0);
      // The groups that read the value; none if another op must.
      llvm::SmallSetVector<size_t, 4> readers;
      bool stored = false;
      for (OpOperand &use : value.getUses()) {
        Operation *user = use.getOwner();
        if (groups[p].members.contains(user))
          continue;
        if (auto it = groupOf.find(user); it != groupOf.end()) {
          readers.insert(it->second);
          continue;
        }
        // An expand reads only its `like` operand's shape: it goes when
        // the groups that read it fuse.
        auto expand = dyn_cast<ExpandOp>(user);
        if (expand && use.getOperandNumber() == 1 &&
            llvm::all_of(expand->getUsers(), [&](Operation *reader) {
              return groupOf.contains(reader);
            }))
          continue;
        stored = true;
      }
      if (stored || readers.empty())
        continue;
      // The value's ops within its group, in block order.
      llvm::SetVector<Operation *> chain;
      SmallVector<Operation *> work = {def};
      while (!work.empty()) {
        Operation *op = work.pop_back_val();
        if (!chain.insert(op))
          continue;
        for (Value operand : op->getOperands())
          if (Operation *d = operand.getDefiningOp();
              d && groups[p].members.contains(d))
            work.push_back(d);
      }
      SmallVector<Operation *> ordered(chain.begin(), chain.end());
      llvm::sort(ordered, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
      llvm::SmallSetVector<Value, 4> needs = elementLeaves(
          ordered, [&](Operation *op) { return chain.contains(op); },
          groups[p].space);
      // Reads added, in all, less the reads of the value saved.
      int64_t added = 0;
      for (size_t g : readers) {
        const Group &reader = groups[g];
        llvm::SmallSetVector<Value, 4> has = elementLeaves(
            reader.ops,
            [&](Operation *op) { return reader.members.contains(op); },
            reader.space);
        added +=
            llvm::count_if(needs, [&](Value v) { return !has.contains(v); });
        added -= 1;
      }
      if (added > 1)
        continue;
      for (size_t g : readers) {
        Group &group = groups[g];
        Operation *first = *llvm::find_if(group.ops, [&](Operation *op) {
          return llvm::is_contained(op->getOperands(), value);
        });
        OpBuilder builder(first);
        IRMapping map;
        for (Operation *op : ordered) {
          Operation *copy = builder.clone(*op, map);
          group.ops.push_back(copy);
          group.members.insert(copy);
          groupOf[copy] = g;
        }
        Value copy = map.lookup(value);
        value.replaceUsesWithIf(copy, [&](OpOperand &use) {
          return group.members.contains(use.getOwner());
        });
        llvm::sort(group.ops, [](Operation *a, Operation *b) {
          return a->isBeforeInBlock(b);
        });
      }
    }
  }
}

void fuseBlock(Block &block) {
  hoistColumnSums(block);
  std::vector<Group> groups;
  llvm::DenseMap<Operation *, size_t> groupOf;
  for (Operation &op : block) {
    // A sum over the batch of a group's value joins that group (if the
    // group's values have no other reader before it): the value then need
    // not reach memory.
    if (Value input = summedRows(&op)) {
      Operation *def = input.getDefiningOp();
      auto it = def ? groupOf.find(def) : groupOf.end();
      if (it == groupOf.end())
        continue;
      Group &group = groups[it->second];
      const Group *alone[] = {&group};
      if (input.getType() != group.space || !canJoin(alone, &op, group.space))
        continue;
      group.ops.push_back(&op);
      group.members.insert(&op);
      groupOf[&op] = it->second;
      continue;
    }
    RankedTensorType space = spaceOf(&op);
    if (!space)
      continue;
    // The groups of its operands that it may join, all at once (two chains
    // meeting at a binary op become one).
    SmallVector<size_t> joined;
    SmallVector<const Group *> joinedGroups;
    for (Value operand : op.getOperands()) {
      Operation *def = operand.getDefiningOp();
      auto it = def ? groupOf.find(def) : groupOf.end();
      if (it == groupOf.end() || llvm::is_contained(joined, it->second))
        continue;
      joinedGroups.push_back(&groups[it->second]);
      if (canJoin(joinedGroups, &op, space))
        joined.push_back(it->second);
      else
        joinedGroups.pop_back();
    }
    if (joined.empty()) {
      joined.push_back(groups.size());
      groups.push_back(Group{space, {}, {}});
    }
    const size_t target = joined.front();
    for (size_t other : llvm::drop_begin(joined)) {
      for (Operation *member : groups[other].ops) {
        groups[target].ops.push_back(member);
        groups[target].members.insert(member);
        groupOf[member] = target;
      }
      groups[other].ops.clear();
      groups[other].members.clear();
    }
    groups[target].ops.push_back(&op);
    groups[target].members.insert(&op);
    groupOf[&op] = target;
    // Block order is an order in which each op follows its operands.
    llvm::sort(groups[target].ops, [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
  }
  // One op alone gains only when it reads an expanded vector, which then
  // never reaches memory at the op's size.
  auto readsExpand = [](Operation *op) {
    return llvm::any_of(op->getOperands(), [](Value operand) {
      return static_cast<bool>(operand.getDefiningOp<ExpandOp>());
    });
  };
  rematerialize(groups, groupOf);
  // The latest group first: a group's expand that only lends its shape
  // (`like`) to a later group's leaf has gone by the time the group that
  // computes that shape's value decides its results.
  std::vector<Group *> order;
  for (Group &group : groups)
    if (!group.ops.empty())
      order.push_back(&group);
  llvm::sort(order, [](Group *a, Group *b) {
    return b->ops.back()->isBeforeInBlock(a->ops.back());
  });
  for (Group *group : order)
    if (group->ops.size() > 1 ||
        (group->ops.size() == 1 && readsExpand(group->ops.front())))
      fuseGroup(*group);
}

struct FuseElementwisePass
    : mlir::dloss::impl::FuseElementwisePassBase<FuseElementwisePass> {
  void runOnOperation() override {
    getOperation().walk([](func::FuncOp func) {
      if (!func.isExternal() && func.getBody().hasOneBlock())
        fuseBlock(func.getBody().front());
    });
  }
};

} // namespace
