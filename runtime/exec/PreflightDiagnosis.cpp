// The preflight's diagnosis: a failed record in words, and the hint.
#include "runtime/exec/PreflightDiagnosis.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/DTypes.h"

#include <algorithm>
#include <utility>

namespace dloss::preflight {

using namespace exec;

namespace {

std::string typeString(const plan::TypeInfo &type) {
  if (type.kind() == plan::RegisterKind::index)
    return "index (a 0-d i64 tensor)";
  std::vector<int64_t> shape;
  if (type.shape())
    shape.assign(type.shape()->begin(), type.shape()->end());
  return dtypeName(type.dtype()) + " " + shapeText(shape);
}

std::string dtypeText(int64_t code) {
  if (code == kForeignDType)
    return "a dtype plans do not support";
  if (code < static_cast<int64_t>(plan::DType::MIN) ||
      code > static_cast<int64_t>(plan::DType::MAX))
    return "an unknown dtype";
  return dtypeName(static_cast<plan::DType>(code));
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

const char *supportedDevices() {
#ifdef DLOSS_HAVE_CUDA
  return "it computes on the CPU and on CUDA GPUs";
#else
  return "this runtime was built without CUDA and computes on the CPU only";
#endif
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

} // namespace

std::string hex(int64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%016llx",
                static_cast<unsigned long long>(value));
  return buffer;
}

std::string deviceTypeText(int64_t code) {
  try {
    return c10::DeviceTypeName(deviceTypeOf(code), true);
  } catch (const std::exception &) {
    return "an unknown device";
  }
}

/// What a rank did wrong, from its record: the same text on every rank,
/// since all of them hold the same plan (checked before this is called).
std::string describeFailure(const Record &record, const std::string &name,
                            const PlanFile &plan,
                            const plan::Function *function,
                            const std::vector<IndexUse> &indexUses) {
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
    for (const IndexUse &use : indexUses)
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

} // namespace dloss::preflight
