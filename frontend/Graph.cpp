// dloss::Graph: records a loss op by op. Each method packs its operands into
// one dloss_graph_call, in the order compiler/GraphBuilder.cpp reads them,
// and
// - appends it to the graph's recording, one line per op: the source its
//   plan is cached under (jit::compilePlan(const Graph &)), so that a
//   machine without the compiler library runs a graph compiled elsewhere;
// - where the compiler library loads (CompilerLibrary.h), hands it to the
//   library, which builds and checks the op's MLIR at once, so a mistake is
//   reported at the user's line.
// This file holds no MLIR.
#include "frontend/Graph.h"

#include "frontend/CompilerLibrary.h"
#include "runtime/support/Error.h"

#include <cstdio>
#include <initializer_list>

namespace dloss {

struct Graph::Impl {
  explicit Impl(std::string lossName) : name(std::move(lossName)) {
    try {
      library = &compilerLibrary();
      handle = library->graphCreate(name.c_str());
    } catch (const Error &e) {
      missingLibrary = std::make_unique<Error>(e);
    }
    recording = "dloss-graph 1 " + name + "\n";
  }
  ~Impl() {
    if (handle)
      library->graphDestroy(handle);
  }
  Impl(const Impl &) = delete;
  Impl &operator=(const Impl &) = delete;

  /// The library, for what only it can do (MLIR text, shapes); throws why it
  /// could not be loaded.
  const CompilerLibrary &needLibrary() const {
    if (!handle)
      throw *missingLibrary;
    return *library;
  }

  std::string name;
  const CompilerLibrary *library = nullptr;
  dloss_graph *handle = nullptr;         // Null without the library.
  std::unique_ptr<Error> missingLibrary; // Why there is none.
  std::string recording;
  int32_t tensorCount = 0, sizeCount = 0;
  std::vector<std::string> inputNames;
  bool finished = false;
};

namespace {

/// One method's operands, by kind, in the order GraphBuilder.cpp reads them.
struct Call {
  const char *method;
  std::vector<int32_t> tensors, sizes;
  std::vector<int64_t> ints;
  std::vector<double> reals;
  std::string text;
};

} // namespace

enum class Result { Tensor, Size, None };

/// The call as one line of the recording: every operand, the text
/// length-prefixed, reals exactly (hexadecimal), and the user's line (it
/// becomes the ops' locations, which run-time errors name).
static std::string recordOf(const Call &call, SourceLoc at) {
  std::string line = call.method;
  auto list = [&](const char *tag, const auto &values) {
    line.append(" ").append(tag);
    for (const auto &v : values)
      line.append(" ").append(std::to_string(v));
  };
  list("t", call.tensors);
  list("s", call.sizes);
  list("i", call.ints);
  line += " r";
  for (double v : call.reals) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), " %a", v);
    line += buffer;
  }
  line += " x " + std::to_string(call.text.size()) + ":" + call.text;
  std::string file = at.file ? at.file : "";
  line += " @ " + std::to_string(file.size()) + ":" + file + ":" +
          std::to_string(at.line) + "\n";
  return line;
}

/// Adds the op; its result's id, or a dloss::Error naming the op and the
/// user's line.
static int32_t addOp(Graph &graph, const Call &call, SourceLoc at,
                     Result result) {
  Graph::Impl &impl = graph.impl();
  int32_t expected = result == Result::Tensor ? impl.tensorCount
                     : result == Result::Size ? impl.sizeCount
                                              : 0;
  auto accept = [&] {
    impl.recording += recordOf(call, at);
    if (result == Result::Tensor)
      ++impl.tensorCount;
    else if (result == Result::Size)
      ++impl.sizeCount;
    return expected;
  };
  if (!impl.handle) // Recorded only: checked when compiled elsewhere.
    return accept();
  dloss_graph_call c{call.method,
                     call.tensors.data(),
                     static_cast<int32_t>(call.tensors.size()),
                     call.sizes.data(),
                     static_cast<int32_t>(call.sizes.size()),
                     call.ints.data(),
                     static_cast<int32_t>(call.ints.size()),
                     call.reals.data(),
                     static_cast<int32_t>(call.reals.size()),
                     call.text.c_str(),
                     at.file,
                     at.line};
  dloss_graph_error error{};
  int32_t id = impl.library->graphAdd(impl.handle, &c, &error);
  if (id < 0)
    throw Error(error.message, error.hint)
        .withOp(error.op)
        .withLocation(error.location);
  if (id != expected)
    throw Error("the compiler library numbered '" + std::string(call.method) +
                    "' " + std::to_string(id) + ", not " +
                    std::to_string(expected),
                "Install libdloss_compiler from the same dloss build as "
                "libdloss_jit");
  return accept();
}

