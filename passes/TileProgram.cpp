// Derives the tile program of a similarity matrix: the element-wise ops that
// read it (and the index masks they combine it with) become the program of
// dloss.fused_similarity, and the row reductions that end them its results.
#include "passes/TileProgram.h"

#include "runtime/plan/TileEncoding.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dominance.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

#include <array>
#include <cmath>
#include <limits>
#include <map>

using namespace mlir;
using namespace mlir::dloss;
namespace ep = ::dloss::epilogue;

namespace {

int64_t rankOf(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type ? type.getRank() : -1;
}

bool isFloat(Value value) {
  auto type = dyn_cast<ShapedType>(value.getType());
  return type && isa<FloatType>(type.getElementType());
}

/// Ops that become instructions (or, for a cast, share their input's
/// register): element-wise ops, casts that keep values, and put_along on
/// axis 1 (a select at the target column).
bool isProgramOp(Operation *op) {
  if (elementwiseOpcode(op))
    return true;
  if (auto cast = dyn_cast<CastOp>(op))
    return isa<RankedTensorType>(cast.getInput().getType()) &&
           (!isFloat(cast.getInput()) || isFloat(cast.getResult()));
  if (auto put = dyn_cast<PutAlongOp>(op))
    return put.getAxis() == 1;
  return false;
}

/// The row reductions that end a program: how many results each needs.
unsigned terminalResults(Operation *op, Value tile) {
  if (auto reduce = dyn_cast<ReduceOp>(op)) {
    ArrayRef<int64_t> axes = reduce.getAxes();
    bool rows = axes.size() == 1 && axes[0] == 1;
    bool all = axes.size() == 2 && axes[0] == 0 && axes[1] == 1;
    return reduce.getKind() == ReduceKind::sum && (rows || all) ? 1 : 0;
  }
  if (auto lse = dyn_cast<LogSumExpOp>(op))
    return lse.getAxis() == 1 ? 1 : 0;
  if (auto take = dyn_cast<TakeAlongOp>(op))
    return take.getAxis() == 1 && take.getInput() == tile ? 1 : 0;
  if (auto ce = dyn_cast<CrossEntropyOp>(op))
    return ce.getAxis() == 1 && ce.getLogits() == tile ? 2 : 0;
  return 0;
}

std::string describe(Operation *op) {
  return ("`" + op->getName().getStringRef() + "`").str();
}

/// The analysis of one similarity.
class Deriver {
public:
  Deriver(MatmulOp matmul, const DominanceInfo &dominance)
      : matmul(matmul), block(matmul->getBlock()), dominance(dominance) {}

  std::variant<TileProgram, TileDecline> run();

private:
  // Collection: the ops of the program, its leaves and its reductions.
  bool visitValue(Value tile);
  bool addOp(Operation *op);
  bool visitOperand(Operation *user, Value operand);
  bool classifyColumns(Operation *user, ExpandOp expand);
  bool decline(Operation *op, std::string reason) {
    if (!declined)
      declined = TileDecline{op, std::move(reason)};
    return false;
  }

  // Emission.
  int64_t emit(ep::Op op, int64_t a = 0, int64_t b = 0, int64_t c = 0) {
    p.program.append({static_cast<int64_t>(op), a, b, c});
    return static_cast<int64_t>(p.program.size() / 4 - 1);
  }
  int64_t constant(double value) {
    int64_t bits = ep::doubleToBits(value);
    auto [it, fresh] = constants.try_emplace(bits, 0);
    if (fresh)
      it->second = emit(ep::Op::Const, bits);
    return it->second;
  }
  int64_t leaf(Value value, ep::Op kind, SmallVector<Value> &operands);
  int64_t registerOf(Value value);
  void emitOp(Operation *op);
  void emitTerminal(Operation *op);

  MatmulOp matmul;
  Block *block;
  const DominanceInfo &dominance;
  TileProgram p;
  std::optional<TileDecline> declined;

