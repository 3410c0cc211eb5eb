// dloss-lower-to-plan: the compiler's side of the plan (runtime/plan/Plan.fbs).
#include "passes/LowerToPlan.h"
#include "passes/LocationText.h"
#include "passes/Passes.h"
#include "passes/StraightLineLiveness.h"

#include "runtime/plan/PlanText.h"
#include "runtime/plan/PlanVersion.h"
#include "runtime/plan/Plan_generated.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/xxhash.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_LOWERTOPLANPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;
namespace fb = flatbuffers;
namespace plan = ::dloss::plan;

static std::optional<plan::DType> toDType(Type type) {
  if (type.isF16())
    return plan::DType::f16;
  if (type.isBF16())
    return plan::DType::bf16;
  if (type.isF32())
    return plan::DType::f32;
  if (type.isF64())
    return plan::DType::f64;
  if (type.isInteger(1))
    return plan::DType::boolean;
  if (type.isSignlessInteger(8))
    return plan::DType::i8;
  if (type.isSignlessInteger(16))
    return plan::DType::i16;
  if (type.isSignlessInteger(32))
    return plan::DType::i32;
  if (type.isSignlessInteger(64))
    return plan::DType::i64;
  if (type.isUnsignedInteger(8))
    return plan::DType::u8;
  return std::nullopt;
}

namespace {

/// Writes one module into a FlatBuffers plan.
class PlanWriter {
public:
  FailureOr<std::string> write(ModuleOp module, StringRef source) {
    std::vector<fb::Offset<plan::Function>> functions;
    bool ok = true;
    module.walk([&](func::FuncOp func) {
      if (func.isExternal())
        return;
      FailureOr<fb::Offset<plan::Function>> f = writeFunction(module, func);
      if (failed(f))
        ok = false;
      else
        functions.push_back(*f);
    });
    if (!ok)
      return failure();

    // The fingerprint covers the IR and the plan format, so ranks running
    // different compilations of a loss disagree in preflight.
    std::string ir;
    llvm::raw_string_ostream os(ir);
    module->print(os);
    uint64_t fingerprint =
        llvm::xxh3_64bits(ir) ^ static_cast<uint64_t>(::dloss::kPlanVersion);

    auto root = plan::CreatePlan(fbb, ::dloss::kPlanVersion, fingerprint,
                                 fbb.CreateString(source.str()),
                                 fbb.CreateVector(functions));
    plan::FinishPlanBuffer(fbb, root);
    return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
                       fbb.GetSize());
  }

private:
  FailureOr<fb::Offset<plan::TypeInfo>> typeInfo(Type type, Location loc,
                                                 StringRef what) {
    if (type.isIndex() || type.isInteger(1))
      return plan::CreateTypeInfo(fbb, plan::RegisterKind::index);
    if (auto tensor = dyn_cast<RankedTensorType>(type))
      if (std::optional<plan::DType> dtype = toDType(tensor.getElementType())) {
        std::vector<int64_t> shape;
        for (int64_t d : tensor.getShape())
          shape.push_back(ShapedType::isDynamic(d) ? -1 : d);
        return plan::CreateTypeInfo(fbb, plan::RegisterKind::tensor, *dtype,
                                    fbb.CreateVector(shape));
      }
    return emitError(loc) << "the runtime cannot hold " << what << " of type "
                          << type
                          << "; use ranked tensors of float or signless "
                             "integer elements, or index";
  }

