// The graph-building half of libdloss_compiler's C API (dloss_compiler.h):
// the MLIR behind dloss::Graph (frontend/Graph.h), which calls it op by op.
// Each op is built with the dialect's own builders, its result type inferred
// where the op can, and verified at once, so that a mistake is reported at
// the user's C++ (or Python) line that made it.
//
// Built with exceptions (GraphError) inside; none crosses the C API.
#include "compiler/dloss_compiler.h"

#include "dialect/DlossOps.h"
#include "driver/Compile.h"
#include "frontend/GraphTypes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dloss {
namespace {

namespace d = mlir::dloss;

struct GraphError {
  std::string message, hint, op, location;
};

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

struct Builder {
  explicit Builder(std::string lossName)
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
    throw GraphError{what, hint.empty() ? "Fix the operands of this op" : hint,
                     op.str(),
                     std::string(at.file) + ":" + std::to_string(at.line)};
  }

  /// Tensor `id` (the caller checked it belongs to this graph).
  mlir::Value tensor(int32_t id, llvm::StringRef op, SourceLoc at) {
    if (id < 0 || id >= static_cast<int32_t>(tensors.size()))
      fail(op, at, "an operand is not a tensor of graph '" + name + "'",
           "Build every operand with this graph's methods");
    if (finished)
      fail(op, at, "graph '" + name + "' is finished (setLoss was called)",
           "Build the whole loss before setLoss");
    return tensors[id];
  }

