// The preflight: before each call, the ranks compare plan, function, inputs and
// progress in one collective and fail alike.
#include "runtime/exec/Executor.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/fused/Epilogue.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace dloss {

using namespace exec;

namespace {

/// Identifies the preflight layout, so that runtimes of different versions
/// report the difference instead of misreading each other ("DLPF" v3).
constexpr int64_t kPreflightMagic = 0x444c504600000003;

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
constexpr size_t kNameWords = 4;
static_assert(Name0 + kNameWords == Executor::kPreflightHeader,
              "header layout and length disagree");

// Input slot fields, then the sizes.
enum SlotField : size_t { SlotDType = 0, SlotNDim, SlotDevice };
static_assert(SlotDevice + 1 == Executor::kPreflightSlotFields,
              "slot layout and length disagree");
constexpr size_t kSlotLength =
    Executor::kPreflightSlotFields + Executor::kPreflightDims;
constexpr int64_t kUndefinedDType = -1;
constexpr int64_t kForeignDType = -2; // a dtype plans cannot name (complex)
// A device as one integer: type * kDeviceIndexes + index + 1 (index -1: none).
constexpr int64_t kDeviceIndexes = 1 << 16;

// FNV-1a: stable across processes and builds, unlike std::hash.
int64_t hashName(const std::string &name) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  int64_t out;
  std::memcpy(&out, &hash, sizeof(out));
  return out;
}

void packName(const std::string &name, int64_t *words) {
  char bytes[kNameWords * 8] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), sizeof(bytes)));
  std::memcpy(words, bytes, sizeof(bytes));
}

std::string unpackName(const int64_t *words) {
  char bytes[kNameWords * 8 + 1] = {};
  std::memcpy(bytes, words, kNameWords * 8);
  std::string name(bytes);
  return name.size() == kNameWords * 8 ? name + "..." : name;
}

std::string hex(int64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%016llx",
                static_cast<unsigned long long>(value));
  return buffer;
}

std::string typeString(const plan::TypeInfo &type) {
  if (type.kind() == plan::RegisterKind::index)
    return "index (a 0-d i64 tensor)";
  std::vector<int64_t> shape;
  if (type.shape())
    shape.assign(type.shape()->begin(), type.shape()->end());
  return dtypeName(type.dtype()) + " " + shapeText(shape);
}

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

std::string dtypeText(int64_t code) {
  if (code == kForeignDType)
    return "a dtype plans do not support";
  if (code < static_cast<int64_t>(plan::DType::MIN) ||
      code > static_cast<int64_t>(plan::DType::MAX))
    return "an unknown dtype";
  return dtypeName(static_cast<plan::DType>(code));
}

int64_t deviceCode(const at::Device &device) {
  return static_cast<int64_t>(device.type()) * kDeviceIndexes +
         (static_cast<int64_t>(device.index()) + 1);
}

c10::DeviceType deviceTypeOf(int64_t code) {
  return static_cast<c10::DeviceType>(code / kDeviceIndexes);
}

/// "cpu", "cuda:1", "meta": as torch spells the device.
std::string deviceText(int64_t code) {
  if (code < 0)
    return "an unknown device";
  try {
    std::string text = c10::DeviceTypeName(deviceTypeOf(code), true);
    int64_t index = code % kDeviceIndexes - 1;
    return index >= 0 ? text + ":" + std::to_string(index) : text;
  } catch (const std::exception &) {
    return "an unknown device";
  }
}

std::string deviceTypeText(int64_t code) {
  try {
    return c10::DeviceTypeName(deviceTypeOf(code), true);
  } catch (const std::exception &) {
    return "an unknown device";
  }
}

/// Whether this runtime computes on `device`: the CPU, and CUDA GPUs when
/// it was built with CUDA (the fused kernels' GPU tiles).
bool computesOn(const at::Device &device) {
  if (device.is_cpu())
    return true;
#ifdef DLOSS_HAVE_CUDA
  if (device.is_cuda())
    return true;
#endif
  return false;
}

const char *supportedDevices() {
#ifdef DLOSS_HAVE_CUDA
  return "it computes on the CPU and on CUDA GPUs";
#else
  return "this runtime was built without CUDA and computes on the CPU only";
#endif
}