  FailureOr<fb::Offset<plan::Attr>> attribute(Operation *op,
                                              NamedAttribute na) {
    StringRef name = na.getName().getValue();
    Attribute value = na.getValue();
    auto nameOffset = fbb.CreateString(name.str());
    auto integer = [&](int64_t i) {
      plan::AttrBuilder b(fbb);
      b.add_name(nameOffset);
      b.add_kind(plan::AttrKind::integer);
      b.add_i(i);
      return b.Finish();
    };
    auto text = [&](StringRef s) {
      auto sOffset = fbb.CreateString(s.str());
      plan::AttrBuilder b(fbb);
      b.add_name(nameOffset);
      b.add_kind(plan::AttrKind::text);
      b.add_s(sOffset);
      return b.Finish();
    };
    // Enums travel by name: stable across reorderings of their cases.
    if (auto e = dyn_cast<EnumAttrInterface>(value))
      return text(e.getCaseName());
    if (auto i = dyn_cast<IntegerAttr>(value)) {
      // arith's predicate is an I64EnumAttr, a bare IntegerAttr that does not
      // know its enum, so only the op can name it.
      if (auto cmp = dyn_cast<arith::CmpIOp>(op); cmp && name == "predicate")
        return text(arith::stringifyCmpIPredicate(cmp.getPredicate()));
      return integer(i.getValue().getSExtValue());
    }
    if (isa<UnitAttr>(value))
      return integer(1);
    // Index arithmetic carries overflow flags; the runtime computes in
    // int64, where they change nothing, but the plan keeps them for the record.
    if (auto flags = dyn_cast<arith::IntegerOverflowFlagsAttr>(value))
      return integer(static_cast<int64_t>(flags.getValue()));
    if (auto b = dyn_cast<BoolAttr>(value))
      return integer(b.getValue());
    if (auto f = dyn_cast<FloatAttr>(value)) {
      plan::AttrBuilder b(fbb);
      b.add_name(nameOffset);
      b.add_kind(plan::AttrKind::real);
      b.add_f(f.getValueAsDouble());
      return b.Finish();
    }
    if (auto ints = dyn_cast<DenseI64ArrayAttr>(value)) {
      auto v = fbb.CreateVector(std::vector<int64_t>(ints.asArrayRef()));
      plan::AttrBuilder b(fbb);
      b.add_name(nameOffset);
      b.add_kind(plan::AttrKind::integers);
      b.add_ints(v);
      return b.Finish();
    }
    if (auto s = dyn_cast<StringAttr>(value))
      return text(s.getValue());
    if (auto dense = dyn_cast<DenseElementsAttr>(value)) {
      FailureOr<fb::Offset<plan::Constant>> c = constant(op, dense);
      if (failed(c))
        return failure();
      plan::AttrBuilder b(fbb);
      b.add_name(nameOffset);
      b.add_kind(plan::AttrKind::constant);
      b.add_constant(*c);
      return b.Finish();
    }
    return op->emitOpError() << "has attribute '" << name << "' = " << value
                             << ", which a plan cannot carry";
  }

  FailureOr<fb::Offset<plan::Constant>> constant(Operation *op,
                                                 DenseElementsAttr dense) {
    auto type = cast<RankedTensorType>(dense.getType());
    std::optional<plan::DType> dtype = toDType(type.getElementType());
    if (!dtype)
      return op->emitOpError()
             << "has a constant of element type " << type.getElementType()
             << ", which the runtime does not support";
    std::vector<uint8_t> bytes;
    if (type.getElementType().isInteger(1)) {
      // i1 is bit-packed in MLIR; the plan stores one byte per element.
      for (bool b : dense.getValues<bool>()) {
        bytes.push_back(b);
        if (dense.isSplat())
          break;
      }
    } else {
      ArrayRef<char> raw = dense.getRawData();
      bytes.assign(raw.begin(), raw.end());
    }
    std::vector<int64_t> shape(type.getShape());
    return plan::CreateConstant(fbb, *dtype, fbb.CreateVector(shape),
                                dense.isSplat(), fbb.CreateVector(bytes));
  }

