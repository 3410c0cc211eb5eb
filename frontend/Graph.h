// dloss::Graph: a lazy builder for distributed losses from C++ (no MLIR types
// in this header).
#ifndef DLOSS_FRONTEND_GRAPH_H
#define DLOSS_FRONTEND_GRAPH_H

#include "frontend/GraphTypes.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dloss {

class Graph;

/// A symbolic tensor of one Graph: nothing is computed until the graph is
/// compiled (dloss::jit::compile) and called.
class Tensor {
public:
  Tensor() = default;
  Graph *graph() const { return owner; }
  int id() const { return index; }
  bool defined() const { return owner != nullptr; }
  /// The static shape (-1 where the size is known only at run time).
  std::vector<int64_t> shape() const;

private:
  friend class Graph;
  Tensor(Graph *owner, int index) : owner(owner), index(index) {}
  Graph *owner = nullptr;
  int index = -1;
};

/// A symbolic size (an index): a dimension, an offset, the world size.
class Size {
public:
  Size() = default;
  bool defined() const { return owner != nullptr; }
  int id() const { return index; }

private:
  friend class Graph;
  Size(Graph *owner, int index) : owner(owner), index(index) {}
  Graph *owner = nullptr;
  int index = -1;
};

/// Records the program one rank runs (SPMD), op by op, checking each op's
/// operands as it is added (through the compiler library,
/// compiler/dloss_compiler.h): a mistake raises dloss::Error naming the op,
/// the C++ line that built it and what to do. Without the compiler library
/// the ops are only recorded: a plan compiled elsewhere for the same
/// recording runs, and toMlir() and Tensor::shape() raise why there is no
/// compiler. The ops are the dloss dialect's
/// (docs/DlossDialect.md).
class Graph {
public:
  explicit Graph(std::string lossName = "loss");
  ~Graph();
  Graph(Graph &&) noexcept;
  Graph &operator=(Graph &&) noexcept;
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  /// A new input (argument of the loss); -1 in `shape` for run-time sizes
  /// (the batch). Inputs are passed to the compiled loss in this order.
  Tensor input(const std::string &name, DType dtype, std::vector<int64_t> shape,
               InputOptions options = {}, SourceLoc at = SourceLoc::current());

  // Collectives.
  Tensor allGather(Tensor x, int64_t axis, GatherGrad grad = GatherGrad::Exact,
                   SourceLoc at = SourceLoc::current());
  Tensor allReduce(Tensor x, Reduction kind,
                   SourceLoc at = SourceLoc::current());
  Tensor reduceScatter(Tensor x, Reduction kind, int64_t axis,
                       std::optional<Size> size = std::nullopt,
                       SourceLoc at = SourceLoc::current());
  Tensor broadcast(Tensor x, int64_t root, SourceLoc at = SourceLoc::current());
  Tensor ringShift(Tensor x, int64_t shift,
                   SourceLoc at = SourceLoc::current());

  // Rank facts.
  Size rank(SourceLoc at = SourceLoc::current());
  Size worldSize(SourceLoc at = SourceLoc::current());
  Size dim(Tensor x, int64_t axis, SourceLoc at = SourceLoc::current());
  Size shardOffset(Tensor x, int64_t axis, SourceLoc at = SourceLoc::current());
  Size globalSize(Tensor x, int64_t axis, SourceLoc at = SourceLoc::current());
  // Size arithmetic (index arithmetic in the IR, folded when constant).
  Size size(int64_t value, SourceLoc at = SourceLoc::current());
  Size addSizes(Size a, Size b, SourceLoc at = SourceLoc::current());
  Size subSizes(Size a, Size b, SourceLoc at = SourceLoc::current());
  Size mulSizes(Size a, Size b, SourceLoc at = SourceLoc::current());

