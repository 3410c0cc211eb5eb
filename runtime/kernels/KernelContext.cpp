// The checked operand accessors of KernelContext: a register of the wrong kind
// is a plan bug.
#include "runtime/kernels/KernelContext.h"

#include "runtime/support/Error.h"

namespace dloss {

const at::Tensor &KernelContext::tensor(size_t i) const {
  const Value &value = operand(i);
  if (!value.isTensor())
    fail("operand " + std::to_string(i) + " must be a tensor, but holds " +
             (value.isIndex() ? "an index" : "no value"),
         kPlanBugHint);
  return value.tensor();
}

int64_t KernelContext::index(size_t i) const {
  const Value &value = operand(i);
  if (!value.isIndex())
    fail("operand " + std::to_string(i) + " must be an index, but holds " +
             (value.isTensor() ? "a tensor" : "no value"),
         kPlanBugHint);
  return value.index();
}

} // namespace dloss
