// The ops a plan may hold (see OpTable.h); the entries come from the ODS
// definitions.
#include "runtime/kernels/OpTable.h"

#include <algorithm>

namespace dloss {

const std::vector<OpSpec> &opSpecs() {
  static const std::vector<OpSpec> specs = [] {
    std::vector<OpSpec> all = {
#include "runtime/kernels/OpTable.inc"
    };
    std::sort(all.begin(), all.end(),
              [](const OpSpec &a, const OpSpec &b) { return a.name < b.name; });
    return all;
  }();
  return specs;
}

const OpSpec *findOpSpec(const std::string &name) {
  const std::vector<OpSpec> &specs = opSpecs();
  auto it = std::lower_bound(
      specs.begin(), specs.end(), name,
      [](const OpSpec &spec, const std::string &n) { return spec.name < n; });
  return it != specs.end() && it->name == name ? &*it : nullptr;
}

} // namespace dloss
