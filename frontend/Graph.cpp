// dloss::Graph: builds the dloss MLIR of a loss op by op, checking each op as
// it is added.
#include "frontend/Graph.h"

#include "dialect/DlossOps.h"
#include "driver/Compile.h"
#include "runtime/support/Error.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <sstream>

namespace dloss {

namespace d = mlir::dloss;

/// Collects the diagnostics MLIR reports while one op is built or checked.
class DiagnosticCapture {
public:
  explicit DiagnosticCapture(mlir::MLIRContext *context)
      : handler(context, [this](mlir::Diagnostic &diag) {
          std::string text;
          llvm::raw_string_ostream os(text);
          os << diag;
          for (mlir::Diagnostic &note : diag.getNotes())
            os << " (" << note << ")";
          messages.push_back(text);
          return mlir::success();
        }) {}

  std::string text() const {
    std::string all;
    for (const std::string &m : messages)
      all += (all.empty() ? "" : "; ") + m;
    return all.empty() ? "the op is not valid" : all;
  }

private:
  std::vector<std::string> messages;
  mlir::ScopedDiagnosticHandler handler;
};

struct Graph::Impl {
  explicit Impl(std::string lossName)
      : name(std::move(lossName)), builder(&context) {
    mlir::DialectRegistry registry;
    d::registerLossDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    module = mlir::ModuleOp::create(builder.getUnknownLoc());
    builder.setInsertionPointToEnd(module->getBody());
    func = mlir::func::FuncOp::create(builder,
                                      location(SourceLoc{name.c_str(), 0}),
                                      name, builder.getFunctionType({}, {}));
    body = func.addEntryBlock();
    builder.setInsertionPointToEnd(body);
  }

  mlir::Location location(SourceLoc at) {
    return mlir::FileLineColLoc::get(&context, at.file, at.line, 0);
  }

  mlir::Type elementType(DType dtype) {
    switch (dtype) {
    case DType::F16:
      return builder.getF16Type();
    case DType::BF16:
      return builder.getBF16Type();
    case DType::F32:
      return builder.getF32Type();
    case DType::F64:
      return builder.getF64Type();
    case DType::I32:
      return builder.getI32Type();
    case DType::I64:
      return builder.getI64Type();
    }
    return builder.getF32Type();
  }

  [[noreturn]] void fail(llvm::StringRef op, SourceLoc at,
                         const std::string &what,
                         const std::string &hint = "") {
    std::ostringstream where;
    where << at.file << ":" << at.line;
    throw Error(what, hint.empty() ? "fix the operands of this op" : hint)
        .withOp(op.str())
        .withLocation(where.str());
  }

  mlir::Value tensor(Tensor t, llvm::StringRef op, SourceLoc at) {
    if (!t.defined() || &t.graph()->impl() != this || t.id() < 0 ||
        t.id() >= static_cast<int>(tensors.size()))
      fail(op, at, "an operand is not a tensor of graph '" + name + "'",
           "build every operand with this graph's methods");
    if (finished)
      fail(op, at, "graph '" + name + "' is finished (setLoss was called)",
           "build the whole loss before setLoss");
    return tensors[t.id()];
  }

  mlir::Value size(Size s, llvm::StringRef op, SourceLoc at) {
    if (!s.defined() || s.id() < 0 || s.id() >= static_cast<int>(sizes.size()))
      fail(
          op, at, "a size operand is not a size of graph '" + name + "'",
          "build sizes with dim(), shardOffset(), globalSize() or worldSize()");
    return sizes[s.id()];
  }