  FailureOr<fb::Offset<plan::Function>> writeFunction(ModuleOp module,
                                                      func::FuncOp func) {
    if (!func.getBody().hasOneBlock())
      return func.emitError()
             << "the runtime runs straight-line functions; @" << func.getName()
             << " has " << func.getBody().getBlocks().size() << " blocks";
    Block &body = func.getBody().front();
    llvm::DenseMap<Value, int> registers;
    std::vector<fb::Offset<plan::Argument>> arguments;
    for (BlockArgument arg : body.getArguments()) {
      FailureOr<fb::Offset<plan::TypeInfo>> type =
          typeInfo(arg.getType(), arg.getLoc(), "argument");
      if (failed(type))
        return failure();
      unsigned i = arg.getArgNumber();
      auto name =
          func.getArgAttrOfType<StringAttr>(i, DlossDialect::kNameAttrName);
      bool replicated = static_cast<bool>(
          func.getArgAttr(i, DlossDialect::kReplicatedAttrName));
      bool state =
          static_cast<bool>(func.getArgAttr(i, DlossDialect::kStateAttrName));
      arguments.push_back(plan::CreateArgument(
          fbb, fbb.CreateString(name ? name.getValue().str() : ""), *type,
          replicated, state));
      registers[arg] = static_cast<int>(registers.size());
    }

    // Number the results; each register is freed after its value's last use.
    StraightLineLiveness liveness(body);
    ArrayRef<Operation *> ops = liveness.ops();
    for (Operation *op : ops) {
      if (op->getNumRegions() != 0)
        return op->emitOpError()
               << "has regions, and the runtime runs straight-line plans; "
                  "compute this without control flow";
      if (isa<func::CallOp>(op))
        return op->emitOpError() << "calls a function; inline it first "
                                    "(dlossc and dloss-derive-backward do)";
      for (Value result : op->getResults())
        registers[result] = static_cast<int>(registers.size());
    }
    Operation *ret = body.getTerminator();
    std::vector<std::vector<int>> freeAfter(ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
      for (Value value : liveness.deadAfter(i))
        freeAfter[i].push_back(registers.lookup(value));

    std::vector<fb::Offset<plan::Step>> steps;
    for (auto [i, op] : llvm::enumerate(ops)) {
      std::vector<int> operands, results;
      std::vector<fb::Offset<plan::TypeInfo>> resultTypes;
      for (Value operand : op->getOperands())
        operands.push_back(registers.lookup(operand));
      for (Value result : op->getResults()) {
        FailureOr<fb::Offset<plan::TypeInfo>> type =
            typeInfo(result.getType(), op->getLoc(), "a result");
        if (failed(type))
          return failure();
        resultTypes.push_back(*type);
        results.push_back(registers.lookup(result));
      }
      std::vector<fb::Offset<plan::Attr>> attrs;
      for (NamedAttribute na : op->getAttrDictionary()) {
        if (na.getName().getValue().starts_with("dloss."))
          continue; // annotations, not semantics
        FailureOr<fb::Offset<plan::Attr>> attr = attribute(op, na);
        if (failed(attr))
          return failure();
        attrs.push_back(*attr);
      }
      std::sort(freeAfter[i].begin(), freeAfter[i].end());
      steps.push_back(plan::CreateStep(
          fbb, fbb.CreateString(op->getName().getStringRef().str()),
          fbb.CreateVector(operands), fbb.CreateVector(results),
          fbb.CreateVector(attrs), fbb.CreateString(locationText(op->getLoc())),
          fbb.CreateVector(freeAfter[i]), fbb.CreateVector(resultTypes)));
    }

    std::vector<int> results;
    std::vector<fb::Offset<plan::TypeInfo>> resultTypes;
    for (Value v : ret->getOperands()) {
      results.push_back(registers.lookup(v));
      FailureOr<fb::Offset<plan::TypeInfo>> type =
          typeInfo(v.getType(), ret->getLoc(), "a result");
      if (failed(type))
        return failure();
      resultTypes.push_back(*type);
    }

    // The gradient contract of a loss and of its derived gradient function.
    std::string gradMode, gradientOf;
    std::vector<int> gradArguments;
    func::FuncOp loss = func;
    if (auto of = func->getAttrOfType<FlatSymbolRefAttr>(
            DlossDialect::kGradientOfAttrName)) {
      gradientOf = of.getValue().str();
      loss = module.lookupSymbol<func::FuncOp>(of.getAttr());
      if (!loss)
        return func.emitError() << "differentiates @" << gradientOf
                                << ", which is not in the module";
      for (unsigned i = 0, e = loss.getNumArguments(); i < e; ++i)
        if (loss.getArgAttr(i, DlossDialect::kGradAttrName))
          gradArguments.push_back(i);
    }
    if (loss->hasAttr(DlossDialect::kLossAttrName)) {
      auto mode =
          loss->getAttrOfType<StringAttr>(DlossDialect::kGradModeAttrName);
      gradMode = mode ? mode.getValue().str() : "ddp";
    }

    return plan::CreateFunction(
        fbb, fbb.CreateString(func.getName().str()),
        fbb.CreateVector(arguments), fbb.CreateVector(results),
        fbb.CreateVector(resultTypes), static_cast<int>(registers.size()),
        fbb.CreateVector(steps), fbb.CreateString(gradMode),
        fbb.CreateString(gradientOf), fbb.CreateVector(gradArguments));
  }

  fb::FlatBufferBuilder fbb;
};

static LogicalResult writeFile(StringRef path, StringRef contents,
                               Location loc) {
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(path, &error);
  if (!file)
    return emitError(loc) << "cannot write the plan to '" << path
                          << "': " << error;
  file->os() << contents;
  file->keep();
  return success();
}

struct LowerToPlanPass
    : mlir::dloss::impl::LowerToPlanPassBase<LowerToPlanPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<std::string> bytes = lowerToPlan(module);
    if (failed(bytes))
      return signalPassFailure();
    if (!output.empty() && failed(writeFile(output, *bytes, module.getLoc())))
      return signalPassFailure();
    if (!text.empty()) {
      std::string dump = plan::toText(*plan::GetPlan(bytes->data()));
      if (failed(writeFile(text, dump, module.getLoc())))
        return signalPassFailure();
    }
  }
};

} // namespace

FailureOr<std::string> mlir::dloss::lowerToPlan(ModuleOp module,
                                                StringRef source) {
  return PlanWriter().write(module, source);
}