/// A use of an argument as the indices of an op that picks one element per
/// row (take_along, put_along, cross_entropy) along a dimension whose size
/// the plan knows statically (ArcFace's classes). The preflight checks the
/// range, so that a bad label fails every rank in the same call instead of
/// one rank's kernel, with its peers left waiting at their next collective.
struct IndexUse {
  size_t argument;
  int64_t size;
  int64_t axis;
  std::string op;
  std::string loc;
};

/// The ops that index a dimension of operand `data` with operand `indices`
/// along their `axis` attribute.
struct IndexingOp {
  const char *name;
  uint32_t data;
  uint32_t indices;
};
constexpr IndexingOp kIndexingOps[] = {
    {"dloss.take_along", 0, 1},
    {"dloss.put_along", 0, 1},
    {"dloss.cross_entropy", 0, 1},
};

std::optional<int64_t> integerAttr(const plan::Step &step, const char *name) {
  if (!step.attrs())
    return std::nullopt;
  for (const plan::Attr *attr : *step.attrs())
    if (attr->name()->str() == name && attr->kind() == plan::AttrKind::integer)
      return attr->i();
  return std::nullopt;
}

const flatbuffers::Vector<int64_t> *integersAttr(const plan::Step &step,
                                                 const char *name) {
  if (!step.attrs())
    return nullptr;
  for (const plan::Attr *attr : *step.attrs())
    if (attr->name()->str() == name && attr->kind() == plan::AttrKind::integers)
      return attr->ints();
  return nullptr;
}

/// The operands of dloss.fused_similarity (tiled over a local class
/// matrix) that its program compares with the column index: targets, whose
/// values must be class indices (runtime/fused/Epilogue.h's encoding: `eq`
/// of a `col_id` and a `row k`, operand 2 + k). A target out of range
/// would match no class and silently pick nothing.
std::vector<uint32_t> classTargets(const plan::Step &step) {
  std::vector<uint32_t> targets;
  const auto *program = integersAttr(step, "program");
  std::optional<int64_t> rowLeaves = integerAttr(step, "row_leaves");
  if (!program || !rowLeaves || integerAttr(step, "gathered") ||
      integerAttr(step, "sharded"))
    return targets;
  using Op = epilogue::Op;
  auto opAt = [&](int64_t reg) {
    return 4 * reg + 3 < static_cast<int64_t>(program->size())
               ? static_cast<Op>(program->Get(4 * reg))
               : Op::Sim;
  };
  for (uint32_t t = 0; 4 * t + 3 < program->size(); ++t) {
    if (static_cast<Op>(program->Get(4 * t)) != Op::Eq)
      continue;
    int64_t a = program->Get(4 * t + 1), b = program->Get(4 * t + 2);
    if (opAt(a) == Op::RowLeaf)
      std::swap(a, b);
    if (opAt(a) != Op::ColId || opAt(b) != Op::RowLeaf)
      continue;
    int64_t leaf = program->Get(4 * b + 1);
    if (leaf >= 0 && leaf < *rowLeaves)
      targets.push_back(2 + static_cast<uint32_t>(leaf));
  }
  return targets;
}