  /// Builds op `OpTy` with `args` (after the result type), inferring the
  /// result type when the op can, then verifies it. Any problem raises
  /// dloss::Error naming the op and the C++ line, instead of MLIR's
  /// fatal error on a builder that cannot infer.
  template <typename OpTy, typename... Args>
  mlir::Value make(SourceLoc at, mlir::Type resultType, Args &&...args) {
    mlir::Location loc = location(at);
    DiagnosticCapture capture(&context);
    mlir::OperationState state(loc, OpTy::getOperationName());
    OpTy::build(builder, state, resultType ? resultType : builder.getNoneType(),
                std::forward<Args>(args)...);
    if constexpr (OpTy::template hasTrait<
                      mlir::InferTypeOpInterface::Trait>()) {
      llvm::SmallVector<mlir::Type> types;
      if (mlir::failed(OpTy::inferReturnTypes(
              &context, loc, state.operands,
              state.attributes.getDictionary(&context),
              state.getRawProperties(), state.regions, types)))
        fail(OpTy::getOperationName(), at, capture.text());
      state.types.assign(types.begin(), types.end());
    }
    mlir::Operation *op = builder.create(state);
    if (mlir::failed(mlir::verify(op))) {
      std::string text = capture.text();
      op->erase();
      fail(OpTy::getOperationName(), at, text);
    }
    return op->getResult(0);
  }

  Tensor addTensor(Graph *graph, mlir::Value v) {
    tensors.push_back(v);
    return Tensor(graph, static_cast<int>(tensors.size()) - 1);
  }
  Size addSize(Graph *graph, mlir::Value v) {
    sizes.push_back(v);
    return Size(graph, static_cast<int>(sizes.size()) - 1);
  }

