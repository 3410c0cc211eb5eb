// One function's memory and communication under concrete sizes (see
// Evaluate.h).
#include "report/Evaluate.h"

#include "dialect/DlossOps.h"
#include "passes/LocationText.h"
#include "passes/StraightLineLiveness.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::dloss;

namespace {

/// "file:line:col", file without its directory; "unknown" without one.
std::string reportLocation(Location loc) {
  std::string text = locationText(loc, /*fileNameOnly=*/true);
  return text.empty() ? "unknown" : text;
}

/// The concrete shape of argument `i`: `--report-size` by name, else static
/// dims as written, dynamic dim 0 = batch, other dynamic dims = dim.
FailureOr<SmallVector<int64_t>> argumentShape(func::FuncOp func, unsigned i,
                                              const ReportOptions &options) {
  auto type = dyn_cast<RankedTensorType>(func.getArgument(i).getType());
  if (!type)
    return emitError(func.getLoc())
           << "the report sizes tensor arguments only; argument " << i
           << " of @" << func.getName() << " is "
           << func.getArgument(i).getType();
  auto name = func.getArgAttrOfType<StringAttr>(i, DlossDialect::kNameAttrName);
  if (name) {
    auto it = options.argumentShapes.find(name.getValue());
    if (it != options.argumentShapes.end()) {
      ArrayRef<int64_t> given = it->second;
      bool fits = given.size() == static_cast<size_t>(type.getRank());
      for (size_t d = 0; fits && d < given.size(); ++d)
        fits = type.isDynamicDim(d) || type.getDimSize(d) == given[d];
      if (!fits)
        return emitError(func.getLoc())
               << "--report-size gives '" << name.getValue() << "' the shape "
               << concreteShapeText(given) << ", which does not fit its type "
               << type;
      return SmallVector<int64_t>(given);
    }
  }
  SmallVector<int64_t> shape;
  for (auto [d, size] : llvm::enumerate(type.getShape()))
    shape.push_back(!ShapedType::isDynamic(size) ? size
                    : d == 0                     ? options.batch
                                                 : options.dim);
  return shape;
}

std::string valueLabel(Value value) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = cast<func::FuncOp>(arg.getOwner()->getParentOp());
    auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                  DlossDialect::kNameAttrName);
    if (name)
      return ("argument " + name.getValue()).str();
    return ("argument #" + Twine(arg.getArgNumber())).str();
  }
  Operation *op = value.getDefiningOp();
  std::string label = op->getName().getStringRef().str();
  if (op->getNumResults() > 1)
    label += " #" + std::to_string(cast<OpResult>(value).getResultNumber());
  return label + " " + reportLocation(op->getLoc());
}

/// The op's results must fit its IR types (static sizes agree).
LogicalResult checkResults(Operation *op, const CostEvaluator &e) {
  for (Value result : op->getResults()) {
    if (!e.has(result))
      return e.fail(op) << "has a result that its cost rule left unsized "
                           "(a bug in dialect/DlossCosts.cpp)";
    auto type = dyn_cast<RankedTensorType>(result.getType());
    if (!type)
      continue;
    ArrayRef<int64_t> shape = e.shape(result);
    bool fits = shape.size() == static_cast<size_t>(type.getRank());
    for (size_t d = 0; fits && d < shape.size(); ++d)
      fits = type.isDynamicDim(d) || type.getDimSize(d) == shape[d];
    if (!fits)
      return e.fail(op) << "has the shape " << concreteShapeText(shape)
                        << " under the report's sizes, which does not "
                           "fit its type "
                        << type << "; check --report-size";
  }
  return success();
}

} // namespace

FailureOr<FunctionReport>
mlir::dloss::evaluateFunction(func::FuncOp func, const ReportOptions &options) {
  FunctionReport report;
  report.name = func.getName().str();
  if (!func.getBody().hasOneBlock())
    return emitError(func.getLoc())
           << "the report evaluates straight-line functions; @"
           << func.getName() << " has " << func.getBody().getBlocks().size()
           << " blocks";
  Block &body = func.getBody().front();
  CostEvaluator e(options.cost);
  for (BlockArgument arg : body.getArguments()) {
    FailureOr<SmallVector<int64_t>> shape =
        argumentShape(func, arg.getArgNumber(), options);
    if (failed(shape))
      return failure();
    e.setTensor(arg, *shape);
  }

  // A value lives from its definition to its last use; arguments throughout.
  StraightLineLiveness liveness(body);
  ArrayRef<Operation *> ops = liveness.ops();
  int64_t live = 0;
  for (BlockArgument arg : body.getArguments())
    live += e.bytes(arg);
  report.peakBytes = report.liveBytes = live;
  int64_t peakAt = -1;

  for (auto [i, op] : llvm::enumerate(ops)) {
    auto rule = dyn_cast<CostOpInterface>(op);
    if (op->getNumRegions() != 0 || !rule)
      return emitError(op->getLoc())
             << "the report has no shape rule for '" << op->getName() << "'";
    OpCost cost;
    if (failed(rule.evaluateCost(e, cost)) || failed(checkResults(op, e)))
      return failure();
    for (Value result : op->getResults())
      live += e.bytes(result);
    int64_t total = live + static_cast<int64_t>(cost.workspace.bytes);
    if (total > report.peakBytes) {
      report.peakBytes = total;
      report.liveBytes = live;
      report.workspaceBytes = static_cast<int64_t>(cost.workspace.bytes);
      report.workspaceHow = cost.workspace.how;
      report.peakOp = op->getName().getStringRef().str();
      report.peakLocation = reportLocation(op->getLoc());
      peakAt = static_cast<int64_t>(i);
    }
    if (op->hasTrait<IsCollective>()) {
      report.transfers.push_back({op->getName().getStringRef().str(),
                                  reportLocation(op->getLoc()), cost.sent.how,
                                  cost.sent.bytes});
      report.sentBytes += cost.sent.bytes;
    }
    for (Value value : liveness.deadAfter(i))
      if (!isa<BlockArgument>(value))
        live -= e.bytes(value);
  }

  // The values live at the peak, largest first: arguments, and the results
  // defined at or before the peak and used at or after it.
  auto consider = [&](Value value) {
    if (e.bytes(value) != 0)
      report.largest.push_back(
          {valueLabel(value), e.get(value).typeText(), e.bytes(value)});
  };
  for (BlockArgument arg : body.getArguments())
    consider(arg);
  for (auto [i, op] : llvm::enumerate(ops))
    for (Value result : op->getResults())
      if (static_cast<int64_t>(i) <= peakAt &&
          liveness.lastUse(result) >= peakAt)
        consider(result);
  llvm::stable_sort(report.largest, [](const LiveValue &a, const LiveValue &b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.what < b.what;
  });
  return report;
}