  mlir::Value size(int32_t id, llvm::StringRef op, SourceLoc at) {
    if (id < 0 || id >= static_cast<int32_t>(sizes.size()))
      fail(
          op, at, "a size operand is not a size of graph '" + name + "'",
          "Build sizes with dim(), shardOffset(), globalSize() or worldSize()");
    return sizes[id];
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

  int32_t addTensor(mlir::Value v) {
    tensors.push_back(v);
    return static_cast<int32_t>(tensors.size()) - 1;
  }
  int32_t addSize(mlir::Value v) {
    sizes.push_back(v);
    return static_cast<int32_t>(sizes.size()) - 1;
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
  std::string text; // dloss_graph_mlir's
  GraphError error; // dloss_graph_add's last
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

/// One call's operands, read in order by kind; every read is checked, so a
/// library that does not match its caller fails with a message, not a crash.
class Args {
public:
  Args(Builder &s, const dloss_graph_call &call, llvm::StringRef op)
      : s(s), call(call), op(op), at{call.file ? call.file : "", call.line} {}

  mlir::Value tensor(int32_t i) {
    check(i < call.tensor_count, "tensor");
    return s.tensor(call.tensors[i], op, at);
  }
  mlir::Value size(int32_t i) {
    check(i < call.size_count, "size");
    return s.size(call.sizes[i], op, at);
  }
  /// An optional size: -1 is absent.
  mlir::Value optionalSize(int32_t i) {
    check(i < call.size_count, "size");
    return call.sizes[i] < 0 ? mlir::Value() : size(i);
  }
  int64_t integer(int32_t i) {
    check(i < call.int_count, "integer");
    return call.ints[i];
  }
  std::vector<int64_t> integersFrom(int32_t i) {
    check(i <= call.int_count, "integer");
    return std::vector<int64_t>(call.ints + i, call.ints + call.int_count);
  }
  double real(int32_t i) {
    check(i < call.real_count, "real");
    return call.reals[i];
  }
  std::string text() { return call.text ? call.text : ""; }

  Builder &s;
  const dloss_graph_call &call;
  llvm::StringRef op;
  SourceLoc at;

private:
  void check(bool ok, const char *kind) {
    if (!ok)
      s.fail(op, at,
             std::string("the call has too few ") + kind +
                 " operands (libdloss_compiler does not match its caller)",
             "Install libdloss_compiler from the same dloss build as the "
             "library that loads it");
  }
};

using Handler = std::function<int32_t(Args &)>;

/// A 0-d constant `value` of element type `elem`.
mlir::Value constant(Builder &s, SourceLoc at, mlir::Type elem, double value) {
  auto type = mlir::RankedTensorType::get({}, elem);
  mlir::Attribute element =
      llvm::isa<mlir::FloatType>(elem)
          ? mlir::Attribute(s.builder.getFloatAttr(elem, value))
          : mlir::Attribute(
                s.builder.getIntegerAttr(elem, static_cast<int64_t>(value)));
  auto dense = mlir::DenseElementsAttr::get(type, llvm::ArrayRef(element));
  return s.make<mlir::arith::ConstantOp>(at, type, dense);
}

template <typename OpTy> llvm::StringRef nameOf() {
  return OpTy::getOperationName();
}

int32_t input(Args &a) {
  Builder &s = a.s;
  std::string name = a.text();
  SourceLoc at = a.at;
  if (s.finished)
    s.fail("input", at,
           "graph '" + s.name + "' is finished (setLoss was called)",
           "Declare every input before setLoss");
  for (const std::string &existing : s.inputNames)
    if (existing == name)
      s.fail("input", at,
             "graph '" + s.name + "' already has an input called '" + name +
                 "'",
             "Give every input its own name");
  // ints: dtype, grad, replicated, state, then the shape.
  auto dtype = static_cast<DType>(a.integer(0));
  InputOptions options{a.integer(1) != 0, a.integer(2) != 0, a.integer(3) != 0};
  if (options.state && (options.grad || !options.replicated))
    s.fail("input", at,
           "state input '" + name +
               "' must be replicated and have no "
               "gradient",
           "Declare state with replicated = true and grad = false: it is "
           "updated by the loss, not trained");
  llvm::SmallVector<int64_t> dims;
  for (int64_t d : a.integersFrom(4)) {
    if (d < -1)
      s.fail("input", at, "input '" + name + "' has size " + std::to_string(d),
             "Use -1 for a size known only at run time");
    dims.push_back(d < 0 ? mlir::ShapedType::kDynamic : d);
  }
  mlir::Type elem = s.elementType(dtype);
  if (options.grad && !llvm::isa<mlir::FloatType>(elem))
    s.fail("input", at,
           "input '" + name + "' asks for a gradient but is an integer tensor",
           "Only floating-point inputs have gradients");
  mlir::Value arg = s.body->addArgument(mlir::RankedTensorType::get(dims, elem),
                                        s.location(at));
  s.inputNames.push_back(name);
  s.inputOptions.push_back(options);
  return s.addTensor(arg);
}

int32_t setLoss(Args &a) {
  Builder &s = a.s;
  SourceLoc at = a.at;
  // The loss, then each state input's new value.
  llvm::SmallVector<mlir::Value> results;
  for (int32_t i = 0; i < a.call.tensor_count; ++i)
    results.push_back(a.tensor(i));
  auto mode = static_cast<GradMode>(a.integer(0));
  mlir::func::ReturnOp::create(s.builder, s.location(at), results);
  s.func.setFunctionType(s.builder.getFunctionType(
      s.body->getArgumentTypes(), mlir::ValueRange(results).getTypes()));
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
    if (s.inputOptions[i].state)
      s.func.setArgAttr(i, d::DlossDialect::kStateAttrName,
                        s.builder.getUnitAttr());
  }
  s.finished = true;
  DiagnosticCapture capture(&s.context);
  if (mlir::failed(mlir::verify(*s.module))) {
    std::string text = capture.text();
    s.finished = false;
    s.body->back().erase();
    s.fail("setLoss", at, text,
           "The loss must be a 0-d floating-point tensor, e.g. the result of "
           "reduce(...) followed by allReduce(..., Reduction::Sum)");
  }
  return 0;
}

template <typename OpTy> Handler unary() {
  return [](Args &a) {
    mlir::Value v = a.tensor(0);
    return a.s.addTensor(a.s.template make<OpTy>(a.at, v.getType(), v));
  };
}
template <typename OpTy> Handler binary() {
  return [](Args &a) {
    return a.s.addTensor(
        a.s.template make<OpTy>(a.at, {}, a.tensor(0), a.tensor(1)));
  };
}
template <typename OpTy> Handler sizeArith() {
  return [](Args &a) {
    return a.s.addSize(a.s.template make<OpTy>(a.at, a.s.builder.getIndexType(),
                                               a.size(0), a.size(1)));
  };
}
template <typename OpTy> Handler rankFact() {
  return [](Args &a) {
    return a.s.addSize(a.s.template make<OpTy>(a.at, a.s.builder.getIndexType(),
                                               a.tensor(0), a.integer(0)));
  };
}

/// Graph's methods by name, with the operand order frontend/Graph.cpp sends.
const std::map<std::string, std::pair<llvm::StringRef, Handler>> &handlers() {
  static const std::map<std::string, std::pair<llvm::StringRef, Handler>>
      table = {
          {"input", {"input", input}},
          {"setLoss", {"setLoss", setLoss}},
          // Collectives.
          {"allGather",
           {nameOf<d::AllGatherOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::AllGatherOp>(
                  a.at, {}, a.tensor(0), a.integer(0),
                  gatherGrad(static_cast<GatherGrad>(a.integer(1)))));
            }}},
          {"allReduce",
           {nameOf<d::AllReduceOp>(),
            [](Args &a) {
              mlir::Value v = a.tensor(0);
              return a.s.addTensor(a.s.make<d::AllReduceOp>(
                  a.at, v.getType(),
                  reduceKind(static_cast<Reduction>(a.integer(0))), v));
            }}},
          {"reduceScatter",
           {nameOf<d::ReduceScatterOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::ReduceScatterOp>(
                  a.at, {}, reduceKind(static_cast<Reduction>(a.integer(0))),
                  a.tensor(0), a.integer(1), a.optionalSize(0)));
            }}},
          {"broadcast",
           {nameOf<d::BroadcastOp>(),
            [](Args &a) {
              mlir::Value v = a.tensor(0);
              return a.s.addTensor(
                  a.s.make<d::BroadcastOp>(a.at, v.getType(), v, a.integer(0)));
            }}},
          {"ringShift",
           {nameOf<d::RingShiftOp>(),
            [](Args &a) {
              mlir::Value v = a.tensor(0);
              return a.s.addTensor(
                  a.s.make<d::RingShiftOp>(a.at, v.getType(), v, a.integer(0)));
            }}},
          // Rank facts and sizes.
          {"rank",
           {nameOf<d::RankOp>(),
            [](Args &a) {
              return a.s.addSize(
                  a.s.make<d::RankOp>(a.at, a.s.builder.getIndexType()));
            }}},
          {"worldSize",
           {nameOf<d::WorldSizeOp>(),
            [](Args &a) {
              return a.s.addSize(
                  a.s.make<d::WorldSizeOp>(a.at, a.s.builder.getIndexType()));
            }}},
          {"dim", {nameOf<d::DimOp>(), rankFact<d::DimOp>()}},
          {"shardOffset",
           {nameOf<d::ShardOffsetOp>(), rankFact<d::ShardOffsetOp>()}},
          {"globalSize",
           {nameOf<d::GlobalSizeOp>(), rankFact<d::GlobalSizeOp>()}},
          {"size",
           {nameOf<mlir::arith::ConstantOp>(),
            [](Args &a) {
              return a.s.addSize(a.s.make<mlir::arith::ConstantOp>(
                  a.at, a.s.builder.getIndexType(),
                  a.s.builder.getIndexAttr(a.integer(0))));
            }}},
          {"addSizes",
           {nameOf<mlir::arith::AddIOp>(), sizeArith<mlir::arith::AddIOp>()}},
          {"subSizes",
           {nameOf<mlir::arith::SubIOp>(), sizeArith<mlir::arith::SubIOp>()}},
          {"mulSizes",
           {nameOf<mlir::arith::MulIOp>(), sizeArith<mlir::arith::MulIOp>()}},
          // Compute.
          {"constant",
           {nameOf<mlir::arith::ConstantOp>(),
            [](Args &a) {
              return a.s.addTensor(constant(
                  a.s, a.at, a.s.elementType(static_cast<DType>(a.integer(0))),
                  a.real(0)));
            }}},
          {"constantLike",
           {nameOf<mlir::arith::ConstantOp>(),
            [](Args &a) {
              mlir::Type elem =
                  llvm::cast<mlir::RankedTensorType>(a.tensor(0).getType())
                      .getElementType();
              return a.s.addTensor(constant(a.s, a.at, elem, a.real(0)));
            }}},
          {"matmul",
           {nameOf<d::MatmulOp>(),
            [](Args &a) {
              return a.s.addTensor(
                  a.s.make<d::MatmulOp>(a.at, {}, a.tensor(0), a.tensor(1),
                                        a.integer(0) != 0, a.integer(1) != 0));
            }}},
          {"add", {nameOf<d::AddOp>(), binary<d::AddOp>()}},
          {"sub", {nameOf<d::SubOp>(), binary<d::SubOp>()}},
          {"mul", {nameOf<d::MulOp>(), binary<d::MulOp>()}},
          {"div", {nameOf<d::DivOp>(), binary<d::DivOp>()}},
          {"eq", {nameOf<d::EqOp>(), binary<d::EqOp>()}},
          {"select",
           {nameOf<d::SelectOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::SelectOp>(
                  a.at, {}, a.tensor(0), a.tensor(1), a.tensor(2)));
            }}},
          {"neg", {nameOf<d::NegOp>(), unary<d::NegOp>()}},
          {"exp", {nameOf<d::ExpOp>(), unary<d::ExpOp>()}},
          {"log", {nameOf<d::LogOp>(), unary<d::LogOp>()}},
          {"softplus", {nameOf<d::SoftplusOp>(), unary<d::SoftplusOp>()}},
          {"logSigmoid", {nameOf<d::LogSigmoidOp>(), unary<d::LogSigmoidOp>()}},
          {"sigmoid", {nameOf<d::SigmoidOp>(), unary<d::SigmoidOp>()}},
          {"cos", {nameOf<d::CosOp>(), unary<d::CosOp>()}},
          {"sin", {nameOf<d::SinOp>(), unary<d::SinOp>()}},
          {"acos", {nameOf<d::AcosOp>(), unary<d::AcosOp>()}},
          {"sqrt", {nameOf<d::SqrtOp>(), unary<d::SqrtOp>()}},
          {"stopGradient",
           {nameOf<d::StopGradientOp>(), unary<d::StopGradientOp>()}},
          {"zerosLike", {nameOf<d::ZerosLikeOp>(), unary<d::ZerosLikeOp>()}},
          {"clamp",
           {nameOf<d::ClampOp>(),
            [](Args &a) {
              // ints: has min, has max; reals: min, max.
              mlir::Value v = a.tensor(0);
              mlir::FloatAttr lo = a.integer(0)
                                       ? a.s.builder.getF64FloatAttr(a.real(0))
                                       : mlir::FloatAttr();
              mlir::FloatAttr hi = a.integer(1)
                                       ? a.s.builder.getF64FloatAttr(a.real(1))
                                       : mlir::FloatAttr();
              return a.s.addTensor(
                  a.s.make<d::ClampOp>(a.at, v.getType(), v, lo, hi));
            }}},
          {"cast",
           {nameOf<d::CastOp>(),
            [](Args &a) {
              mlir::Value v = a.tensor(0);
              auto type =
                  llvm::cast<mlir::RankedTensorType>(v.getType())
                      .clone(a.s.elementType(static_cast<DType>(a.integer(0))));
              return a.s.addTensor(a.s.make<d::CastOp>(a.at, type, v));
            }}},
          {"toTensor",
           {nameOf<d::CastOp>(),
            [](Args &a) {
              auto type = mlir::RankedTensorType::get(
                  {}, a.s.elementType(static_cast<DType>(a.integer(0))));
              return a.s.addTensor(a.s.make<d::CastOp>(a.at, type, a.size(0)));
            }}},
          {"l2Normalize",
           {nameOf<d::L2NormalizeOp>(),
            [](Args &a) {
              mlir::Value v = a.tensor(0);
              return a.s.addTensor(
                  a.s.make<d::L2NormalizeOp>(a.at, v.getType(), v, a.integer(0),
                                             llvm::APFloat(a.real(0))));
            }}},
          {"reduce",
           {nameOf<d::ReduceOp>(),
            [](Args &a) {
              auto kind = reduceKind(static_cast<Reduction>(a.integer(0)));
              std::vector<int64_t> axes = a.integersFrom(1);
              return a.s.addTensor(a.s.make<d::ReduceOp>(
                  a.at, {}, kind, a.tensor(0), llvm::ArrayRef<int64_t>(axes)));
            }}},
          {"logsumexp",
           {nameOf<d::LogSumExpOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::LogSumExpOp>(
                  a.at, {}, a.tensor(0), a.integer(0)));
            }}},
          {"takeAlong",
           {nameOf<d::TakeAlongOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::TakeAlongOp>(
                  a.at, {}, a.tensor(0), a.tensor(1), a.integer(0)));
            }}},
          {"putAlong",
           {nameOf<d::PutAlongOp>(),
            [](Args &a) {
              return a.s.addTensor(
                  a.s.make<d::PutAlongOp>(a.at, {}, a.tensor(0), a.tensor(1),
                                          a.tensor(2), a.integer(0)));
            }}},
          {"arange",
           {nameOf<d::ArangeOp>(),
            [](Args &a) {
              auto type = mlir::RankedTensorType::get(
                  {mlir::ShapedType::kDynamic},
                  a.s.elementType(static_cast<DType>(a.integer(0))));
              return a.s.addTensor(
                  a.s.make<d::ArangeOp>(a.at, type, a.size(0), a.size(1)));
            }}},
          {"crossEntropy",
           {nameOf<d::CrossEntropyOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::CrossEntropyOp>(
                  a.at, {}, a.tensor(0), a.tensor(1), a.integer(0)));
            }}},
          {"expand",
           {nameOf<d::ExpandOp>(),
            [](Args &a) {
              std::vector<int64_t> axes = a.integersFrom(0);
              return a.s.addTensor(a.s.make<d::ExpandOp>(
                  a.at, {}, a.tensor(0), llvm::ArrayRef<int64_t>(axes),
                  a.tensor(1)));
            }}},
          {"slice",
           {nameOf<d::SliceOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::SliceOp>(
                  a.at, {}, a.tensor(0), a.integer(0), a.size(0), a.size(1)));
            }}},
          {"pad",
           {nameOf<d::PadOp>(),
            [](Args &a) {
              return a.s.addTensor(a.s.make<d::PadOp>(
                  a.at, {}, a.tensor(0), a.integer(0), a.size(0), a.size(1)));
            }}},
      };
  return table;
}

} // namespace
} // namespace dloss

