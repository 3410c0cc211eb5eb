// A plan step's attributes, decoded by name and kind for the kernels that bind
// it.
#ifndef DLOSS_RUNTIME_KERNELS_STEPATTRS_H
#define DLOSS_RUNTIME_KERNELS_STEPATTRS_H

#include "runtime/plan/Plan_generated.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dloss {

/// A step's attributes, looked up by name. Missing or ill-kinded attributes
/// raise dloss::Error saying which attribute and what kind was expected.
class StepAttrs {
public:
  explicit StepAttrs(const plan::Step &step) : step(step) {}

  const plan::Attr *find(const char *name) const;
  bool has(const char *name) const { return find(name) != nullptr; }

  int64_t integer(const char *name) const;
  std::optional<int64_t> optionalInteger(const char *name) const;
  /// A UnitAttr: present (integer 1) or absent.
  bool flag(const char *name) const;
  /// A FloatAttr (an integer is accepted and converted).
  double real(const char *name) const;
  std::optional<double> optionalReal(const char *name) const;
  std::vector<int64_t> integers(const char *name) const;
  std::string text(const char *name) const;
  /// The result element type of ops that choose it (dloss.cast,
  /// dloss.arange): the step's first `result_types` entry, or (in plans
  /// built by hand) attribute `dtype`, text ("f32", "bf16", "i64", "i1", or a
  /// plan DType name) or integer (a plan DType value).
  at::ScalarType resultType() const;

  const plan::Step &raw() const { return step; }

private:
  const plan::Attr &require(const char *name, const char *expected) const;

  const plan::Step &step;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_STEPATTRS_H
