// The preflight's wire record: the int64 values each rank contributes to the
// preflight collective, their layout, and a read-only view of one rank's.
#ifndef DLOSS_RUNTIME_EXEC_PREFLIGHTRECORD_H
#define DLOSS_RUNTIME_EXEC_PREFLIGHTRECORD_H

#include "runtime/exec/Executor.h"
#include "runtime/support/Format.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dloss::preflight {

/// Identifies the preflight layout, so that runtimes of different versions
/// report the difference instead of misreading each other ("DLPF" v5).
inline constexpr int64_t kPreflightMagic = 0x444c504600000005;

enum PreflightStatus : int64_t {
  Ok = 0,
  UnknownFunction,
  WrongInputCount,
  UndefinedInput,
  WrongDType,
  WrongRank,
  WrongStaticDim,
  NonFinite, // check mode: NaN or infinite values in an input
  // On a device the runtime does not compute on (meta; CUDA in a runtime
  // built without it).
  UnsupportedDevice,
  MixedDevices, // the tensor inputs of one call on different devices
  // Requires grad, but the gradient function gives it no gradient: the
  // caller's autograd graph would silently end there.
  RequiresGrad,
  // An index input (labels) outside the static size of the dimension it
  // indexes: one rank's kernel would fail alone, its peers wait.
  IndexOutOfRange,
  ValidationFailed, // checking an input raised; that rank's message says why
};

// Header fields of a preflight record.
enum PreflightField : size_t {
  Magic = 0,
  Fingerprint,
  FunctionHash,
  Status,
  StatusArgument,
  InputCount,
  // The communicator's collectivesStarted() before this preflight: ranks
  // that made the same calls agree (-1: the engine does not count).
  CollectiveSeq,
  CheckMode,
  // The fused ops' schedule setting (fused::Schedule): auto chooses from
  // sizes every rank knows, so equal settings give equal choices.
  ScheduleSetting,
  // Which of the function's fold registers (Executor::BoundFunction::
  // foldRegisters, bit k for the k-th) this rank's payload carries, in that
  // order: the payload is read only where every rank carries the same.
  FoldMask,
  // What the status found in argument StatusArgument. NonFinite: the NaN
  // and infinite counts. IndexOutOfRange: the value, its flat position and
  // the size of the dimension it indexes.
  Detail0,
  Detail1,
  Detail2,
  // The called function's name (first kNameWords * 8 bytes), so that every
  // rank can name what the others called even in another plan.
  Name0,
};
inline constexpr size_t kNameWords = 4;
static_assert(Name0 + kNameWords == Executor::kPreflightHeader,
              "header layout and length disagree");

// Input slot fields, then the sizes.
enum SlotField : size_t { SlotDType = 0, SlotNDim, SlotDevice };
static_assert(SlotDevice + 1 == Executor::kPreflightSlotFields,
              "slot layout and length disagree");
inline constexpr size_t kSlotLength =
    Executor::kPreflightSlotFields + Executor::kPreflightDims;
inline constexpr int64_t kUndefinedDType = -1;
// A dtype plans cannot name (complex).
inline constexpr int64_t kForeignDType = -2;
// A device as one integer: type * kDeviceIndexes + index + 1 (index -1: none).
inline constexpr int64_t kDeviceIndexes = 1 << 16;

/// A read-only view of one rank's preflight record.
struct Record {
  const int64_t *values;

  int64_t operator[](size_t field) const { return values[field]; }
  const int64_t *slot(size_t input) const {
    return values + Executor::kPreflightHeader + input * kSlotLength;
  }
  bool recorded(size_t input) const {
    return input < Executor::kPreflightArgs &&
           input < static_cast<size_t>(values[InputCount]);
  }
  int64_t dtype(size_t input) const { return slot(input)[SlotDType]; }
  int64_t ndim(size_t input) const { return slot(input)[SlotNDim]; }
  int64_t device(size_t input) const { return slot(input)[SlotDevice]; }
  bool fullShape(size_t input) const {
    return ndim(input) >= 0 &&
           ndim(input) <= static_cast<int64_t>(Executor::kPreflightDims);
  }
  std::vector<int64_t> shape(size_t input) const {
    int64_t n = std::min<int64_t>(ndim(input), Executor::kPreflightDims);
    const int64_t *sizes = slot(input) + Executor::kPreflightSlotFields;
    return std::vector<int64_t>(sizes, sizes + n);
  }
  std::string shapeText(size_t input) const {
    return dloss::shapeText(shape(input), !fullShape(input));
  }
};

/// A new record of this rank's call: the header (status Ok) and one slot
/// per input (dtype, dims, device, sizes), up to the record's capacity.
std::vector<int64_t> newRecord(const PlanFile &plan, const std::string &name,
                               const std::vector<at::Tensor> &inputs,
                               bool check, int64_t schedule,
                               int64_t collectiveSeq);

/// The device a call of `function` computes on: that of its first tensor
/// input (the preflight rejects a call whose tensor inputs differ), the CPU
/// for a call with none. Kernels make the tensors a plan creates (arange,
/// constants, indices cast to tensors) there.
at::Device callDevice(const plan::Function &function,
                      const std::vector<at::Tensor> &inputs);

/// The FNV-1a hash of a function name: stable across processes and builds,
/// unlike std::hash.
int64_t hashName(const std::string &name);
/// The name stored in a record's Name0.. words, "..." when cut short.
std::string unpackName(const int64_t *words);

inline c10::DeviceType deviceTypeOf(int64_t code) {
  return static_cast<c10::DeviceType>(code / kDeviceIndexes);
}

} // namespace dloss::preflight

#endif // DLOSS_RUNTIME_EXEC_PREFLIGHTRECORD_H
