// A collective refused by a layer between dloss and the group's backend
// (Refusal.h).
#include "runtime/comm/Refusal.h"

#include <utility>

namespace dloss::comm {

namespace {
thread_local std::optional<ErrorInfo> refusal;
} // namespace

void refuseCollective(ErrorInfo error) { refusal = std::move(error); }

std::optional<ErrorInfo> takeRefusal() {
  std::optional<ErrorInfo> out = std::move(refusal);
  refusal.reset();
  return out;
}

} // namespace dloss::comm