Graph::Graph(std::string lossName)
    : state(std::make_unique<Impl>(std::move(lossName))) {}
Graph::~Graph() = default;
Graph::Graph(Graph &&) noexcept = default;
Graph &Graph::operator=(Graph &&) noexcept = default;

const std::string &Graph::name() const { return state->name; }
const std::string &Graph::recording() const { return state->recording; }
std::vector<std::string> Graph::inputNames() const { return state->inputNames; }

std::vector<int64_t> Tensor::shape() const {
  if (!owner)
    return {};
  Graph::Impl &impl = owner->impl();
  const CompilerLibrary &library = impl.needLibrary();
  int32_t rank = library.graphShape(impl.handle, index, nullptr, 0);
  if (rank < 0)
    return {};
  std::vector<int64_t> dims(rank);
  library.graphShape(impl.handle, index, dims.data(), rank);
  return dims;
}

// A tensor or size of this graph as its id; -1 (refused by the builder with
// the graph's name) for one of another graph or an empty one.
#define DLOSS_T(x) ((x).graph() == this ? (x).id() : -1)
#define DLOSS_S(x) (sizeOf(x))
#define DLOSS_TENSOR_OP(...)                                                   \
  Tensor(this, addOp(*this, Call{__VA_ARGS__}, at, Result::Tensor))
#define DLOSS_SIZE_OP(...)                                                     \
  Size(this, addOp(*this, Call{__VA_ARGS__}, at, Result::Size))

namespace {
int32_t sizeOf(Size s) { return s.defined() ? s.id() : -1; }
} // namespace

Tensor Graph::input(const std::string &name, DType dtype,
                    std::vector<int64_t> shape, InputOptions options,
                    SourceLoc at) {
  std::vector<int64_t> ints{static_cast<int64_t>(dtype), options.grad,
                            options.replicated, options.state};
  ints.insert(ints.end(), shape.begin(), shape.end());
  Tensor result = DLOSS_TENSOR_OP("input", {}, {}, ints, {}, name);
  state->inputNames.push_back(name);
  return result;
}

Tensor Graph::allGather(Tensor x, int64_t axis, GatherGrad grad, SourceLoc at) {
  return DLOSS_TENSOR_OP("allGather", {DLOSS_T(x)}, {},
                         {axis, static_cast<int64_t>(grad)});
}
Tensor Graph::allReduce(Tensor x, Reduction kind, SourceLoc at) {
  return DLOSS_TENSOR_OP("allReduce", {DLOSS_T(x)}, {},
                         {static_cast<int64_t>(kind)});
}
Tensor Graph::reduceScatter(Tensor x, Reduction kind, int64_t axis,
                            std::optional<Size> size, SourceLoc at) {
  return DLOSS_TENSOR_OP("reduceScatter", {DLOSS_T(x)},
                         {size ? DLOSS_S(*size) : -1},
                         {static_cast<int64_t>(kind), axis});
}
Tensor Graph::broadcast(Tensor x, int64_t root, SourceLoc at) {
  return DLOSS_TENSOR_OP("broadcast", {DLOSS_T(x)}, {}, {root});
}
Tensor Graph::ringShift(Tensor x, int64_t shift, SourceLoc at) {
  return DLOSS_TENSOR_OP("ringShift", {DLOSS_T(x)}, {}, {shift});
}

