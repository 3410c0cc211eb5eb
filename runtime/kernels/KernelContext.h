// What a kernel sees of the interpreter: a step's registers (Value), operands,
// results, communicator.
#ifndef DLOSS_RUNTIME_KERNELS_KERNELCONTEXT_H
#define DLOSS_RUNTIME_KERNELS_KERNELCONTEXT_H

#include "runtime/comm/Communicator.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
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
  /// A key naming operand `i`'s value within the call, the same on every
  /// rank (its plan register), or -1 when there is none: the fused ops'
  /// gather reuses an operand an earlier step of the call gathered
  /// (fused/Schedule.h).
  virtual int64_t operandKey(size_t i) const {
    (void)i;
    return -1;
  }
  virtual void setResult(size_t i, Value value) = 0;
  /// Every rank's size of operand `i` along `axis` (already normalised), in
  /// rank order. Known from the preflight for arguments; otherwise this is a
  /// collective (allGatherInts), which every rank reaches at the same step.
  virtual std::vector<int64_t> rankSizes(size_t i, int64_t axis) = 0;
  /// The device this call computes on (preflight::callDevice). A kernel
  /// that makes a tensor from nothing but indices and attributes (arange, a
  /// constant, an index cast to a tensor) makes it here, so that it meets
  /// the call's other tensors on their device.
  virtual at::Device device() const = 0;

  /// Operand `i` as a tensor / an index; a dloss::Error when the plan put
  /// the other kind (or nothing) there.
  const at::Tensor &tensor(size_t i) const;
  int64_t index(size_t i) const;

  /// Operand `i`'s tensor when this step is its last reader and the call
  /// holds the only reference to it and to its storage (an intermediate,
  /// never a caller's input): the kernel may write a result of its size
  /// and type into its buffer instead of allocating a fresh one. Else an
  /// undefined tensor.
  virtual at::Tensor consumable(size_t i) const {
    (void)i;
    return {};
  }
};

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_KERNELCONTEXT_H