/// Every argument that indexes a statically sized dimension, with the
/// smallest such size (the bound its values must respect), in argument
/// order. Register types come from the arguments and the steps'
/// result_types; a register overwritten by a step no longer holds its
/// argument.
std::vector<IndexUse> indexUses(const plan::Function &function) {
  std::vector<IndexUse> uses;
  int32_t numRegisters = function.num_registers();
  if (numRegisters <= 0 || !function.steps())
    return uses;
  size_t numArgs =
      std::min(numArguments(function), static_cast<size_t>(numRegisters));
  std::vector<const plan::TypeInfo *> types(numRegisters, nullptr);
  std::vector<bool> holdsArgument(numRegisters, false);
  for (size_t i = 0; i < numArgs; ++i) {
    types[i] = function.arguments()->Get(i)->type();
    holdsArgument[i] = true;
  }
  auto valid = [numRegisters](int32_t reg) {
    return reg >= 0 && reg < numRegisters;
  };
  for (const plan::Step *step : *function.steps()) {
    std::string op = step->op()->str();
    const IndexingOp *rule = nullptr;
    for (const IndexingOp &candidate : kIndexingOps)
      if (op == candidate.name)
        rule = &candidate;
    const auto *operands = step->operands();
    // The general op's class targets index axis 0 of its class matrix.
    std::vector<IndexingOp> rules;
    if (rule)
      rules.push_back(*rule);
    if (op == "dloss.fused_similarity")
      for (uint32_t target : classTargets(*step))
        rules.push_back({"dloss.fused_similarity", 1, target});
    for (const IndexingOp &each : rules) {
      rule = &each;
      if (!operands || operands->size() <= rule->indices ||
          operands->size() <= rule->data)
        continue;
      int32_t data = operands->Get(rule->data);
      int32_t indices = operands->Get(rule->indices);
      std::optional<int64_t> axis = op == "dloss.fused_similarity"
                                        ? std::optional<int64_t>(0)
                                        : integerAttr(*step, "axis");
      const plan::TypeInfo *type = valid(data) ? types[data] : nullptr;
      if (valid(indices) && holdsArgument[indices] && axis && type &&
          type->kind() == plan::RegisterKind::tensor && type->shape()) {
        int64_t rank = type->shape()->size();
        int64_t a = *axis < 0 ? *axis + rank : *axis;
        if (a >= 0 && a < rank && type->shape()->Get(a) >= 0) {
          int64_t size = type->shape()->Get(a);
          auto same = std::find_if(uses.begin(), uses.end(), [&](auto &u) {
            return u.argument == static_cast<size_t>(indices);
          });
          IndexUse use{static_cast<size_t>(indices), size, a, op,
                       step->loc() ? step->loc()->str() : ""};
          if (same == uses.end())
            uses.push_back(std::move(use));
          else if (size < same->size)
            *same = std::move(use);
        }
      }
    }
    if (step->results()) {
      const auto *resultTypes = step->result_types();
      for (unsigned k = 0; k < step->results()->size(); ++k) {
        int32_t reg = step->results()->Get(k);
        if (!valid(reg))
          continue;
        types[reg] = resultTypes && k < resultTypes->size()
                         ? resultTypes->Get(k)
                         : nullptr;
        holdsArgument[reg] = false;
      }
    }
  }
  std::sort(uses.begin(), uses.end(),
            [](auto &a, auto &b) { return a.argument < b.argument; });
  return uses;
}

/// "[3]" or "[1, 2]": the position of flat element `flat` of `shape`.
std::string positionText(const std::vector<int64_t> &shape, int64_t flat) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] > 0) {
      index[d] = flat % shape[d];
      flat /= shape[d];
    }
  }
  std::string text = "[";
  for (size_t d = 0; d < index.size(); ++d)
    text += (d ? ", " : "") + std::to_string(index[d]);
  return text + "]";
}

bool isGradientFunction(const plan::Function &function) {
  return function.gradient_of() && function.gradient_of()->size();
}

bool isDifferentiated(const plan::Function &function, size_t i) {
  if (!function.grad_arguments())
    return false;
  for (int32_t argument : *function.grad_arguments())
    if (argument == static_cast<int32_t>(i))
      return true;
  return false;
}

