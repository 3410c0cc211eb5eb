// dloss's declarations of Gloo's names
// (runtime/comm/gloo-declarations/README.md).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
/// The base of c10d's GlooStore, which overrides these functions. dloss never
/// constructs one: torch's ProcessGroupGloo makes its store itself.
class Store {
public:
  virtual ~Store() = default;
  virtual void set(const std::string &key, const std::vector<char> &data) = 0;
  virtual std::vector<char> get(const std::string &key) = 0;
  virtual void wait(const std::vector<std::string> &keys) = 0;
  virtual void wait(const std::vector<std::string> &keys,
                    const std::chrono::milliseconds &timeout) = 0;
};
} // namespace gloo::rendezvous