Size Graph::rank(SourceLoc at) { return DLOSS_SIZE_OP("rank"); }
Size Graph::worldSize(SourceLoc at) { return DLOSS_SIZE_OP("worldSize"); }
Size Graph::dim(Tensor x, int64_t axis, SourceLoc at) {
  return DLOSS_SIZE_OP("dim", {DLOSS_T(x)}, {}, {axis});
}
Size Graph::shardOffset(Tensor x, int64_t axis, SourceLoc at) {
  return DLOSS_SIZE_OP("shardOffset", {DLOSS_T(x)}, {}, {axis});
}
Size Graph::globalSize(Tensor x, int64_t axis, SourceLoc at) {
  return DLOSS_SIZE_OP("globalSize", {DLOSS_T(x)}, {}, {axis});
}
Size Graph::size(int64_t value, SourceLoc at) {
  return DLOSS_SIZE_OP("size", {}, {}, {value});
}
Size Graph::addSizes(Size a, Size b, SourceLoc at) {
  return DLOSS_SIZE_OP("addSizes", {}, {DLOSS_S(a), DLOSS_S(b)});
}
Size Graph::subSizes(Size a, Size b, SourceLoc at) {
  return DLOSS_SIZE_OP("subSizes", {}, {DLOSS_S(a), DLOSS_S(b)});
}
Size Graph::mulSizes(Size a, Size b, SourceLoc at) {
  return DLOSS_SIZE_OP("mulSizes", {}, {DLOSS_S(a), DLOSS_S(b)});
}

Tensor Graph::constant(double value, DType dtype, SourceLoc at) {
  return DLOSS_TENSOR_OP("constant", {}, {}, {static_cast<int64_t>(dtype)},
                         {value});
}
Tensor Graph::constantLike(Tensor like, double value, SourceLoc at) {
  return DLOSS_TENSOR_OP("constantLike", {DLOSS_T(like)}, {}, {}, {value});
}
Tensor Graph::matmul(Tensor a, Tensor b, bool transposeA, bool transposeB,
                     SourceLoc at) {
  return DLOSS_TENSOR_OP("matmul", {DLOSS_T(a), DLOSS_T(b)}, {},
                         {transposeA, transposeB});
}

