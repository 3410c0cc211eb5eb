// Message helpers of the interpreter, the preflight and check mode: groups of
// ranks that agree, the name of a plan argument.
#ifndef DLOSS_RUNTIME_EXEC_RANKGROUPS_H
#define DLOSS_RUNTIME_EXEC_RANKGROUPS_H

#include "runtime/plan/PlanFile.h"
#include "runtime/plan/Plan_generated.h"
#include "runtime/support/Format.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace dloss::exec {

inline int64_t bitcastSigned(uint64_t value) {
  int64_t out;
  std::memcpy(&out, &value, sizeof(out));
  return out;
}

/// "argument 1 (text)", or "argument 1" when the plan has no name for it:
/// how messages point at an argument.
inline std::string argumentName(const plan::Function &function, size_t i) {
  std::string out = "argument " + std::to_string(i);
  const plan::Argument *argument = function.arguments()->Get(i);
  if (argument->name() && argument->name()->size())
    out += " (" + inputName(function, i) + ")";
  return out;
}

inline size_t numArguments(const plan::Function &function) {
  return function.arguments() ? function.arguments()->size() : 0;
}

/// Partitions ranks by `key`, in order of first appearance.
template <typename Key, typename KeyFn>
std::vector<std::pair<Key, std::vector<int>>> groupRanks(int worldSize,
                                                         KeyFn keyOf) {
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (int r = 0; r < worldSize; ++r) {
    Key key = keyOf(r);
    auto it =
        std::find_if(groups.begin(), groups.end(),
                     [&key](const auto &group) { return group.first == key; });
    if (it == groups.end())
      groups.push_back({key, {r}});
    else
      it->second.push_back(r);
  }
  return groups;
}

/// The group most ranks agree with (ties: the one holding the lowest rank):
/// the others are reported as the odd ones out.
template <typename Group> size_t majority(const std::vector<Group> &groups) {
  size_t best = 0;
  for (size_t g = 1; g < groups.size(); ++g)
    if (groups[g].second.size() > groups[best].second.size())
      best = g;
  return best;
}

} // namespace dloss::exec

#endif // DLOSS_RUNTIME_EXEC_RANKGROUPS_H