  llvm::SetVector<Operation *> ops; ///< program ops, in discovery order
  llvm::SetVector<Operation *> terminals;
  llvm::SetVector<Operation *> shapeReaders;
  /// Leaves found while collecting, by the tile-shaped value that reads them.
  llvm::DenseMap<Value, std::pair<ep::Op, Value>> leaves;
  llvm::DenseMap<Value, int64_t> registers;
  llvm::DenseMap<std::pair<int, Value>, int64_t> leafRegisters;
  llvm::DenseMap<int64_t, int64_t> constants;
  std::optional<int64_t> colId;
};

bool Deriver::visitValue(Value tile) {
  for (Operation *user : tile.getUsers()) {
    if (ops.contains(user) || terminals.contains(user))
      continue;
    // An expand reads the tile's shape only (`like`); it must be a leaf of
    // the program, checked once the program is complete.
    if (auto expand = dyn_cast<ExpandOp>(user);
        expand && expand.getLike() == tile && expand.getInput() != tile) {
      shapeReaders.insert(expand);
      continue;
    }
    if (user->getBlock() != block)
      return decline(user, "the similarity is read in another block by " +
                               describe(user));
    if (terminalResults(user, tile)) {
      if (cast<ShapedType>(user->getResult(0).getType()).getElementType() !=
          cast<ShapedType>(matmul.getType()).getElementType())
        return decline(user, describe(user) +
                                 " reduces to another element type than the "
                                 "similarity's");
      terminals.insert(user);
      continue;
    }
    if (isProgramOp(user) && rankOf(user->getResult(0)) == 2) {
      if (auto put = dyn_cast<PutAlongOp>(user); put && put.getInput() != tile)
        return decline(user, "a put_along writes a full-size value");
      if (!addOp(user))
        return false;
      continue;
    }
    std::string why = describe(user) + " reads the similarity (or a value "
                                       "computed from it) as a whole matrix";
    if (isa<MatmulOp, ReduceOp, LogSumExpOp, TakeAlongOp, CrossEntropyOp>(user))
      why += "; the fused op reduces along rows (axis 1) only, by sum, "
             "logsumexp, take_along or cross_entropy";
    else if (user->hasTrait<OpTrait::IsTerminator>())
      why = "the similarity is returned";
    else
      why += "; the fused tile program holds element-wise ops only";
    return decline(user, why);
  }
  return true;
}

bool Deriver::addOp(Operation *op) {
  if (!ops.insert(op))
    return true;
  if (op->getBlock() != block)
    return decline(op, describe(op) + " is in another block");
  for (Value operand : op->getOperands())
    if (!visitOperand(op, operand))
      return false;
  return visitValue(op->getResult(0));
}

bool Deriver::visitOperand(Operation *user, Value operand) {
  if (operand == matmul.getResult())
    return true;
  if (Operation *def = operand.getDefiningOp(); def && ops.contains(def))
    return true;
  if (auto put = dyn_cast<PutAlongOp>(user)) {
    if (operand == put.getInput())
      return true; // visited as the tile
    // Targets and values: per-row vectors that must not depend on the
    // similarity (an ArcFace margin reads it: the dedicated pattern).
    if (rankOf(operand) != 1)
      return decline(user, "put_along takes per-row targets and values");
    leaves[operand] = {ep::Op::RowLeaf, operand};
    return true;
  }
  int64_t rank = rankOf(operand);
  if (rank == 0) {
    leaves[operand] = {ep::Op::Scalar, operand};
    return true;
  }
  if (auto expand = operand.getDefiningOp<ExpandOp>()) {
    ArrayRef<int64_t> axes = expand.getAxes();
    if (rankOf(expand.getInput()) == 1 && axes.size() == 1 && axes[0] == 1) {
      leaves[operand] = {ep::Op::RowLeaf, expand.getInput()};
      return true;
    }
    if (rankOf(expand.getInput()) == 1 && axes.size() == 1 && axes[0] == 0)
      return classifyColumns(user, expand);
    return decline(user, "an expand over axes other than one row or column "
                         "axis feeds the tile");
  }
  if (Operation *def = operand.getDefiningOp();
      def && rank == 2 && isProgramOp(def))
    return addOp(def);
  Operation *at = operand.getDefiningOp() ? operand.getDefiningOp() : user;
  return decline(at, describe(user) +
                         " combines the similarity with a full-size operand "
                         "that is not element-wise in per-row or per-column "
                         "values (it would have to exist as a whole matrix)");
}

bool Deriver::classifyColumns(Operation *user, ExpandOp expand) {
  Value vector = expand.getInput();
  // Column ids: arange from 0 over every column.
  if (auto arange = vector.getDefiningOp<ArangeOp>()) {
    if (matchPattern(arange.getStart(), m_Zero())) {
      leaves[expand.getResult()] = {ep::Op::ColId, Value()};
      return true;
    }
    return decline(arange, "column ids that do not start at 0; write "
                           "`arange(0, global size)` and add the offset");
  }
  if (isFloat(vector))
    return decline(expand, "a per-column float value feeds the tile; the "
                           "fused op takes integer per-column values (labels, "
                           "ids) only");
  if (p.gather) {
    auto gather = vector.getDefiningOp<AllGatherOp>();
    if (!gather || gather.getAxis() != 0)
      return decline(expand, "a per-column value that is not an all_gather "
                             "of this rank's values along axis 0");
    leaves[expand.getResult()] = {ep::Op::ColLeaf, gather.getInput()};
    return true;
  }
  leaves[expand.getResult()] = {ep::Op::ColLeaf, vector};
  (void)user;
  return true;
}

int64_t Deriver::leaf(Value value, ep::Op kind, SmallVector<Value> &operands) {
  auto key = std::make_pair(static_cast<int>(kind), value);
  auto it = leafRegisters.find(key);
  if (it != leafRegisters.end())
    return it->second;
  auto index = static_cast<int64_t>(
      std::find(operands.begin(), operands.end(), value) - operands.begin());
  if (index == static_cast<int64_t>(operands.size()))
    operands.push_back(value);
  int64_t reg = emit(kind, index);
  leafRegisters[key] = reg;
  return reg;
}

int64_t Deriver::registerOf(Value value) {
  if (auto it = registers.find(value); it != registers.end())
    return it->second;
  auto it = leaves.find(value);
  assert(it != leaves.end() && "every operand was classified");
  auto [kind, source] = it->second;
  int64_t reg;
  switch (kind) {
  case ep::Op::ColId:
    if (!colId)
      colId = emit(ep::Op::ColId);
    reg = *colId;
    break;
  case ep::Op::Scalar: {
    DenseElementsAttr dense;
    if (matchPattern(source, m_Constant(&dense)) && dense.isSplat()) {
      Type element = dense.getElementType();
      double v = isa<FloatType>(element)
                     ? dense.getSplatValue<APFloat>().convertToDouble()
                     : static_cast<double>(
                           dense.getSplatValue<APInt>().getSExtValue());
      reg = constant(v);
      break;
    }
    reg = leaf(source, kind, p.scalars);
    break;
  }
  case ep::Op::RowLeaf:
    reg = leaf(source, kind, p.rowLeaves);
    break;
  default:
    reg = leaf(source, kind, p.colLeaves);
    break;
  }
  registers[value] = reg;
  return reg;
}

void Deriver::emitOp(Operation *op) {
  auto result = op->getResult(0);
  if (auto cast = dyn_cast<CastOp>(op)) {
    registers[result] = registerOf(cast.getInput());
    return;
  }
  if (auto put = dyn_cast<PutAlongOp>(op)) {
    if (!colId)
      colId = emit(ep::Op::ColId);
    // Operands first, in a fixed order (C++ leaves argument order open).
    int64_t target = registerOf(put.getIndices());
    int64_t values = registerOf(put.getValues());
    int64_t tile = registerOf(put.getInput());
    int64_t hit = emit(ep::Op::Eq, *colId, target);
    registers[result] = emit(ep::Op::Select, hit, values, tile);
    return;
  }
  ep::Op code = *elementwiseOpcode(op);
  if (auto clamp = dyn_cast<ClampOp>(op)) {
    double inf = std::numeric_limits<double>::infinity();
    double lo = clamp.getMin() ? clamp.getMin()->convertToDouble() : -inf;
    double hi = clamp.getMax() ? clamp.getMax()->convertToDouble() : inf;
    registers[result] = emit(code, registerOf(clamp.getInput()),
                             ep::doubleToBits(lo), ep::doubleToBits(hi));
    return;
  }
  int64_t args[3] = {0, 0, 0};
  for (auto [i, operand] : llvm::enumerate(op->getOperands()))
    args[i] = registerOf(operand);
  registers[result] = emit(code, args[0], args[1], args[2]);
}

void Deriver::emitTerminal(Operation *op) {
  auto output = [&](Value tile, ep::Reduce kind) {
    p.outputs.append({registerOf(tile), static_cast<int64_t>(kind)});
  };
  // The value at each row's target column: a sum masked by column id.
  auto pick = [&](Value tile, Value targets) {
    if (!colId)
      colId = emit(ep::Op::ColId);
    int64_t target = leaf(targets, ep::Op::RowLeaf, p.rowLeaves);
    int64_t hit = emit(ep::Op::Eq, *colId, target);
    int64_t value = registerOf(tile);
    int64_t zero = constant(0);
    int64_t picked = emit(ep::Op::Select, hit, value, zero);
    p.outputs.append({picked, static_cast<int64_t>(ep::Reduce::Sum)});
  };
  auto first = static_cast<unsigned>(p.outputs.size() / 2);
  if (auto reduce = dyn_cast<ReduceOp>(op))
    output(reduce.getInput(), ep::Reduce::Sum);
  else if (auto lse = dyn_cast<LogSumExpOp>(op))
    output(lse.getInput(), ep::Reduce::LogSumExp);
  else if (auto take = dyn_cast<TakeAlongOp>(op))
    pick(take.getInput(), take.getIndices());
  else if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
    output(ce.getLogits(), ep::Reduce::LogSumExp);
    pick(ce.getLogits(), ce.getTargets());
  }
  p.terminals.push_back(
      {op, first, static_cast<unsigned>(p.outputs.size() / 2) - first});
}