struct dloss_graph {
  explicit dloss_graph(const char *name) : builder(name ? name : "loss") {}
  dloss::Builder builder;
};

extern "C" {

dloss_graph *dloss_graph_create(const char *name) {
  return new dloss_graph(name);
}

void dloss_graph_destroy(dloss_graph *graph) { delete graph; }

int32_t dloss_graph_add(dloss_graph *graph, const dloss_graph_call *call,
                        dloss_graph_error *error) {
  dloss::Builder &s = graph->builder;
  std::string method = call->method ? call->method : "";
  try {
    auto it = dloss::handlers().find(method);
    if (it == dloss::handlers().end())
      throw dloss::GraphError{
          "libdloss_compiler has no graph op '" + method + "'",
          "Install libdloss_compiler from the same dloss build as the "
          "library that loads it",
          method,
          std::string(call->file ? call->file : "") + ":" +
              std::to_string(call->line)};
    dloss::Args args(s, *call, it->second.first);
    return it->second.second(args);
  } catch (const dloss::GraphError &e) {
    s.error = e;
  } catch (const std::exception &e) {
    s.error =
        dloss::GraphError{e.what(), "Report this as a dloss bug", method, ""};
  }
  *error = dloss_graph_error{s.error.message.c_str(), s.error.hint.c_str(),
                             s.error.op.c_str(), s.error.location.c_str()};
  return -1;
}

int32_t dloss_graph_shape(dloss_graph *graph, int32_t id, int64_t *dims,
                          int32_t capacity) {
  dloss::Builder &s = graph->builder;
  if (id < 0 || id >= static_cast<int32_t>(s.tensors.size()))
    return -1;
  auto type = llvm::cast<mlir::RankedTensorType>(s.tensors[id].getType());
  int32_t rank = static_cast<int32_t>(type.getRank());
  for (int32_t i = 0; i < rank && i < capacity; ++i)
    dims[i] = mlir::ShapedType::isDynamic(type.getDimSize(i))
                  ? -1
                  : type.getDimSize(i);
  return rank;
}

const char *dloss_graph_mlir(dloss_graph *graph) {
  dloss::Builder &s = graph->builder;
  s.text.clear();
  llvm::raw_string_ostream os(s.text);
  s.module->print(os, mlir::OpPrintingFlags().enableDebugInfo(true, false));
  os.flush();
  return s.text.c_str();
}

} // extern "C"
