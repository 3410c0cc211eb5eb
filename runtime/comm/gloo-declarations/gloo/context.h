// dloss's declarations of Gloo's names
// (runtime/comm/gloo-declarations/README.md).
#pragma once

#include <chrono>

namespace gloo {
/// Held by c10d through std::shared_ptr. ProcessGroupGloo::setTimeout, an
/// inline virtual function, calls setTimeout on each; dloss never calls it,
/// so no reference to it is emitted (the vtable is torch's).
class Context {
public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