std::variant<TileProgram, TileDecline> Deriver::run() {
  p.matmul = matmul;
  if (matmul.getTransposeLhs() || !matmul.getTransposeRhs())
    return TileDecline{matmul, "the similarity is not `rows x cols^T` "
                               "(matmul without transpose_lhs, with "
                               "transpose_rhs)"};
  p.rows = matmul.getLhs();
  p.cols = matmul.getRhs();
  if (auto gather = p.cols.getDefiningOp<AllGatherOp>()) {
    if (gather.getAxis() != 0)
      return TileDecline{gather, "the columns are gathered along axis " +
                                     std::to_string(gather.getAxis()) +
                                     ", not 0"};
    if (gather.getGrad() != GatherGrad::exact)
      return TileDecline{gather,
                         std::string("the columns' all_gather has `grad ") +
                             stringifyGatherGrad(gather.getGrad()).str() +
                             "`, whose gradient differs from the exact one the "
                             "fused op computes"};
    p.gather = gather;
    p.cols = gather.getInput();
  }
  if (!visitValue(matmul.getResult()))
    return *declined;
  if (terminals.empty())
    return TileDecline{matmul, "no row reduction (sum, logsumexp, take_along "
                               "or cross_entropy along axis 1) ends the ops "
                               "reading the similarity"};
  for (Operation *expand : shapeReaders) {
    Value result = expand->getResult(0);
    if (!leaves.count(result))
      return TileDecline{expand, "an expand shaped like the similarity "
                                 "feeds ops outside the tile program"};
    for (Operation *user : result.getUsers())
      if (!ops.contains(user))
        return TileDecline{user, describe(user) +
                                     " reads a per-row or per-column value "
                                     "expanded to the similarity's shape"};
  }
  // Program order: the ops and reductions as they stand in the block.
  Operation *at = nullptr;
  for (Operation &op : *block)
    if (terminals.contains(&op)) {
      at = &op;
      break;
    }
  // Every leaf must be defined where the fused op goes.
  auto early = [&](Value v) {
    return !v || dominance.properlyDominates(v, at) ||
           matchPattern(v, m_Constant());
  };
  if (!early(p.rows) || !early(p.cols))
    return TileDecline{at, "the features are defined after the first "
                           "reduction of the similarity"};
  for (auto &[tile, leafInfo] : leaves) {
    Value source = leafInfo.second;
    if (!early(source))
      return TileDecline{source.getDefiningOp(),
                         "a value the tile reads is defined after the first "
                         "reduction of the similarity"};
    (void)tile;
  }
  for (Operation *op : terminals) {
    Value targets;
    if (auto take = dyn_cast<TakeAlongOp>(op))
      targets = take.getIndices();
    if (auto ce = dyn_cast<CrossEntropyOp>(op))
      targets = ce.getTargets();
    if (targets && !early(targets))
      return TileDecline{op, "its targets are defined after the first "
                             "reduction of the similarity"};
  }

  registers[matmul.getResult()] = emit(ep::Op::Sim);
  for (Operation &op : *block) {
    if (ops.contains(&op)) {
      emitOp(&op);
      p.region.push_back(&op);
    }
  }
  for (Operation &op : *block)
    if (terminals.contains(&op))
      emitTerminal(&op);
  for (auto &[tile, leafInfo] : leaves)
    if (auto expand = tile.getDefiningOp<ExpandOp>()) {
      p.leafOps.push_back(expand);
      if (auto gather = expand.getInput().getDefiningOp<AllGatherOp>())
        p.leafOps.push_back(gather);
    }
  return std::move(p);
}

} // namespace

