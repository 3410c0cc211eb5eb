// The preflight's index checks: which arguments index a statically sized
// dimension (from the plan), and whether their values stay inside it.
#include "runtime/exec/PreflightIndices.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/OpTable.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace dloss::preflight {

using exec::numArguments;

namespace {

/// A step's operand `indices` indexing dimension `axis` of operand `data`.
struct IndexingRule {
  uint32_t data;
  uint32_t indices;
  std::optional<int64_t> axis;
};

std::optional<int64_t> integerAttr(const plan::Step &step,
                                   std::string_view name) {
  if (!step.attrs())
    return std::nullopt;
  for (const plan::Attr *attr : *step.attrs())
    if (attr->name()->string_view() == name &&
        attr->kind() == plan::AttrKind::integer)
      return attr->i();
  return std::nullopt;
}

const flatbuffers::Vector<int64_t> *integersAttr(const plan::Step &step,
                                                 std::string_view name) {
  if (!step.attrs())
    return nullptr;
  for (const plan::Attr *attr : *step.attrs())
    if (attr->name()->string_view() == name &&
        attr->kind() == plan::AttrKind::integers)
      return attr->ints();
  return nullptr;
}

/// The operands of dloss.fused_similarity (tiled over a local class
/// matrix) that its program compares with the column index, as the compiler
/// lists them in `class_targets` (runtime/plan/TileEncoding.h; per-row leaf
/// k is operand 2 + k): targets, whose values must be class indices. A
/// target out of range would match no class and silently pick nothing.
std::vector<uint32_t> classTargets(const plan::Step &step) {
  std::vector<uint32_t> targets;
  const auto *leaves = integersAttr(step, "class_targets");
  std::optional<int64_t> rowLeaves = integerAttr(step, "row_leaves");
  if (!leaves || !rowLeaves || integerAttr(step, "gathered") ||
      integerAttr(step, "sharded"))
    return targets;
  for (int64_t leaf : *leaves)
    if (leaf >= 0 && leaf < *rowLeaves) // the kernel refuses the others
      targets.push_back(2 + static_cast<uint32_t>(leaf));
  return targets;
}

} // namespace

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
    const auto *operands = step->operands();
    std::vector<IndexingRule> rules;
    // The ops whose ODS definition marks an index operand
    // (Dloss_IndexOperand), along their `axis` attribute.
    const OpSpec *spec = findOpSpec(op);
    if (spec && spec->index.present())
      rules.push_back({static_cast<uint32_t>(spec->index.data),
                       static_cast<uint32_t>(spec->index.indices),
                       integerAttr(*step, "axis")});
    // The general op's class targets (its `class_targets`, on the forward
    // and the _grad step alike) index axis 0 of its class matrix.
    for (uint32_t target : classTargets(*step))
      rules.push_back({1, target, 0});
    for (const IndexingRule &rule : rules) {
      if (!operands || operands->size() <= rule.indices ||
          operands->size() <= rule.data)
        continue;
      int32_t data = operands->Get(rule.data);
      int32_t indices = operands->Get(rule.indices);
      std::optional<int64_t> axis = rule.axis;
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

std::optional<OutOfRange> firstOutOfRange(const IndexUse &use,
                                          const at::Tensor &input) {
  if (!at::isIntegralType(input.scalar_type(), /*includeBool=*/false) ||
      input.numel() == 0)
    return std::nullopt;
  at::Tensor outside = at::logical_or(input < 0, input >= use.size);
  if (!outside.any().item<bool>())
    return std::nullopt;
  int64_t flat = outside.reshape({-1}).nonzero()[0][0].item<int64_t>();
  return OutOfRange{input.reshape({-1})[flat].item<int64_t>(), flat};
}

} // namespace dloss::preflight
