// The preflight's wire record: a rank's call written as int64 values.
#include "runtime/exec/PreflightRecord.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/DTypes.h"

#include <cstring>
#include <optional>

namespace dloss::preflight {

using exec::bitcastSigned;

namespace {

void packName(const std::string &name, int64_t *words) {
  char bytes[kNameWords * 8] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), sizeof(bytes)));
  std::memcpy(words, bytes, sizeof(bytes));
}

int64_t deviceCode(const at::Device &device) {
  return static_cast<int64_t>(device.type()) * kDeviceIndexes +
         (static_cast<int64_t>(device.index()) + 1);
}

} // namespace

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

std::string unpackName(const int64_t *words) {
  char bytes[kNameWords * 8 + 1] = {};
  std::memcpy(bytes, words, kNameWords * 8);
  std::string name(bytes);
  return name.size() == kNameWords * 8 ? name + "..." : name;
}

std::vector<int64_t> newRecord(const PlanFile &plan, const std::string &name,
                               const std::vector<at::Tensor> &inputs,
                               bool check, int64_t schedule,
                               int64_t collectiveSeq) {
  std::vector<int64_t> record(Executor::kPreflightLength, -1);
  record[Magic] = kPreflightMagic;
  record[Fingerprint] = bitcastSigned(plan.fingerprint());
  record[FunctionHash] = hashName(name);
  record[Status] = Ok;
  record[StatusArgument] = -1;
  record[InputCount] = static_cast<int64_t>(inputs.size());
  record[CollectiveSeq] = collectiveSeq;
  record[CheckMode] = check ? 1 : 0;
  record[ScheduleSetting] = schedule;
  record[FoldMask] = 0;
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
  return record;
}

} // namespace dloss::preflight
