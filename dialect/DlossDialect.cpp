// The dloss dialect: registration, constant materialization and the entry-point
// attribute rules.
#include "dialect/DlossOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::dloss;

#include "dialect/DlossOpsDialect.cpp.inc"

#include "dialect/DlossEnums.cpp.inc"

#include "dialect/DlossInterfaces.cpp.inc"

void DlossDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialect/DlossOps.cpp.inc"
      >();
  registerAttributes();
}

Operation *DlossDialect::materializeConstant(OpBuilder &builder,
                                             Attribute value, Type type,
                                             Location loc) {
  return arith::ConstantOp::materialize(builder, value, type, loc);
}

static constexpr StringLiteral kKnownAttrs =
    "dloss knows dloss.loss, dloss.grad_mode and dloss.gradient_of on "
    "functions, dloss.grad, dloss.replicated, dloss.state and dloss.name on "
    "arguments, "
    "dloss.replication on ops";
static constexpr StringLiteral kKnownArgAttrs =
    "dloss knows dloss.grad, dloss.replicated, dloss.state and dloss.name on "
    "arguments";

static bool isReplicationName(Attribute attr) {
  auto name = dyn_cast<StringAttr>(attr);
  return name &&
         (name.getValue() == "invariant" || name.getValue() == "varying");
}

static bool isScalarFloatTensor(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && tensor.getRank() == 0 &&
         isa<FloatType>(tensor.getElementType());
}

LogicalResult DlossDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kLossAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' is a unit attribute; write `"
                             << name << "` without a value";
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (!func)
      return op->emitError() << "'" << name
                             << "' marks a loss entry point and belongs on a "
                                "func.func, not on '"
                             << op->getName() << "'";
    if (func.isExternal())
      return op->emitError() << "loss entry point @" << func.getName()
                             << " has no body; a dloss.loss function must "
                                "define the per-rank program";
    // The loss, then each state argument's new value, in argument order.
    SmallVector<Type> expected;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      if (func.getArgAttr(i, kStateAttrName))
        expected.push_back(func.getArgumentTypes()[i]);
    ArrayRef<Type> results = func.getResultTypes();
    if (results.empty() || !isScalarFloatTensor(results.front()))
      return op->emitError()
             << "loss entry point @" << func.getName()
             << " must return one 0-d floating-point tensor (the loss) "
                "first, got ("
             << results
             << "); reduce the loss to a scalar with dloss.reduce "
                "and dloss.all_reduce";
    if (results.drop_front() != ArrayRef<Type>(expected))
      return op->emitError()
             << "loss entry point @" << func.getName()
             << " must return the loss and then one new value per "
                "dloss.state argument, of that argument's type ("
             << expected << "), got (" << results.drop_front()
             << ") after the loss";
    return success();
  }
  if (name == kGradModeAttrName) {
    auto mode = dyn_cast<StringAttr>(attr.getValue());
    if (!mode || (mode.getValue() != "ddp" && mode.getValue() != "global"))
      return op->emitError()
             << "'" << name << "' must be \"ddp\" or \"global\", got "
             << attr.getValue();
    if (!op->hasAttr(kLossAttrName))
      return op->emitError()
             << "'" << name << "' only applies to a loss entry point; add `"
             << kLossAttrName << "` to the function";
    return success();
  }
  if (name == kReplicationAttrName) {
    auto each = dyn_cast<ArrayAttr>(attr.getValue());
    bool valid = each ? llvm::all_of(each, isReplicationName)
                      : isReplicationName(attr.getValue());
    if (!valid)
      return op->emitError() << "'" << name
                             << "' must be \"invariant\" or \"varying\", or "
                                "an array of them (one per result), got "
                             << attr.getValue();
    return success();
  }
  if (name == kGradientOfAttrName) {
    auto symbol = dyn_cast<FlatSymbolRefAttr>(attr.getValue());
    if (!symbol || !isa<FunctionOpInterface>(op))
      return op->emitError() << "'" << name
                             << "' names the loss a function differentiates, "
                                "as a symbol (@loss) on a func.func";
    return success();
  }
  if (name == kGradAttrName || name == kReplicatedAttrName ||
      name == kStateAttrName || name == kNameAttrName)
    return op->emitError() << "'" << name
                           << "' belongs on a function argument, not on '"
                           << op->getName() << "'";
  return op->emitError() << "unknown attribute '" << name << "'; "
                         << kKnownAttrs;
}

LogicalResult DlossDialect::verifyRegionArgAttribute(Operation *op,
                                                     unsigned regionIndex,
                                                     unsigned argIndex,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kNameAttrName) {
    if (!isa<StringAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' on argument " << argIndex
                             << " must be a string, got " << attr.getValue();
    return success();
  }
  if (name != kGradAttrName && name != kReplicatedAttrName &&
      name != kStateAttrName)
    return op->emitError() << "unknown argument attribute '" << name
                           << "' on argument " << argIndex << "; "
                           << kKnownArgAttrs;
  if (!isa<UnitAttr>(attr.getValue()))
    return op->emitError() << "'" << name << "' on argument " << argIndex
                           << " is a unit attribute; write `" << name
                           << "` without a value";
  if (name == kStateAttrName) {
    // On a loss, or on the gradient function derived from one.
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (!func ||
        !(op->hasAttr(kLossAttrName) || op->hasAttr(kGradientOfAttrName)))
      return op->emitError() << "'" << name << "' on argument " << argIndex
                             << " needs a loss entry point; add `"
                             << kLossAttrName << "` to the function";
    if (!func.getArgAttr(argIndex, kReplicatedAttrName) ||
        func.getArgAttr(argIndex, kGradAttrName))
      return op->emitError()
             << "state argument " << argIndex
             << " must be `dloss.replicated` (the same on every rank) and "
                "carry no `dloss.grad`: state is updated, not trained";
  }
  if (name == kGradAttrName) {
    if (!op->hasAttr(kLossAttrName))
      return op->emitError() << "'" << name << "' on argument " << argIndex
                             << " needs a loss entry point; add `"
                             << kLossAttrName << "` to the function";
    auto func = dyn_cast<FunctionOpInterface>(op);
    Type type = func ? func.getArgumentTypes()[argIndex] : Type();
    auto tensor = dyn_cast_or_null<RankedTensorType>(type);
    if (!tensor || !isa<FloatType>(tensor.getElementType()))
      return op->emitError()
             << "'" << name << "' on argument " << argIndex << " of type "
             << type << ": only floating-point tensors have gradients";
  }
  return success();
}