#define DLOSS_BINARY(METHOD)                                                   \
  Tensor Graph::METHOD(Tensor a, Tensor b, SourceLoc at) {                     \
    return DLOSS_TENSOR_OP(#METHOD, {DLOSS_T(a), DLOSS_T(b)});                 \
  }
DLOSS_BINARY(add)
DLOSS_BINARY(sub)
DLOSS_BINARY(mul)
DLOSS_BINARY(div)
DLOSS_BINARY(eq)
#undef DLOSS_BINARY

Tensor Graph::select(Tensor cond, Tensor a, Tensor b, SourceLoc at) {
  return DLOSS_TENSOR_OP("select", {DLOSS_T(cond), DLOSS_T(a), DLOSS_T(b)});
}

#define DLOSS_UNARY(METHOD)                                                    \
  Tensor Graph::METHOD(Tensor x, SourceLoc at) {                               \
    return DLOSS_TENSOR_OP(#METHOD, {DLOSS_T(x)});                             \
  }
DLOSS_UNARY(neg)
DLOSS_UNARY(exp)
DLOSS_UNARY(log)
DLOSS_UNARY(softplus)
DLOSS_UNARY(logSigmoid)
DLOSS_UNARY(sigmoid)
DLOSS_UNARY(cos)
DLOSS_UNARY(sin)
DLOSS_UNARY(acos)
DLOSS_UNARY(sqrt)
DLOSS_UNARY(stopGradient)
DLOSS_UNARY(zerosLike)
#undef DLOSS_UNARY

Tensor Graph::clamp(Tensor x, std::optional<double> min,
                    std::optional<double> max, SourceLoc at) {
  return DLOSS_TENSOR_OP("clamp", {DLOSS_T(x)}, {},
                         {min.has_value(), max.has_value()},
                         {min.value_or(0.0), max.value_or(0.0)});
}
Tensor Graph::cast(Tensor x, DType dtype, SourceLoc at) {
  return DLOSS_TENSOR_OP("cast", {DLOSS_T(x)}, {},
                         {static_cast<int64_t>(dtype)});
}
Tensor Graph::toTensor(Size n, DType dtype, SourceLoc at) {
  return DLOSS_TENSOR_OP("toTensor", {}, {DLOSS_S(n)},
                         {static_cast<int64_t>(dtype)});
}
Tensor Graph::l2Normalize(Tensor x, int64_t axis, double eps, SourceLoc at) {
  return DLOSS_TENSOR_OP("l2Normalize", {DLOSS_T(x)}, {}, {axis}, {eps});
}
Tensor Graph::reduce(Tensor x, Reduction kind, std::vector<int64_t> axes,
                     SourceLoc at) {
  std::vector<int64_t> ints{static_cast<int64_t>(kind)};
  ints.insert(ints.end(), axes.begin(), axes.end());
  return DLOSS_TENSOR_OP("reduce", {DLOSS_T(x)}, {}, ints);
}
Tensor Graph::logsumexp(Tensor x, int64_t axis, SourceLoc at) {
  return DLOSS_TENSOR_OP("logsumexp", {DLOSS_T(x)}, {}, {axis});
}
Tensor Graph::takeAlong(Tensor x, Tensor indices, int64_t axis, SourceLoc at) {
  return DLOSS_TENSOR_OP("takeAlong", {DLOSS_T(x), DLOSS_T(indices)}, {},
                         {axis});
}
Tensor Graph::putAlong(Tensor x, Tensor indices, Tensor values, int64_t axis,
                       SourceLoc at) {
  return DLOSS_TENSOR_OP(
      "putAlong", {DLOSS_T(x), DLOSS_T(indices), DLOSS_T(values)}, {}, {axis});
}
Tensor Graph::arange(Size start, Size count, DType dtype, SourceLoc at) {
  return DLOSS_TENSOR_OP("arange", {}, {DLOSS_S(start), DLOSS_S(count)},
                         {static_cast<int64_t>(dtype)});
}
Tensor Graph::crossEntropy(Tensor logits, Tensor targets, int64_t axis,
                           SourceLoc at) {
  return DLOSS_TENSOR_OP("crossEntropy", {DLOSS_T(logits), DLOSS_T(targets)},
                         {}, {axis});
}
Tensor Graph::expand(Tensor x, std::vector<int64_t> axes, Tensor like,
                     SourceLoc at) {
  return DLOSS_TENSOR_OP("expand", {DLOSS_T(x), DLOSS_T(like)}, {}, axes);
}
Tensor Graph::slice(Tensor x, int64_t axis, Size offset, Size size,
                    SourceLoc at) {
  return DLOSS_TENSOR_OP("slice", {DLOSS_T(x)},
                         {DLOSS_S(offset), DLOSS_S(size)}, {axis});
}
Tensor Graph::pad(Tensor x, int64_t axis, Size low, Size high, SourceLoc at) {
  return DLOSS_TENSOR_OP("pad", {DLOSS_T(x)}, {DLOSS_S(low), DLOSS_S(high)},
                         {axis});
}

void Graph::setLoss(Tensor loss, GradMode mode, SourceLoc at) {
  setLoss(loss, {}, mode, at);
}

void Graph::setLoss(Tensor loss, std::vector<Tensor> newState, GradMode mode,
                    SourceLoc at) {
  std::vector<int32_t> tensors{DLOSS_T(loss)};
  for (Tensor &t : newState)
    tensors.push_back(DLOSS_T(t));
  addOp(*this, Call{"setLoss", tensors, {}, {static_cast<int64_t>(mode)}}, at,
        Result::None);
  state->finished = true;
}

std::string Graph::toMlir() const {
  if (!state->finished)
    throw Error("graph '" + state->name + "' has no loss yet",
                "Call setLoss(loss) before compiling or printing it");
  return state->needLibrary().graphMlir(state->handle);
}

#undef DLOSS_T
#undef DLOSS_S
#undef DLOSS_TENSOR_OP
#undef DLOSS_SIZE_OP

// Operators.
static Graph &graphOf(Tensor a) {
  if (!a.defined())
    throw Error("an operand of an arithmetic operator is an empty Tensor",
                "Build tensors with a dloss::Graph");
  return *a.graph();
}
static Tensor scalarLike(Tensor a, double v) {
  return graphOf(a).constantLike(a, v);
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