/// This rank's record, and its local validation of `inputs` against
/// `function` (nullptr: the plan has no such function). Never throws on bad
/// input: a rank must reach the preflight collective whatever it was given.
/// When checking an input raises (it should not), the record says so and
/// `localError` holds the reason.
std::vector<int64_t> localRecord(const PlanFile &plan, const std::string &name,
                                 const plan::Function *function,
                                 const std::vector<at::Tensor> &inputs,
                                 bool check, int64_t collectiveSeq,
                                 std::string &localError) {
  std::vector<int64_t> record(Executor::kPreflightLength, -1);
  record[Magic] = kPreflightMagic;
  record[Fingerprint] = bitcastSigned(plan.fingerprint());
  record[FunctionHash] = hashName(name);
  record[Status] = Ok;
  record[StatusArgument] = -1;
  record[InputCount] = static_cast<int64_t>(inputs.size());
  record[CollectiveSeq] = collectiveSeq;
  record[CheckMode] = check ? 1 : 0;
  record[Detail0] = 0;
  record[Detail1] = 0;
  record[Detail2] = 0;
  packName(name, &record[Name0]);
  for (size_t i = 0; i < inputs.size() && i < Executor::kPreflightArgs; ++i) {
    int64_t *slot =
        record.data() + Executor::kPreflightHeader + i * kSlotLength;
    const at::Tensor &input = inputs[i];
    if (!input.defined()) {
      slot[SlotDType] = kUndefinedDType;
      slot[SlotNDim] = 0;
      continue;
    }
    std::optional<plan::DType> dtype = toPlanDType(input.scalar_type());
    slot[SlotDType] = dtype ? static_cast<int64_t>(*dtype) : kForeignDType;
    slot[SlotNDim] = input.dim();
    slot[SlotDevice] = deviceCode(input.device());
    for (int64_t d = 0;
         d < input.dim() && d < static_cast<int64_t>(Executor::kPreflightDims);
         ++d)
      slot[Executor::kPreflightSlotFields + d] = input.size(d);
  }

  auto reject = [&record](PreflightStatus status, int64_t argument) {
    record[Status] = status;
    record[StatusArgument] = argument;
    return record;
  };
  if (!function)
    return reject(UnknownFunction, -1);
  if (inputs.size() != numArguments(*function))
    return reject(WrongInputCount, -1);
  auto isTensor = [function](size_t i) {
    return function->arguments()->Get(i)->type()->kind() ==
           plan::RegisterKind::tensor;
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined())
      return reject(UndefinedInput, i);
  // Devices before anything reads a value: a meta tensor has none.
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!computesOn(inputs[i].device()))
      return reject(UnsupportedDevice, i);
  std::optional<at::Device> device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!isTensor(i))
      continue; // an index is read on the host, wherever it lives
    if (!device)
      device = inputs[i].device();
    else if (inputs[i].device() != *device)
      return reject(MixedDevices, i);
  }
  if (isGradientFunction(*function))
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad() && !isDifferentiated(*function, i))
        return reject(RequiresGrad, i);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &input = inputs[i];
    const plan::TypeInfo &type = *function->arguments()->Get(i)->type();
    if (type.kind() == plan::RegisterKind::index) {
      if (input.scalar_type() != at::kLong)
        return reject(WrongDType, i);
      if (input.dim() != 0)
        return reject(WrongRank, i);
      continue;
    }
    if (input.scalar_type() != toScalarType(type.dtype()))
      return reject(WrongDType, i);
    size_t rank = type.shape() ? type.shape()->size() : 0;
    if (static_cast<size_t>(input.dim()) != rank)
      return reject(WrongRank, i);
    for (size_t d = 0; d < rank; ++d) {
      int64_t expected = type.shape()->Get(d);
      if (expected >= 0 && input.size(d) != expected)
        return reject(WrongStaticDim, i);
    }
  }
  // Reading values (index ranges, check mode) may raise only on a broken
  // tensor; the rank must still reach the collective.
  size_t current = 0;
  try {
    for (const IndexUse &use : indexUses(*function)) {
      current = use.argument;
      const at::Tensor &input = inputs[use.argument];
      if (!at::isIntegralType(input.scalar_type(), /*includeBool=*/false) ||
          input.numel() == 0)
        continue;
      at::Tensor outside = at::logical_or(input < 0, input >= use.size);
      if (!outside.any().item<bool>())
        continue;
      int64_t flat = outside.reshape({-1}).nonzero()[0][0].item<int64_t>();
      record[Detail0] = input.reshape({-1})[flat].item<int64_t>();
      record[Detail1] = flat;
      record[Detail2] = use.size;
      return reject(IndexOutOfRange, use.argument);
    }
    if (check) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        current = i;
        const at::Tensor &input = inputs[i];
        if (!at::isFloatingType(input.scalar_type()) || input.numel() == 0)
          continue;
        int64_t nans = at::isnan(input).sum().item<int64_t>();
        int64_t infs = at::isinf(input).sum().item<int64_t>();
        if (nans || infs) {
          record[Detail0] = nans;
          record[Detail1] = infs;
          return reject(NonFinite, i);
        }
      }
    }
  } catch (const c10::Error &error) {
    localError = error.what_without_backtrace();
    return reject(ValidationFailed, current);
  } catch (const std::exception &error) {
    localError = error.what();
    return reject(ValidationFailed, current);
  }
  return record;
}

