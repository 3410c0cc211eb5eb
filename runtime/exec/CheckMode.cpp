// Check mode (DLOSS_CHECK): after a global-mode call, replicated gradients
// must agree bit for bit on every rank.
#include "runtime/exec/Executor.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace dloss {

using namespace exec;

ExecutorOptions ExecutorOptions::fromEnvironment() {
  ExecutorOptions options;
  if (const char *value = std::getenv("DLOSS_CHECK")) {
    std::string text = value;
    if (text == "1")
      options.check = true;
    else if (text != "0" && !text.empty())
      throw Error("environment variable DLOSS_CHECK='" + text +
                      "' is malformed: expected 1 or 0",
                  "Set DLOSS_CHECK=1 to turn the runtime's check mode on, or "
                  "unset it");
  }
  // A malformed DLOSS_SCHEDULE is reported here, before any call, not in
  // the middle of one.
  fused::defaultSchedule();
  return options;
}

namespace {

/// The integer type of the same width, to compare floats bit for bit.
at::ScalarType bitsType(at::ScalarType type) {
  switch (c10::elementSize(type)) {
  case 1:
    return at::kByte;
  case 2:
    return at::kShort;
  case 4:
    return at::kInt;
  default:
    return at::kLong;
  }
}

int64_t hashBytes(const at::Tensor &tensor) {
  at::Tensor bytes = tensor.contiguous();
  const auto *data = static_cast<const unsigned char *>(bytes.data_ptr());
  size_t length = bytes.numel() * bytes.element_size();
  uint64_t hash = 14695981039346656037ull;
  for (size_t i = 0; i < length; ++i) {
    hash ^= data[i];
    hash *= 1099511628211ull;
  }
  return bitcastSigned(hash);
}

std::string valueText(const at::Tensor &element) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.9g",
                element.to(at::kDouble).item<double>());
  return buffer;
}

} // namespace

void Executor::checkReplicatedGradients(
    const std::string &name, const plan::Function &function,
    const std::vector<at::Tensor> &results) {
  // Result k (k >= 1) is the gradient of argument grad_arguments[k - 1].
  std::vector<size_t> checked;
  std::vector<int64_t> hashes;
  if (function.grad_arguments())
    for (size_t k = 1;
         k < results.size() && k - 1 < function.grad_arguments()->size(); ++k) {
      int32_t argument = function.grad_arguments()->Get(k - 1);
      if (argument < 0 ||
          static_cast<size_t>(argument) >= numArguments(function) ||
          !function.arguments()->Get(argument)->replicated())
        continue;
      checked.push_back(k);
      hashes.push_back(hashBytes(results[k]));
    }
  if (checked.empty())
    return;
  CallSite site{name, "", "", "gradient check"};
  CallSiteScope scope(site);
  std::vector<int64_t> all = comm.allGatherInts(hashes);
  int worldSize = comm.worldSize();
  for (size_t j = 0; j < checked.size(); ++j) {
    int differing = -1;
    for (int r = 1; r < worldSize && differing < 0; ++r)
      if (all[r * checked.size() + j] != all[j])
        differing = r;
    if (differing < 0)
      continue;
    // Every rank sees the mismatch, so all gather the gradient (a replicated
    // argument's shape is the same everywhere) and name the same element.
    const at::Tensor &gradient = results[checked[j]];
    at::Tensor flat = gradient.contiguous().reshape({1, -1});
    at::Tensor gathered = comm.allGather(
        flat, 0, std::vector<int64_t>(static_cast<size_t>(worldSize), 1));
    at::ScalarType bits = bitsType(gathered.scalar_type());
    at::Tensor reference = gathered[0].view(bits);
    at::Tensor other = gathered[differing].view(bits);
    at::Tensor positions = at::ne(reference, other).nonzero();
    int64_t index = positions.numel() ? positions[0][0].item<int64_t>() : 0;
    auto groups = groupRanks<int64_t>(
        worldSize, [&](int r) { return all[r * checked.size() + j]; });
    std::string agreement;
    for (size_t g = 0; g < groups.size(); ++g)
      agreement += std::string(g ? ", " : "") + rankList(groups[g].second) +
                   (g ? " another" : " one value");
    int32_t argument = function.grad_arguments()->Get(checked[j] - 1);
    throw Error(
        "check mode: @" + name +
            " (global mode) returned different gradients "
            "for replicated " +
            argumentName(function, argument) + " on different ranks: rank " +
            std::to_string(differing) +
            " differs from rank 0 first at element " + std::to_string(index) +
            " (rank 0: " + valueText(gathered[0].reshape({-1})[index]) +
            ", rank " + std::to_string(differing) + ": " +
            valueText(gathered[differing].reshape({-1})[index]) + "); " +
            agreement,
        "In global mode a replicated argument's gradient is all-reduced and "
        "must be bit-identical on every rank: this is a bug in dloss or in "
        "the plan (report it with the plan); in ddp mode such gradients "
        "legitimately differ and are not checked");
  }
}

} // namespace dloss