/// The opcode of an element-wise op the program can hold with operands taken
/// as they are, or nullopt.
std::optional<ep::Op> mlir::dloss::elementwiseOpcode(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<ep::Op>>(op)
      .Case([](AddOp) { return ep::Op::Add; })
      .Case([](SubOp) { return ep::Op::Sub; })
      .Case([](MulOp) { return ep::Op::Mul; })
      .Case([](DivOp) { return ep::Op::Div; })
      .Case([](NegOp) { return ep::Op::Neg; })
      .Case([](ExpOp) { return ep::Op::Exp; })
      .Case([](LogOp) { return ep::Op::Log; })
      .Case([](SoftplusOp) { return ep::Op::Softplus; })
      .Case([](LogSigmoidOp) { return ep::Op::LogSigmoid; })
      .Case([](SigmoidOp) { return ep::Op::Sigmoid; })
      .Case([](CosOp) { return ep::Op::Cos; })
      .Case([](AcosOp) { return ep::Op::Acos; })
      .Case([](SinOp) { return ep::Op::Sin; })
      .Case([](SqrtOp) { return ep::Op::Sqrt; })
      .Case([](ClampOp) { return ep::Op::Clamp; })
      .Case([](EqOp) { return ep::Op::Eq; })
      .Case([](SelectOp) { return ep::Op::Select; })
      .Case([](StopGradientOp) { return ep::Op::StopGradient; })
      .Default([](Operation *) { return std::nullopt; });
}