/// What a rank did wrong, from its record: the same text on every rank,
/// since all of them hold the same plan (checked before this is called).
std::string describeFailure(const Record &record, const std::string &name,
                            const PlanFile &plan,
                            const plan::Function *function) {
  int64_t status = record[Status];
  if (status == UnknownFunction) {
    std::string known;
    for (const std::string &candidate : plan.functionNames())
      known += (known.empty() ? "@" : ", @") + candidate;
    return "called @" + name + ", which the plan does not have (it has " +
           (known.empty() ? std::string("no functions") : known) + ")";
  }
  if (status == WrongInputCount) {
    std::string names;
    for (size_t i = 0; i < numArguments(*function); ++i)
      names += (i ? ", " : "") + inputName(*function, i);
    return "passed " + std::to_string(record[InputCount]) + " inputs to @" +
           name + ", which takes " + std::to_string(numArguments(*function)) +
           " (" + names + ")";
  }
  size_t i = static_cast<size_t>(record[StatusArgument]);
  std::string argument = argumentName(*function, i);
  const plan::TypeInfo &type = *function->arguments()->Get(i)->type();
  // Inputs past the record's capacity were validated locally only.
  std::string actual = "a tensor of another type";
  if (record.recorded(i))
    actual = dtypeText(record.dtype(i)) + " " + record.shapeText(i);
  std::string device =
      record.recorded(i) ? deviceText(record.device(i)) : "another device";
  switch (status) {
  case UndefinedInput:
    return "passed no tensor for " + argument +
           " (undefined, or it could not be loaded: that rank's own message "
           "says why)";
  case UnsupportedDevice:
    if (record.recorded(i) &&
        deviceTypeOf(record.device(i)) == c10::DeviceType::CUDA)
      return "passed " + argument + " on " + device +
             ", but this dloss runtime was built without CUDA";
    return "passed " + argument + " on " + device +
           ", a device dloss does not compute on (" + supportedDevices() + ")";
  case MixedDevices: {
    // Every recorded tensor input, grouped by device.
    std::vector<std::pair<int64_t, std::string>> groups;
    for (size_t k = 0; k < numArguments(*function); ++k) {
      if (!record.recorded(k) ||
          function->arguments()->Get(k)->type()->kind() !=
              plan::RegisterKind::tensor)
        continue;
      auto it = std::find_if(groups.begin(), groups.end(), [&](auto &g) {
        return g.first == record.device(k);
      });
      if (it == groups.end())
        groups.push_back({record.device(k), inputName(*function, k)});
      else
        it->second += ", " + inputName(*function, k);
    }
    std::string where;
    for (size_t g = 0; g < groups.size(); ++g)
      where += std::string(g ? (g + 1 == groups.size() ? " and " : ", ") : "") +
               groups[g].second + " on " + deviceText(groups[g].first);
    return "passed the inputs of one call on different devices: " +
           (where.empty() ? argument + " on " + device : where);
  }
  case RequiresGrad: {
    std::string loss = function->gradient_of()->str();
    std::string differentiated;
    if (function->grad_arguments())
      for (int32_t k : *function->grad_arguments())
        differentiated +=
            (differentiated.empty() ? "" : ", ") + inputName(*function, k);
    std::string text =
        "passed " + argument + " as " + actual + " requiring grad, but @" +
        loss + " is not differentiated with respect to it (" +
        (differentiated.empty() ? std::string("nor any input")
                                : "only with respect to " + differentiated) +
        "): no gradient would reach it";
    if (record.recorded(i) &&
        (type.kind() != plan::RegisterKind::tensor ||
         record.dtype(i) != static_cast<int64_t>(type.dtype())))
      text += "; @" + loss + " also expects it as " + typeString(type);
    return text;
  }
  case WrongDType:
    return "passed " + argument + " as " + actual + ", expected " +
           typeString(type);
  case WrongRank:
    return "passed " + argument + " with " + std::to_string(record.ndim(i)) +
           " dims " + record.shapeText(i) + ", expected " + typeString(type);
  case WrongStaticDim:
    return "passed " + argument + " of shape " + record.shapeText(i) +
           ", expected " + typeString(type);
  case IndexOutOfRange: {
    int64_t size = record[Detail2];
    std::string text = "passed " + argument + " with value " +
                       std::to_string(record[Detail0]) + " at " +
                       (record.recorded(i) && record.fullShape(i)
                            ? positionText(record.shape(i), record[Detail1])
                            : "element " + std::to_string(record[Detail1])) +
                       ", outside [0, " + std::to_string(size) + ")";
    for (const IndexUse &use : indexUses(*function))
      if (use.argument == i && use.size == size)
        text += ": it indexes axis " + std::to_string(use.axis) + " (size " +
                std::to_string(size) + ") of " + use.op +
                (use.loc.empty() ? "" : " at " + use.loc);
    return text;
  }
  case NonFinite: {
    std::string counts;
    if (record[Detail0])
      counts = std::to_string(record[Detail0]) + " NaN";
    if (record[Detail1])
      counts += (counts.empty() ? "" : " and ") +
                std::to_string(record[Detail1]) + " infinite";
    return "passed " + argument + " with " + counts +
           (record[Detail0] + record[Detail1] == 1 ? " value" : " values");
  }
  case ValidationFailed:
    return "could not check " + argument +
           " (reading it raised an error: that rank's own message says why)";
  default:
    return "reported the unknown preflight status " + std::to_string(status);
  }
}

