// dloss's declarations of Gloo's names
// (runtime/comm/gloo-declarations/README.md).
#pragma once

namespace gloo::transport {
/// Made by ProcessGroupGloo::createDevice*, held through std::shared_ptr.
class Device;
/// Held by c10d's SendWork and RecvWork through std::unique_ptr.
class UnboundBuffer;
} // namespace gloo::transport