std::variant<TileProgram, TileDecline>
mlir::dloss::deriveTileProgram(MatmulOp matmul,
                               const DominanceInfo &dominance) {
  return Deriver(matmul, dominance).run();
}

MatmulOp mlir::dloss::findMirror(const TileProgram &p) {
  if (!p.gather)
    return {};
  for (MatmulOp other : p.matmul->getBlock()->getOps<MatmulOp>()) {
    if (other == p.matmul || other.getTransposeLhs() ||
        !other.getTransposeRhs() || other.getLhs() != p.cols)
      continue;
    auto gather = other.getRhs().getDefiningOp<AllGatherOp>();
    if (gather && gather.getAxis() == 0 &&
        gather.getGrad() == GatherGrad::exact && gather.getInput() == p.rows)
      return other;
  }
  return {};
}

LogicalResult mlir::dloss::mergeMirror(TileProgram &p,
                                       const TileProgram &mirror) {
  for (Value leaf : mirror.rowLeaves)
    if (isFloat(leaf))
      return failure();
  TileProgram merged = p;
  auto indexIn = [](SmallVector<Value> &list, Value value) {
    auto it = llvm::find(list, value);
    if (it != list.end())
      return static_cast<int64_t>(it - list.begin());
    list.push_back(value);
    return static_cast<int64_t>(list.size() - 1);
  };
  auto emit = [&](ep::Op op, int64_t a, int64_t b, int64_t c) {
    merged.program.append({static_cast<int64_t>(op), a, b, c});
    return static_cast<int64_t>(merged.program.size() / 4 - 1);
  };
  // The similarity is the same element: S'[j, i] = S[i, j].
  SmallVector<int64_t> map;
  for (size_t t = 0; t < mirror.program.size(); t += 4) {
    auto op = static_cast<ep::Op>(mirror.program[t]);
    int64_t a = mirror.program[t + 1], b = mirror.program[t + 2],
            c = mirror.program[t + 3];
    switch (op) {
    case ep::Op::Sim:
      map.push_back(0); // instruction 0 of every derived program
      continue;
    case ep::Op::ColId:
      map.push_back(emit(ep::Op::RowId, 0, 0, 0));
      continue;
    case ep::Op::RowId:
      map.push_back(emit(ep::Op::ColId, 0, 0, 0));
      continue;
    case ep::Op::RowLeaf:
      map.push_back(emit(ep::Op::ColLeaf,
                         indexIn(merged.colLeaves, mirror.rowLeaves[a]), 0, 0));
      continue;
    case ep::Op::ColLeaf:
      map.push_back(emit(ep::Op::RowLeaf,
                         indexIn(merged.rowLeaves, mirror.colLeaves[a]), 0, 0));
      continue;
    case ep::Op::Scalar:
      map.push_back(emit(ep::Op::Scalar,
                         indexIn(merged.scalars, mirror.scalars[a]), 0, 0));
      continue;
    default:
      break;
    }
    int operands = ep::registerOperands(op);
    int64_t args[3] = {a, b, c};
    for (int k = 0; k < operands; ++k)
      args[k] = map[args[k]];
    map.push_back(emit(op, args[0], args[1], args[2]));
  }
  for (size_t k = 0; k + 1 < mirror.outputs.size(); k += 2)
    merged.colOutputs.append({map[mirror.outputs[k]], mirror.outputs[k + 1]});
  unsigned shift = static_cast<unsigned>(p.outputs.size() / 2);
  for (TileTerminal t : mirror.terminals) {
    t.first += shift;
    merged.terminals.push_back(t);
  }
  llvm::append_range(merged.region, mirror.region);
  llvm::append_range(merged.leafOps, mirror.leafOps);
  merged.leafOps.push_back(mirror.matmul);
  merged.leafOps.push_back(mirror.gather);
  p = std::move(merged);
  return success();
}