  std::string name;
  mlir::MLIRContext context;
  mlir::OpBuilder builder;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  mlir::func::FuncOp func;
  mlir::Block *body = nullptr;
  std::vector<mlir::Value> tensors, sizes;
  std::vector<std::string> inputNames;
  std::vector<InputOptions> inputOptions;
  bool finished = false;
};

namespace {
d::ReduceKind reduceKind(Reduction r) {
  switch (r) {
  case Reduction::Sum:
    return d::ReduceKind::sum;
  case Reduction::Mean:
    return d::ReduceKind::mean;
  case Reduction::Max:
    return d::ReduceKind::max;
  case Reduction::Min:
    return d::ReduceKind::min;
  }
  return d::ReduceKind::sum;
}
d::GatherGrad gatherGrad(GatherGrad g) {
  switch (g) {
  case GatherGrad::Exact:
    return d::GatherGrad::exact;
  case GatherGrad::Local:
    return d::GatherGrad::local;
  case GatherGrad::None:
    return d::GatherGrad::none;
  }
  return d::GatherGrad::exact;
}
} // namespace

std::vector<int64_t> Tensor::shape() const {
  if (!owner)
    return {};
  auto type = llvm::cast<mlir::RankedTensorType>(
      owner->impl().tensors[index].getType());
  std::vector<int64_t> result;
  for (int64_t d : type.getShape())
    result.push_back(mlir::ShapedType::isDynamic(d) ? -1 : d);
  return result;
}

Graph::Graph(std::string lossName)
    : state(std::make_unique<Impl>(std::move(lossName))) {}
Graph::~Graph() = default;
Graph::Graph(Graph &&) noexcept = default;
Graph &Graph::operator=(Graph &&) noexcept = default;

const std::string &Graph::name() const { return state->name; }
std::vector<std::string> Graph::inputNames() const { return state->inputNames; }

Tensor Graph::input(const std::string &name, DType dtype,
                    std::vector<int64_t> shape, InputOptions options,
                    SourceLoc at) {
  Impl &s = *state;
  if (s.finished)
    s.fail("input", at,
           "graph '" + s.name + "' is finished (setLoss was called)",
           "declare every input before setLoss");
  for (const std::string &existing : s.inputNames)
    if (existing == name)
      s.fail("input", at,
             "graph '" + s.name + "' already has an input called '" + name +
                 "'",
             "give every input its own name");
  llvm::SmallVector<int64_t> dims;
  for (int64_t d : shape) {
    if (d < -1)
      s.fail("input", at, "input '" + name + "' has size " + std::to_string(d),
             "use -1 for a size known only at run time");
    dims.push_back(d < 0 ? mlir::ShapedType::kDynamic : d);
  }
  mlir::Type elem = s.elementType(dtype);
  if (options.grad && !llvm::isa<mlir::FloatType>(elem))
    s.fail("input", at,
           "input '" + name + "' asks for a gradient but is an integer tensor",
           "only floating-point inputs have gradients");
  mlir::Value arg = s.body->addArgument(mlir::RankedTensorType::get(dims, elem),
                                        s.location(at));
  s.inputNames.push_back(name);
  s.inputOptions.push_back(options);
  return s.addTensor(this, arg);
}

#define DLOSS_TENSOR(x) state->tensor(x, op, at)
#define DLOSS_SIZE(x) state->size(x, op, at)

Tensor Graph::allGather(Tensor x, int64_t axis, GatherGrad grad, SourceLoc at) {
  llvm::StringRef op = d::AllGatherOp::getOperationName();
  return state->addTensor(this,
                          state->make<d::AllGatherOp>(at, {}, DLOSS_TENSOR(x),
                                                      axis, gatherGrad(grad)));
}
Tensor Graph::allReduce(Tensor x, Reduction kind, SourceLoc at) {
  llvm::StringRef op = d::AllReduceOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  return state->addTensor(
      this, state->make<d::AllReduceOp>(at, v.getType(), reduceKind(kind), v));
}
Tensor Graph::reduceScatter(Tensor x, Reduction kind, int64_t axis,
                            std::optional<Size> size, SourceLoc at) {
  llvm::StringRef op = d::ReduceScatterOp::getOperationName();
  mlir::Value n = size ? DLOSS_SIZE(*size) : mlir::Value();
  return state->addTensor(
      this, state->make<d::ReduceScatterOp>(at, {}, reduceKind(kind),
                                            DLOSS_TENSOR(x), axis, n));
}
Tensor Graph::broadcast(Tensor x, int64_t root, SourceLoc at) {
  llvm::StringRef op = d::BroadcastOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  return state->addTensor(
      this, state->make<d::BroadcastOp>(at, v.getType(), v, root));
}
Tensor Graph::ringShift(Tensor x, int64_t shift, SourceLoc at) {
  llvm::StringRef op = d::RingShiftOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  return state->addTensor(
      this, state->make<d::RingShiftOp>(at, v.getType(), v, shift));
}

Size Graph::rank(SourceLoc at) {
  return state->addSize(
      this, state->make<d::RankOp>(at, state->builder.getIndexType()));
}
Size Graph::worldSize(SourceLoc at) {
  return state->addSize(
      this, state->make<d::WorldSizeOp>(at, state->builder.getIndexType()));
}
Size Graph::dim(Tensor x, int64_t axis, SourceLoc at) {
  llvm::StringRef op = d::DimOp::getOperationName();
  return state->addSize(this,
                        state->make<d::DimOp>(at, state->builder.getIndexType(),
                                              DLOSS_TENSOR(x), axis));
}
Size Graph::shardOffset(Tensor x, int64_t axis, SourceLoc at) {
  llvm::StringRef op = d::ShardOffsetOp::getOperationName();
  return state->addSize(
      this, state->make<d::ShardOffsetOp>(at, state->builder.getIndexType(),
                                          DLOSS_TENSOR(x), axis));
}
Size Graph::globalSize(Tensor x, int64_t axis, SourceLoc at) {
  llvm::StringRef op = d::GlobalSizeOp::getOperationName();
  return state->addSize(
      this, state->make<d::GlobalSizeOp>(at, state->builder.getIndexType(),
                                         DLOSS_TENSOR(x), axis));
}

Size Graph::size(int64_t value, SourceLoc at) {
  Impl &s = *state;
  return s.addSize(
      this, s.make<mlir::arith::ConstantOp>(at, s.builder.getIndexType(),
                                            s.builder.getIndexAttr(value)));
}

#define DLOSS_SIZE_ARITH(METHOD, OP)                                           \
  Size Graph::METHOD(Size a, Size b, SourceLoc at) {                           \
    llvm::StringRef op = OP::getOperationName();                               \
    return state->addSize(this,                                                \
                          state->make<OP>(at, state->builder.getIndexType(),   \
                                          DLOSS_SIZE(a), DLOSS_SIZE(b)));      \
  }
DLOSS_SIZE_ARITH(addSizes, mlir::arith::AddIOp)
DLOSS_SIZE_ARITH(subSizes, mlir::arith::SubIOp)
DLOSS_SIZE_ARITH(mulSizes, mlir::arith::MulIOp)
#undef DLOSS_SIZE_ARITH

Tensor Graph::constant(double value, DType dtype, SourceLoc at) {
  Impl &s = *state;
  mlir::Type elem = s.elementType(dtype);
  auto type = mlir::RankedTensorType::get({}, elem);
  mlir::Attribute element =
      llvm::isa<mlir::FloatType>(elem)
          ? mlir::Attribute(s.builder.getFloatAttr(elem, value))
          : mlir::Attribute(
                s.builder.getIntegerAttr(elem, static_cast<int64_t>(value)));
  auto dense = mlir::DenseElementsAttr::get(type, llvm::ArrayRef(element));
  return s.addTensor(this, s.make<mlir::arith::ConstantOp>(at, type, dense));
}

Tensor Graph::matmul(Tensor a, Tensor b, bool transposeA, bool transposeB,
                     SourceLoc at) {
  llvm::StringRef op = d::MatmulOp::getOperationName();
  return state->addTensor(
      this, state->make<d::MatmulOp>(at, {}, DLOSS_TENSOR(a), DLOSS_TENSOR(b),
                                     transposeA, transposeB));
}

#define DLOSS_BINARY(METHOD, OP)                                               \
  Tensor Graph::METHOD(Tensor a, Tensor b, SourceLoc at) {                     \
    llvm::StringRef op = OP::getOperationName();                               \
    return state->addTensor(                                                   \
        this, state->make<OP>(at, {}, DLOSS_TENSOR(a), DLOSS_TENSOR(b)));      \
  }
DLOSS_BINARY(add, d::AddOp)
DLOSS_BINARY(sub, d::SubOp)
DLOSS_BINARY(mul, d::MulOp)
DLOSS_BINARY(div, d::DivOp)
DLOSS_BINARY(eq, d::EqOp)
#undef DLOSS_BINARY

Tensor Graph::select(Tensor cond, Tensor a, Tensor b, SourceLoc at) {
  llvm::StringRef op = d::SelectOp::getOperationName();
  return state->addTensor(
      this, state->make<d::SelectOp>(at, {}, DLOSS_TENSOR(cond),
                                     DLOSS_TENSOR(a), DLOSS_TENSOR(b)));
}

#define DLOSS_UNARY(METHOD, OP)                                                \
  Tensor Graph::METHOD(Tensor x, SourceLoc at) {                               \
    llvm::StringRef op = OP::getOperationName();                               \
    mlir::Value v = DLOSS_TENSOR(x);                                           \
    return state->addTensor(this, state->make<OP>(at, v.getType(), v));        \
  }
DLOSS_UNARY(neg, d::NegOp)
DLOSS_UNARY(exp, d::ExpOp)
DLOSS_UNARY(log, d::LogOp)
DLOSS_UNARY(softplus, d::SoftplusOp)
DLOSS_UNARY(logSigmoid, d::LogSigmoidOp)
DLOSS_UNARY(sigmoid, d::SigmoidOp)
DLOSS_UNARY(cos, d::CosOp)
DLOSS_UNARY(sin, d::SinOp)
DLOSS_UNARY(acos, d::AcosOp)
DLOSS_UNARY(sqrt, d::SqrtOp)
DLOSS_UNARY(zerosLike, d::ZerosLikeOp)
#undef DLOSS_UNARY

Tensor Graph::clamp(Tensor x, std::optional<double> min,
                    std::optional<double> max, SourceLoc at) {
  llvm::StringRef op = d::ClampOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  mlir::FloatAttr lo =
      min ? state->builder.getF64FloatAttr(*min) : mlir::FloatAttr();
  mlir::FloatAttr hi =
      max ? state->builder.getF64FloatAttr(*max) : mlir::FloatAttr();
  return state->addTensor(this,
                          state->make<d::ClampOp>(at, v.getType(), v, lo, hi));
}

Tensor Graph::cast(Tensor x, DType dtype, SourceLoc at) {
  llvm::StringRef op = d::CastOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  auto type = llvm::cast<mlir::RankedTensorType>(v.getType())
                  .clone(state->elementType(dtype));
  return state->addTensor(this, state->make<d::CastOp>(at, type, v));
}

Tensor Graph::toTensor(Size n, DType dtype, SourceLoc at) {
  llvm::StringRef op = d::CastOp::getOperationName();
  auto type = mlir::RankedTensorType::get({}, state->elementType(dtype));
  return state->addTensor(this,
                          state->make<d::CastOp>(at, type, DLOSS_SIZE(n)));
}

Tensor Graph::l2Normalize(Tensor x, int64_t axis, double eps, SourceLoc at) {
  llvm::StringRef op = d::L2NormalizeOp::getOperationName();
  mlir::Value v = DLOSS_TENSOR(x);
  return state->addTensor(
      this, state->make<d::L2NormalizeOp>(at, v.getType(), v, axis,
                                          llvm::APFloat(eps)));
}

Tensor Graph::reduce(Tensor x, Reduction kind, std::vector<int64_t> axes,
                     SourceLoc at) {
  llvm::StringRef op = d::ReduceOp::getOperationName();
  return state->addTensor(
      this, state->make<d::ReduceOp>(at, {}, reduceKind(kind), DLOSS_TENSOR(x),
                                     llvm::ArrayRef<int64_t>(axes)));
}

Tensor Graph::logsumexp(Tensor x, int64_t axis, SourceLoc at) {
  llvm::StringRef op = d::LogSumExpOp::getOperationName();
  return state->addTensor(
      this, state->make<d::LogSumExpOp>(at, {}, DLOSS_TENSOR(x), axis));
}

Tensor Graph::takeAlong(Tensor x, Tensor indices, int64_t axis, SourceLoc at) {
  llvm::StringRef op = d::TakeAlongOp::getOperationName();
  return state->addTensor(
      this, state->make<d::TakeAlongOp>(at, {}, DLOSS_TENSOR(x),
                                        DLOSS_TENSOR(indices), axis));
}

Tensor Graph::putAlong(Tensor x, Tensor indices, Tensor values, int64_t axis,
                       SourceLoc at) {
  llvm::StringRef op = d::PutAlongOp::getOperationName();
  return state->addTensor(
      this,
      state->make<d::PutAlongOp>(at, {}, DLOSS_TENSOR(x), DLOSS_TENSOR(indices),
                                 DLOSS_TENSOR(values), axis));
}

Tensor Graph::arange(Size start, Size count, DType dtype, SourceLoc at) {
  llvm::StringRef op = d::ArangeOp::getOperationName();
  auto type = mlir::RankedTensorType::get({mlir::ShapedType::kDynamic},
                                          state->elementType(dtype));
  return state->addTensor(
      this,
      state->make<d::ArangeOp>(at, type, DLOSS_SIZE(start), DLOSS_SIZE(count)));
}

Tensor Graph::crossEntropy(Tensor logits, Tensor targets, int64_t axis,
                           SourceLoc at) {
  llvm::StringRef op = d::CrossEntropyOp::getOperationName();
  return state->addTensor(
      this, state->make<d::CrossEntropyOp>(at, {}, DLOSS_TENSOR(logits),
                                           DLOSS_TENSOR(targets), axis));
}

Tensor Graph::expand(Tensor x, std::vector<int64_t> axes, Tensor like,
                     SourceLoc at) {
  llvm::StringRef op = d::ExpandOp::getOperationName();
  return state->addTensor(
      this, state->make<d::ExpandOp>(at, {}, DLOSS_TENSOR(x),
                                     llvm::ArrayRef<int64_t>(axes),
                                     DLOSS_TENSOR(like)));
}

Tensor Graph::slice(Tensor x, int64_t axis, Size offset, Size size,
                    SourceLoc at) {
  llvm::StringRef op = d::SliceOp::getOperationName();
  return state->addTensor(
      this, state->make<d::SliceOp>(at, {}, DLOSS_TENSOR(x), axis,
                                    DLOSS_SIZE(offset), DLOSS_SIZE(size)));
}

Tensor Graph::pad(Tensor x, int64_t axis, Size low, Size high, SourceLoc at) {
  llvm::StringRef op = d::PadOp::getOperationName();
  return state->addTensor(this, state->make<d::PadOp>(at, {}, DLOSS_TENSOR(x),
                                                      axis, DLOSS_SIZE(low),
                                                      DLOSS_SIZE(high)));
}

void Graph::setLoss(Tensor loss, GradMode mode, SourceLoc at) {
  Impl &s = *state;
  llvm::StringRef op = "setLoss";
  mlir::Value v = DLOSS_TENSOR(loss);
  mlir::func::ReturnOp::create(s.builder, s.location(at), mlir::ValueRange{v});
  s.func.setFunctionType(
      s.builder.getFunctionType(s.body->getArgumentTypes(), {v.getType()}));
  s.func->setAttr(d::DlossDialect::kLossAttrName, s.builder.getUnitAttr());
  s.func->setAttr(
      d::DlossDialect::kGradModeAttrName,
      s.builder.getStringAttr(mode == GradMode::Global ? "global" : "ddp"));
  for (unsigned i = 0; i < s.inputNames.size(); ++i) {
    s.func.setArgAttr(i, d::DlossDialect::kNameAttrName,
                      s.builder.getStringAttr(s.inputNames[i]));
    if (s.inputOptions[i].grad)
      s.func.setArgAttr(i, d::DlossDialect::kGradAttrName,
                        s.builder.getUnitAttr());
    if (s.inputOptions[i].replicated)
      s.func.setArgAttr(i, d::DlossDialect::kReplicatedAttrName,
                        s.builder.getUnitAttr());
  }
  s.finished = true;
  DiagnosticCapture capture(&s.context);
  if (mlir::failed(mlir::verify(*s.module))) {
    std::string text = capture.text();
    s.finished = false;
    s.body->back().erase();
    s.fail("setLoss", at, text,
           "the loss must be a 0-d floating-point tensor, e.g. the result of "
           "reduce(...) followed by allReduce(..., Reduction::Sum)");
  }
}

std::string Graph::toMlir() const {
  if (!state->finished)
    throw Error("graph '" + state->name + "' has no loss yet",
                "call setLoss(loss) before compiling or printing it");
  std::string text;
  llvm::raw_string_ostream os(text);
  state->module->print(os,
                       mlir::OpPrintingFlags().enableDebugInfo(true, false));
  return text;
}

#undef DLOSS_TENSOR
#undef DLOSS_SIZE

// Operators.
static Graph &graphOf(Tensor a) {
  if (!a.defined())
    throw Error("an operand of an arithmetic operator is an empty Tensor",
                "build tensors with a dloss::Graph");
  return *a.graph();
}
static Tensor scalarLike(Tensor a, double v) {
  auto type = llvm::cast<mlir::RankedTensorType>(
      graphOf(a).impl().tensors.at(a.id()).getType());
  mlir::Type elem = type.getElementType();
  DType dtype = elem.isF16()         ? DType::F16
                : elem.isBF16()      ? DType::BF16
                : elem.isF64()       ? DType::F64
                : elem.isInteger(32) ? DType::I32
                : elem.isInteger(64) ? DType::I64
                                     : DType::F32;
  return graphOf(a).constant(v, dtype);
}
Tensor operator+(Tensor a, Tensor b) { return graphOf(a).add(a, b); }
Tensor operator-(Tensor a, Tensor b) { return graphOf(a).sub(a, b); }
Tensor operator*(Tensor a, Tensor b) { return graphOf(a).mul(a, b); }
Tensor operator/(Tensor a, Tensor b) { return graphOf(a).div(a, b); }
Tensor operator-(Tensor a) { return graphOf(a).neg(a); }
Tensor operator+(Tensor a, double b) { return a + scalarLike(a, b); }
Tensor operator-(Tensor a, double b) { return a - scalarLike(a, b); }
Tensor operator*(Tensor a, double b) { return a * scalarLike(a, b); }
Tensor operator/(Tensor a, double b) { return a / scalarLike(a, b); }
Tensor operator*(double a, Tensor b) { return scalarLike(b, a) * b; }

} // namespace dloss
