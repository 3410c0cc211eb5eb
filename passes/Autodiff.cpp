// dloss-autodiff: reverse mode over each loss entry point, with exact
// collective adjoints.
#include "passes/Passes.h"
#include "passes/ReplicationAnalysis.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

static bool isFloatTensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && isa<FloatType>(type.getElementType());
}

namespace {

/// The cotangents of one backward pass, keyed by forward value.
using Cotangents = llvm::DenseMap<Value, Cotangent>;

/// AdjointBuilder for one op of the forward program.
class OpAdjointBuilder : public AdjointBuilder {
public:
  OpAdjointBuilder(OpBuilder &b, Operation *op, Cotangents &cotangents,
                   const ReplicationAnalysis &analysis)
      : AdjointBuilder(b, op ? op->getLoc() : b.getUnknownLoc()), op(op),
        cotangents(cotangents), analysis(analysis) {}

  Cotangent resultCotangent(unsigned i) override {
    return cotangents.lookup(op->getResult(i));
  }

  void addOperandCotangent(unsigned i, Value ct,
                           std::optional<CotangentKind> kind) override {
    Value operand = op->getOperand(i);
    if (!isFloatTensor(operand))
      return;
    accumulate(operand, ct, kind ? *kind : kindOfOperand(operand));
  }

  Replication replicationOf(Value value) override {
    return analysis.lookup(value);
  }

  /// Adds `ct` to the cotangent of `value`. Reduced and partial forms of an
  /// invariant value's cotangent meet in the partial form (no communication).
  void accumulate(Value value, Value ct, CotangentKind kind) {
    Cotangent &slot = cotangents[value];
    if (!slot) {
      slot = {ct, kind};
      return;
    }
    Value incoming = ct;
    if (slot.kind != kind) {
      slot.value = partial(slot);
      incoming = partial({ct, kind});
      slot.kind = CotangentKind::Partial;
    }
    slot.value = AddOp::create(b, loc, slot.value, incoming);
  }

private:
  /// The form of a contribution to `operand` (see CotangentKind): an
  /// invariant operand of a collective, or of an op whose result varies, is
  /// implicitly broadcast to every rank, so its contribution is per-rank
  /// partial; through local invariant computation the form carries over.
  CotangentKind kindOfOperand(Value operand) {
    if (analysis.isVarying(operand))
      return CotangentKind::Varying;
    if (op->hasTrait<IsCollective>())
      return CotangentKind::Partial;
    for (Value result : op->getResults()) {
      if (analysis.isVarying(result))
        return CotangentKind::Partial;
      if (Cotangent ct = cotangents.lookup(result))
        return ct.kind;
    }
    return CotangentKind::Reduced;
  }