void mlir::dloss::simplifyProgram(TileProgram &p) {
  const size_t count = p.program.size() / 4;
  // Value numbering: each instruction's key with its operands renamed.
  SmallVector<int64_t> same(count);
  std::map<std::array<int64_t, 4>, int64_t> seen;
  for (size_t t = 0; t < count; ++t) {
    std::array<int64_t, 4> key = {p.program[4 * t], p.program[4 * t + 1],
                                  p.program[4 * t + 2], p.program[4 * t + 3]};
    auto op = static_cast<ep::Op>(key[0]);
    for (int k = 0; k < ep::registerOperands(op); ++k)
      key[1 + k] = same[key[1 + k]];
    if ((op == ep::Op::Add || op == ep::Op::Mul || op == ep::Op::Eq) &&
        key[1] > key[2])
      std::swap(key[1], key[2]);
    auto [it, fresh] = seen.try_emplace(key, static_cast<int64_t>(t));
    same[t] = it->second;
    if (fresh)
      std::copy(key.begin(), key.end(), p.program.begin() + 4 * t);
  }
  // Liveness from the results back.
  SmallVector<bool> live(count, false);
  for (ArrayRef<int64_t> outputs :
       {ArrayRef<int64_t>(p.outputs), ArrayRef<int64_t>(p.colOutputs)})
    for (size_t k = 0; k < outputs.size(); k += 2)
      live[same[outputs[k]]] = true;
  for (size_t t = count; t-- > 0;) {
    if (!live[t])
      continue;
    auto op = static_cast<ep::Op>(p.program[4 * t]);
    for (int k = 0; k < ep::registerOperands(op); ++k)
      live[p.program[4 * t + 1 + k]] = true;
  }
  // The Sim leaf stays instruction 0 (mergeMirror relies on it).
  live[0] = true;
  SmallVector<int64_t> renumber(count, -1);
  SmallVector<int64_t> program;
  for (size_t t = 0; t < count; ++t) {
    if (!live[t] || same[t] != static_cast<int64_t>(t))
      continue;
    auto op = static_cast<ep::Op>(p.program[4 * t]);
    int64_t ins[4] = {p.program[4 * t], p.program[4 * t + 1],
                      p.program[4 * t + 2], p.program[4 * t + 3]};
    for (int k = 0; k < ep::registerOperands(op); ++k)
      ins[1 + k] = renumber[ins[1 + k]];
    renumber[t] = static_cast<int64_t>(program.size() / 4);
    program.append(std::begin(ins), std::end(ins));
  }
  for (SmallVector<int64_t> *outputs : {&p.outputs, &p.colOutputs})
    for (size_t k = 0; k < outputs->size(); k += 2)
      (*outputs)[k] = renumber[same[(*outputs)[k]]];
  p.program = std::move(program);
}