/// What to do about the failures, when they are all of one kind.
std::string failureHint(const std::vector<int64_t> &statuses) {
  bool alike = std::all_of(statuses.begin(), statuses.end(),
                           [&](int64_t s) { return s == statuses.front(); });
  if (!statuses.empty() && alike) {
    switch (statuses.front()) {
    case NonFinite:
      return "Check mode (DLOSS_CHECK=1) rejects NaN and infinite inputs: "
             "find where those ranks' values stop being finite (a bad "
             "sample, an overflow or a division by zero upstream), or turn "
             "check mode off";
    case UnsupportedDevice:
#ifdef DLOSS_HAVE_CUDA
      return "Pass CPU or CUDA tensors";
#else
      return "Pass CPU tensors (x.cpu()), or rebuild dloss where CUDA is "
             "found (/usr/local/cuda, -DDLOSS_ENABLE_CUDA=ON) to pass GPU "
             "tensors";
#endif
    case MixedDevices:
      return "Move every input of the call to one device (x.to(device))";
    case RequiresGrad:
      return "Pass the input detached (x.detach()) if it needs no gradient "
             "(labels never do); if it needs one, declare it with dloss.grad "
             "(grad=True in dloss.Graph.input)";
    case IndexOutOfRange:
      return "Indices (labels, targets) must lie in [0, size): check the "
             "labels those ranks passed and the loss's number of classes";
    default:
      break;
    }
  }
  return "Pass every rank inputs of the function's argument types (? marks "
         "a size that may vary)";
}

/// "f32, i64, f32": the dtypes of a rank's recorded inputs.
std::string dtypesText(const Record &record) {
  std::string text;
  for (size_t i = 0; record.recorded(i); ++i)
    text += (i ? ", " : "") + (record.dtype(i) == kUndefinedDType
                                   ? std::string("none")
                                   : dtypeText(record.dtype(i)));
  return text;
}

} // namespace