  Operation *op;
  Cotangents &cotangents;
  const ReplicationAnalysis &analysis;
};

struct AutodiffPass : dloss::impl::AutodiffPassBase<AutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> losses;
    module.walk([&](func::FuncOp func) {
      if (func->hasAttr(DlossDialect::kLossAttrName))
        losses.push_back(func);
    });
    for (func::FuncOp loss : losses)
      if (failed(differentiate(module, loss)))
        return signalPassFailure();
  }

  LogicalResult differentiate(ModuleOp module, func::FuncOp loss) {
    std::string name = (loss.getName() + "_grad").str();
    if (Operation *existing = module.lookupSymbol(name)) {
      InFlightDiagnostic diag = loss.emitError()
                                << "cannot derive @" << name
                                << ": a symbol of that name exists";
      diag.attachNote(existing->getLoc()) << "it is defined here; rename it";
      return failure();
    }
    if (!loss.getBody().hasOneBlock())
      return loss.emitError()
             << "dloss-autodiff differentiates single-block loss functions; "
                "@"
             << loss.getName() << " has " << loss.getBody().getBlocks().size()
             << " blocks (use scf ops for control flow)";

    bool globalMode = false;
    if (auto mode =
            loss->getAttrOfType<StringAttr>(DlossDialect::kGradModeAttrName))
      globalMode = mode.getValue() == "global";

    // @<name>_grad: the same arguments, the loss and one gradient per
    // dloss.grad argument. Argument attributes stay, but dloss.grad: the
    // gradient function is not a loss entry point.
    // The loss, each state argument's new value (dloss.state), then the
    // gradients.
    SmallVector<unsigned> gradArgs;
    SmallVector<Type> resultTypes(loss.getResultTypes());
    for (unsigned i = 0, e = loss.getNumArguments(); i < e; ++i)
      if (loss.getArgAttr(i, DlossDialect::kGradAttrName)) {
        gradArgs.push_back(i);
        resultTypes.push_back(loss.getArgumentTypes()[i]);
      }
    OpBuilder moduleBuilder(loss->getContext());
    moduleBuilder.setInsertionPointAfter(loss);
    auto gradFunc = func::FuncOp::create(
        moduleBuilder, loss.getLoc(), name,
        moduleBuilder.getFunctionType(loss.getArgumentTypes(), resultTypes));
    gradFunc.setVisibility(loss.getVisibility());
    gradFunc->setAttr(DlossDialect::kGradientOfAttrName,
                      FlatSymbolRefAttr::get(loss.getNameAttr()));
    for (unsigned i = 0, e = loss.getNumArguments(); i < e; ++i)
      for (NamedAttribute attr : loss.getArgAttrDict(i)
                                     ? loss.getArgAttrDict(i).getValue()
                                     : ArrayRef<NamedAttribute>{})
        if (attr.getName() != DlossDialect::kGradAttrName)
          gradFunc.setArgAttr(i, attr.getName(), attr.getValue());
    IRMapping mapping;
    loss.getBody().cloneInto(&gradFunc.getBody(), mapping);

    ReplicationAnalysis analysis(gradFunc);
    Block &body = gradFunc.getBody().front();
    Operation *ret = body.getTerminator();
    Value lossValue = ret->getOperand(0);
    if (analysis.isVarying(lossValue)) {
      InFlightDiagnostic diag =
          loss.emitError()
          << "cannot differentiate @" << loss.getName()
          << ": its loss varies across ranks (run dloss-infer-replication for "
             "details)";
      // Explain on the user's function, not on the clone.
      ReplicationAnalysis(loss).explainVarying(
          loss.getBody().back().getTerminator()->getOperand(0), diag);
      gradFunc.erase();
      return failure();
    }

    for (Value state : ret->getOperands().drop_front())
      if (analysis.isVarying(state)) {
        InFlightDiagnostic diag =
            loss.emitError()
            << "the new value of a dloss.state argument of @" << loss.getName()
            << " varies across ranks: state must stay the same on every "
               "rank (update it from all-reduced statistics)";
        gradFunc.erase();
        return diag;
      }

    OpBuilder b(ret);
    Cotangents cotangents;
    {
      OpAdjointBuilder seed(b, ret, cotangents, analysis);
      Type elementType = cast<ShapedType>(lossValue.getType()).getElementType();
      cotangents[lossValue] = {seed.scalar(1.0, elementType),
                               CotangentKind::Reduced};
    }

    // Reverse sweep over the forward ops (not over the backward ops that the
    // rules insert before the terminator).
    SmallVector<Operation *> forward;
    for (Operation &op : body.without_terminator())
      forward.push_back(&op);
    for (Operation *op : llvm::reverse(forward)) {
      bool reached = llvm::any_of(op->getResults(), [&](Value result) {
        return static_cast<bool>(cotangents.lookup(result));
      });
      if (!reached)
        continue;
      // Report before erasing @<loss>_grad: the op being reported is in it.
      if (op->getNumRegions() != 0) {
        LogicalResult reported =
            op->emitOpError()
            << "is on the path from the inputs to the loss, and "
               "dloss-autodiff does not differentiate through region ops "
               "yet; compute this part without control flow";
        gradFunc.erase();
        return reported;
      }
      OpAdjointBuilder adjoint(b, op, cotangents, analysis);
      if (auto rule = dyn_cast<AdjointOpInterface>(op)) {
        if (failed(rule.buildAdjoint(adjoint))) {
          gradFunc.erase();
          return failure();
        }
        continue;
      }
      if (llvm::none_of(op->getOperands(), isFloatTensor))
        continue; // constants and index arithmetic carry no gradient
      LogicalResult reported =
          op->emitOpError()
          << "has no adjoint rule, so the gradient cannot flow through it; "
             "express this step with dloss ops";
      gradFunc.erase();
      return reported;
    }

    // The gradient contract, explicit in the IR.
    OpAdjointBuilder finish(b, ret, cotangents, analysis);
    SmallVector<Value> results(ret->getOperands());
    for (unsigned i : gradArgs) {
      BlockArgument arg = gradFunc.getArgument(i);
      Cotangent ct = cotangents.lookup(arg);
      Value grad;
      if (!ct) {
        grad = ZerosLikeOp::create(b, arg.getLoc(), arg);
      } else if (globalMode) {
        // dF/dx_r; replicated parameters get the full gradient everywhere.
        grad = finish.reduced(ct);
      } else if (ct.kind == CotangentKind::Reduced) {
        // Already the full gradient on every rank: DDP's average keeps it.
        grad = ct.value;
      } else {
        // N * dF/dx_r, or N times this rank's share of dF/dtheta: DDP's
        // average over the N ranks gives the single-device gradient.
        Type elementType =
            cast<ShapedType>(ct.value.getType()).getElementType();
        grad = MulOp::create(b, arg.getLoc(), ct.value,
                             finish.worldSize(elementType));
      }
      if (grad.getType() != arg.getType())
        grad = CastOp::create(b, arg.getLoc(), arg.getType(), grad);
      results.push_back(grad);
    }
    func::ReturnOp::create(b, ret->getLoc(), results);
    ret->erase();
    return success();
  }
};

} // namespace