FusedSimilarityOp mlir::dloss::createFusedSimilarity(
    OpBuilder &builder, Location loc, Type perRow, Value rows, Value cols,
    ValueRange leaves, int64_t rowLeaves, int64_t colLeaves,
    ArrayRef<int64_t> program, ArrayRef<int64_t> outputs,
    ArrayRef<int64_t> colOutputs, bool gathered, bool sharded) {
  ep::DerivedFacts facts = ep::deriveFacts(
      ep::intsOf(program), ep::intsOf(outputs), ep::intsOf(colOutputs));
  SmallVector<Type> types((outputs.size() + colOutputs.size()) / 2, perRow);
  auto ints = [&](ArrayRef<int64_t> values) {
    return builder.getDenseI64ArrayAttr(values);
  };
  // The column facts are there exactly when the column results are.
  auto column = [&](ArrayRef<int64_t> values) {
    return colOutputs.empty() ? DenseI64ArrayAttr() : ints(values);
  };
  return FusedSimilarityOp::create(
      builder, loc, types, rows, cols, leaves,
      builder.getI64IntegerAttr(rowLeaves),
      builder.getI64IntegerAttr(colLeaves), ints(program), ints(outputs),
      column(colOutputs), ints(facts.picks), column(facts.colPicks),
      column(facts.lsePairs), ints(facts.classTargets),
      gathered ? builder.getUnitAttr() : UnitAttr(),
      sharded ? builder.getUnitAttr() : UnitAttr());
}

Operation *mlir::dloss::firstTerminal(const TileProgram &p) {
  Operation *first = nullptr;
  for (const TileTerminal &t : p.terminals)
    if (!first || t.op->isBeforeInBlock(first))
      first = t.op;
  return first;
}

std::string mlir::dloss::tileProgramText(ArrayRef<int64_t> program,
                                         ArrayRef<int64_t> outputs) {
  std::string text;
  for (size_t t = 0; t + 3 < program.size(); t += 4) {
    auto op = static_cast<ep::Op>(program[t]);
    const char *name = ep::opName(op);
    text += ("%" + Twine(t / 4) + " = " + (name ? name : "?")).str();
    switch (op) {
    case ep::Op::Const:
      text += " " + std::to_string(ep::bitsToDouble(program[t + 1]));
      break;
    case ep::Op::RowLeaf:
    case ep::Op::ColLeaf:
    case ep::Op::Scalar:
      text += " " + std::to_string(program[t + 1]);
      break;
    case ep::Op::Clamp:
      text += " %" + std::to_string(program[t + 1]) + " [" +
              std::to_string(ep::bitsToDouble(program[t + 2])) + ", " +
              std::to_string(ep::bitsToDouble(program[t + 3])) + "]";
      break;
    default:
      for (int k = 0; k < ep::registerOperands(op); ++k)
        text +=
            std::string(k ? ", %" : " %") + std::to_string(program[t + 1 + k]);
    }
    text += "\n";
  }
  for (size_t k = 0; k + 1 < outputs.size(); k += 2)
    text += "result " + std::to_string(k / 2) + " = " +
            (outputs[k + 1] == 1 ? "logsumexp" : "sum") + " %" +
            std::to_string(outputs[k]) + "\n";
  return text;
}