  // Compute.
  Tensor constant(double value, DType dtype = DType::F32,
                  SourceLoc at = SourceLoc::current());
  /// A 0-d constant of `like`'s element type (what `x * 2.0` multiplies by).
  Tensor constantLike(Tensor like, double value,
                      SourceLoc at = SourceLoc::current());
  Tensor matmul(Tensor a, Tensor b, bool transposeA = false,
                bool transposeB = false, SourceLoc at = SourceLoc::current());
  Tensor add(Tensor a, Tensor b, SourceLoc at = SourceLoc::current());
  Tensor sub(Tensor a, Tensor b, SourceLoc at = SourceLoc::current());
  Tensor mul(Tensor a, Tensor b, SourceLoc at = SourceLoc::current());
  Tensor div(Tensor a, Tensor b, SourceLoc at = SourceLoc::current());
  Tensor eq(Tensor a, Tensor b, SourceLoc at = SourceLoc::current());
  /// `cond != 0 ? a : b` element-wise; `cond` (an indicator, as eq makes)
  /// has the result's shape, `a` and `b` have it or are 0-d. No gradient
  /// flows to `cond`, and none to the value not chosen.
  Tensor select(Tensor cond, Tensor a, Tensor b,
                SourceLoc at = SourceLoc::current());
  Tensor neg(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor exp(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor log(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor softplus(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor logSigmoid(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor sigmoid(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor cos(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor sin(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor acos(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor sqrt(Tensor x, SourceLoc at = SourceLoc::current());
  /// `x` itself, whose gradient is zero (torch's x.detach()).
  Tensor stopGradient(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor clamp(Tensor x, std::optional<double> min, std::optional<double> max,
               SourceLoc at = SourceLoc::current());
  Tensor cast(Tensor x, DType dtype, SourceLoc at = SourceLoc::current());
  /// A size as a 0-d tensor (to divide by the global batch, say).
  Tensor toTensor(Size n, DType dtype = DType::F32,
                  SourceLoc at = SourceLoc::current());
  Tensor l2Normalize(Tensor x, int64_t axis, double eps = 1e-12,
                     SourceLoc at = SourceLoc::current());
  Tensor reduce(Tensor x, Reduction kind, std::vector<int64_t> axes,
                SourceLoc at = SourceLoc::current());
  Tensor logsumexp(Tensor x, int64_t axis, SourceLoc at = SourceLoc::current());
  Tensor takeAlong(Tensor x, Tensor indices, int64_t axis,
                   SourceLoc at = SourceLoc::current());
  Tensor putAlong(Tensor x, Tensor indices, Tensor values, int64_t axis,
                  SourceLoc at = SourceLoc::current());
  Tensor arange(Size start, Size count, DType dtype = DType::I64,
                SourceLoc at = SourceLoc::current());
  Tensor crossEntropy(Tensor logits, Tensor targets, int64_t axis = 1,
                      SourceLoc at = SourceLoc::current());
  Tensor zerosLike(Tensor x, SourceLoc at = SourceLoc::current());
  Tensor expand(Tensor x, std::vector<int64_t> axes, Tensor like,
                SourceLoc at = SourceLoc::current());
  Tensor slice(Tensor x, int64_t axis, Size offset, Size size,
               SourceLoc at = SourceLoc::current());
  Tensor pad(Tensor x, int64_t axis, Size low, Size high,
             SourceLoc at = SourceLoc::current());

  /// Ends the program: `loss` (a 0-d float tensor, equal on every rank, e.g.
  /// after allReduce) is what the compiled function returns.
  void setLoss(Tensor loss, GradMode mode = GradMode::Ddp,
               SourceLoc at = SourceLoc::current());
  /// The same, for a loss with state inputs (InputOptions::state): `state`
  /// holds each one's new value (equal on every rank, same type as the
  /// input), in the order the state inputs were declared.
  void setLoss(Tensor loss, std::vector<Tensor> state,
               GradMode mode = GradMode::Ddp,
               SourceLoc at = SourceLoc::current());

  /// The verified program as dloss MLIR text (what dlossc reads). Needs the
  /// compiler library.
  std::string toMlir() const;
  /// Every op as recorded, one line each (with the user's file:line): the
  /// source the graph's plan is cached under, so that a machine without the
  /// compiler library runs a graph compiled elsewhere
  /// (jit::compilePlan(const Graph &)).
  const std::string &recording() const;
  const std::string &name() const;
  std::vector<std::string> inputNames() const;

  /// Implementation details (the compiler library's graph), private to
  /// frontend/.
  struct Impl;
  Impl &impl() const { return *state; }

private:
  std::unique_ptr<Impl> state;
};

/// Element-wise operators on symbolic tensors of the same graph; a number is
/// a 0-d constant of the tensor's element type.
Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator-(Tensor a);
Tensor operator+(Tensor a, double b);
Tensor operator-(Tensor a, double b);
Tensor operator*(Tensor a, double b);
Tensor operator/(Tensor a, double b);
Tensor operator*(double a, Tensor b);

} // namespace dloss

#endif // DLOSS_FRONTEND_GRAPH_H