Executor::RankShapes
Executor::preflight(const std::string &name, const BoundFunction *bound,
                    const std::vector<at::Tensor> &inputs) {
  const plan::Function *function = bound ? bound->function : nullptr;
  std::string localError;
  std::vector<int64_t> mine =
      localRecord(*plan, name, function, inputs, opts.check,
                  comm.collectivesStarted(), localError);
  std::vector<int64_t> all = comm.allGatherInts(mine);
  int worldSize = comm.worldSize();
  if (all.size() != kPreflightLength * static_cast<size_t>(worldSize))
    throw Error("the preflight exchange returned " +
                    std::to_string(all.size()) + " values, expected " +
                    std::to_string(kPreflightLength * worldSize),
                "Report a bug in the communicator");
  auto record = [&all](int r) {
    return Record{all.data() + static_cast<size_t>(r) * kPreflightLength};
  };
  // Until the ranks are known to call the same function, the message must
  // not start with this rank's own function name: it would differ by rank.
  auto raiseAnonymous = [](const std::string &problem,
                           const std::string &hint) {
    return Error("preflight: " + problem, hint);
  };
  auto raise = [&name](const std::string &problem, const std::string &hint) {
    return Error("preflight of @" + name + ": " + problem, hint);
  };

  // Checked in order: a later check is only meaningful once the earlier
  // ones agree (the same plan, then the same function).
  auto byMagic =
      groupRanks<int64_t>(worldSize, [&](int r) { return record(r)[Magic]; });
  if (byMagic.size() > 1) {
    std::string problem = "ranks run different dloss runtime versions:";
    for (const auto &group : byMagic)
      problem += " " + rankList(group.second) + " preflight format " +
                 hex(group.first) + ";";
    problem.pop_back();
    throw raiseAnonymous(problem, "Install the same dloss on every rank");
  }

  if (groupRanks<int64_t>(worldSize, [&](int r) {
        return record(r)[Fingerprint];
      }).size() > 1) {
    // A loss compiled per input dtype (the drop-ins) gives a rank that
    // passed another dtype another plan: say so, it is the likely cause.
    bool sameName = groupRanks<std::string>(worldSize, [&](int r) {
                      return unpackName(&record(r).values[Name0]);
                    }).size() == 1;
    bool dtypesDiffer =
        sameName && groupRanks<std::string>(worldSize, [&](int r) {
                      return dtypesText(record(r));
                    }).size() > 1;
    using PlanKey = std::tuple<int64_t, std::string, std::string>;
    auto byPlan = groupRanks<PlanKey>(worldSize, [&](int r) {
      return PlanKey(record(r)[Fingerprint],
                     unpackName(&record(r).values[Name0]),
                     dtypesDiffer ? dtypesText(record(r)) : "");
    });
    std::string problem = "ranks ran different plans:";
    for (size_t g = 0; g < byPlan.size(); ++g) {
      const auto &[fingerprint, called, dtypes] = byPlan[g].first;
      problem += std::string(g ? "," : "") + " " + rankList(byPlan[g].second) +
                 " called @" + called + " of plan fingerprint " +
                 hex(fingerprint);
      if (dtypesDiffer)
        problem += " with inputs of dtypes (" + dtypes + ")";
    }
    throw raiseAnonymous(
        problem,
        dtypesDiffer
            ? "The ranks passed inputs of different dtypes, and a loss is "
              "compiled once per input dtype (the drop-in losses do so): "
              "pass the same dtypes on every rank (x.float(), say)"
            : "Every rank must call the same compiled losses in the same "
              "order: if the ranks hold several, they call them in a "
              "different order (or one rank skipped a call); otherwise "
              "compile the loss once and load the same .plan file on every "
              "rank");
  }

  auto byFunction = groupRanks<int64_t>(
      worldSize, [&](int r) { return record(r)[FunctionHash]; });
  if (byFunction.size() > 1) {
    // Every rank holds the same plan, so each can name the others' calls.
    std::map<int64_t, std::string> names;
    for (const std::string &candidate : plan->functionNames())
      names[hashName(candidate)] = "@" + candidate;
    std::string problem = "ranks called different functions:";
    for (size_t g = 0; g < byFunction.size(); ++g) {
      auto it = names.find(byFunction[g].first);
      problem +=
          std::string(g ? "," : "") + " " + rankList(byFunction[g].second) +
          " called " +
          (it != names.end()
               ? it->second
               : "@" +
                     unpackName(
                         &record(byFunction[g].second.front()).values[Name0]) +
                     ", which the plan does not have");
    }
    throw raiseAnonymous(
        problem, "Every rank must run the same functions in the same order");
  }

  // The same number of earlier collectives: a rank that skipped a call (or
  // made extra ones) would otherwise meet its peers' next call silently,
  // every collective off by one call.
  bool counted = true;
  for (int r = 0; r < worldSize; ++r)
    counted &= record(r)[CollectiveSeq] >= 0;
  if (counted) {
    auto bySeq = groupRanks<int64_t>(
        worldSize, [&](int r) { return record(r)[CollectiveSeq]; });
    if (bySeq.size() > 1) {
      size_t best = majority(bySeq);
      std::string problem;
      for (size_t g = 0; g < bySeq.size(); ++g) {
        if (g == best)
          continue;
        problem += (problem.empty() ? "" : "; ") + rankList(bySeq[g].second) +
                   " made " + std::to_string(bySeq[g].first) +
                   " collective calls before this one, " +
                   rankList(bySeq[best].second) + " made " +
                   std::to_string(bySeq[best].first);
      }
      throw raise(problem +
                      ": the ranks' calls are out of step (a rank skipped a "
                      "call, or made one the others did not)",
                  "Every rank must make the same dloss calls in the same "
                  "order: look for a call made under a rank-dependent "
                  "condition (if rank == 0), an early return, or a caught "
                  "error on the ranks named");
    }
  }

  auto byCheck = groupRanks<int64_t>(
      worldSize, [&](int r) { return record(r)[CheckMode]; });
  if (byCheck.size() > 1) {
    std::string problem = "ranks run with different check modes:";
    for (size_t g = 0; g < byCheck.size(); ++g)
      problem += std::string(g ? "," : "") + " " + rankList(byCheck[g].second) +
                 " with checks " + (byCheck[g].first ? "on" : "off");
    throw raise(problem, "Set DLOSS_CHECK (or ExecutorOptions::check) alike "
                         "on every rank");
  }

  auto byFailure = groupRanks<std::string>(worldSize, [&](int r) {
    Record rec = record(r);
    return rec[Status] == Ok ? std::string()
                             : describeFailure(rec, name, *plan, function);
  });
  std::string failures;
  std::vector<int64_t> statuses;
  for (int r = 0; r < worldSize; ++r)
    if (record(r)[Status] != Ok)
      statuses.push_back(record(r)[Status]);
  for (const auto &group : byFailure)
    if (!group.first.empty())
      failures += (failures.empty() ? "" : "; ") + rankList(group.second) +
                  " " + group.first;
  if (!failures.empty()) {
    // Only the rank whose own check raised knows why; it adds the reason.
    if (!localError.empty())
      failures +=
          " (on rank " + std::to_string(comm.rank()) + ": " + localError + ")";
    throw raise(failures, failureHint(statuses));
  }

  // Every rank computes on the same kind of device (each may use its own
  // GPU): a CPU rank among GPU ranks would fail alone in its first
  // collective, its peers waiting for it.
  auto byDeviceType = groupRanks<std::string>(worldSize, [&](int r) {
    for (size_t i = 0; i < numArguments(*function); ++i)
      if (record(r).recorded(i) &&
          function->arguments()->Get(i)->type()->kind() ==
              plan::RegisterKind::tensor)
        return deviceTypeText(record(r).device(i));
    return std::string();
  });
  if (byDeviceType.size() > 1) {
    std::string problem;
    for (size_t g = 0; g < byDeviceType.size(); ++g)
      problem +=
          std::string(g ? ", " : "") + rankList(byDeviceType[g].second) +
          " passed " +
          (byDeviceType[g].first.empty() ? std::string("no tensors")
                                         : byDeviceType[g].first + " tensors");
    throw raise("ranks compute on different kinds of device: " + problem,
                "Pass every rank's inputs on the same kind of device: CPU "
                "tensors everywhere (Gloo), or one GPU per rank (NCCL)");
  }

  // Cross-rank agreement: only the batch dimension (0) of varying arguments
  // may differ; replicated arguments hold the same value everywhere.
  RankShapes shapes(numArguments(*function));
  std::string mismatches;
  bool replicatedMismatch = false;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const plan::Argument *argument = function->arguments()->Get(i);
    if (argument->type()->kind() != plan::RegisterKind::tensor ||
        !record(0).recorded(i) || !record(0).fullShape(i))
      continue;
    bool replicated = argument->replicated();
    auto byShape = groupRanks<std::vector<int64_t>>(worldSize, [&](int r) {
      std::vector<int64_t> shape = record(r).shape(i);
      if (!replicated && !shape.empty())
        shape.erase(shape.begin());
      return shape;
    });
    if (byShape.size() > 1) {
      size_t best = majority(byShape);
      std::string common = record(byShape[best].second.front()).shapeText(i);
      for (size_t g = 0; g < byShape.size(); ++g) {
        if (g == best)
          continue;
        mismatches += (mismatches.empty() ? "" : "; ") +
                      rankList(byShape[g].second) + " passed " +
                      (replicated ? "replicated " : "") +
                      argumentName(*function, i) + " of shape " +
                      record(byShape[g].second.front()).shapeText(i) + ", " +
                      rankList(byShape[best].second) + " " + common;
      }
      replicatedMismatch |= replicated;
      continue;
    }
    for (int r = 0; r < worldSize; ++r)
      shapes[i].push_back(record(r).shape(i));
  }
  if (!mismatches.empty())
    throw raise(mismatches,
                replicatedMismatch
                    ? "A replicated argument must be the same tensor on "
                      "every rank, and other arguments may differ only in "
                      "dimension 0 (the batch)"
                    : "Ranks may differ only in dimension 0 (the batch) of "
                      "an argument");
  return shapes;
}

} // namespace dloss
