// The runtime lowering of every plan op: one ATen kernel per MLIR op name.
#ifndef DLOSS_RUNTIME_KERNELS_H
#define DLOSS_RUNTIME_KERNELS_H

#include "runtime/Communicator.h"
#include "runtime/Plan_generated.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace dloss {

/// What a register holds: nothing (not yet written, or freed), a tensor, or
/// an index (a 64-bit size; `i1` values live here too, as 0 or 1).
class Value {
public:
  enum class Kind : uint8_t { Empty, Tensor, Index };

  Value() = default;
  /*implicit*/ Value(at::Tensor tensor)
      : tensorValue(std::move(tensor)), valueKind(Kind::Tensor) {}
  static Value ofIndex(int64_t index) {
    Value value;
    value.indexValue = index;
    value.valueKind = Kind::Index;
    return value;
  }

  Kind kind() const { return valueKind; }
  bool isEmpty() const { return valueKind == Kind::Empty; }
  bool isTensor() const { return valueKind == Kind::Tensor; }
  bool isIndex() const { return valueKind == Kind::Index; }
  /// Only valid for the matching kind (callers check kind() first).
  const at::Tensor &tensor() const { return tensorValue; }
  int64_t index() const { return indexValue; }

  /// Drops the tensor reference, so its buffer can be released.
  void reset() { *this = Value(); }

private:
  at::Tensor tensorValue;
  int64_t indexValue = 0;
  Kind valueKind = Kind::Empty;
};

/// The executor's side of one step, as a kernel sees it.
class KernelContext {
public:
  virtual ~KernelContext() = default;

  virtual Communicator &communicator() = 0;
  virtual size_t numOperands() const = 0;
  virtual const Value &operand(size_t i) const = 0;
  virtual void setResult(size_t i, Value value) = 0;
  /// Every rank's size of operand `i` along `axis` (already normalised), in
  /// rank order. Known from the preflight for arguments; otherwise this is a
  /// collective (allGatherInts), which every rank reaches at the same step.
  virtual std::vector<int64_t> rankSizes(size_t i, int64_t axis) = 0;

  /// Operand `i` as a tensor / an index; a dloss::Error when the plan put
  /// the other kind (or nothing) there.
  const at::Tensor &tensor(size_t i) const;
  int64_t index(size_t i) const;
};

/// A step's attributes, looked up by name. Missing or ill-kinded attributes
/// raise dloss::Error saying which attribute and what kind was expected.
class StepAttrs {
public:
  explicit StepAttrs(const plan::Step &step) : step(step) {}

  const plan::Attr *find(const char *name) const;
  bool has(const char *name) const { return find(name) != nullptr; }

  int64_t integer(const char *name) const;
  std::optional<int64_t> optionalInteger(const char *name) const;
  /// A UnitAttr: present (integer 1) or absent.
  bool flag(const char *name) const;
  /// A FloatAttr (an integer is accepted and converted).
  double real(const char *name) const;
  std::optional<double> optionalReal(const char *name) const;
  std::vector<int64_t> integers(const char *name) const;
  std::string text(const char *name) const;
  /// The result element type of ops that choose it (dloss.cast,
  /// dloss.arange): the step's first `result_types` entry, or (in plans
  /// built by hand) attribute `dtype`, text ("f32", "bf16", "i64", "i1", or a
  /// plan DType name) or integer (a plan DType value).
  at::ScalarType resultType() const;

  const plan::Step &raw() const { return step; }

private:
  const plan::Attr &require(const char *name, const char *expected) const;

  const plan::Step &step;
};

/// A bound kernel: attributes parsed, ready to run any number of times.
using Kernel = std::function<void(KernelContext &)>;

/// How every rank's sizes of result 0 follow from the operands', so that the
/// executor keeps them (known from the preflight) instead of exchanging them
/// at a later dloss.shard_offset / global_size / all_gather.
enum class ShapeFlow : uint8_t {
  None,
  /// The result has operand 0's shape.
  Operand0,
  /// The result has the shape of the operand that is not 0-d.
  Elementwise,
};

/// The lowering rule of one op.
struct KernelRule {
  /// Parses the step's attributes (raising dloss::Error when they are
  /// missing or malformed) and returns the kernel.
  std::function<Kernel(const StepAttrs &)> bind;
  int minOperands;
  int maxOperands;
  int numResults;
  ShapeFlow shapeFlow = ShapeFlow::None;
};

/// A step's kernel, bound to its attributes.
struct BoundKernel {
  Kernel run;
  ShapeFlow shapeFlow = ShapeFlow::None;
};

/// The table of every op the runtime runs, keyed by MLIR op name.
const std::unordered_map<std::string, KernelRule> &kernelTable();

/// Resolves and binds the kernel of `step`: an unknown op, a wrong number of
/// operands or results, or a bad attribute raise dloss::Error naming the op
/// and its location.
BoundKernel bindKernel(const plan::Step &step);

/// Conversions between plan dtypes and ATen's.
at::ScalarType toScalarType(plan::DType dtype);
std::optional<plan::DType> toPlanDType(at::ScalarType type);
/// The MLIR spelling of a plan dtype ("f32", "i1"), for messages.
std::string dtypeName(plan::DType dtype);

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_H
