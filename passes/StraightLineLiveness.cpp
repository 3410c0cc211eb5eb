// Where each value of a straight-line function dies (see
// StraightLineLiveness.h).
#include "passes/StraightLineLiveness.h"

#include "mlir/IR/OpDefinition.h"

using namespace mlir;
using namespace mlir::dloss;

StraightLineLiveness::StraightLineLiveness(Block &body) {
  for (Operation &op : body.without_terminator())
    opList.push_back(&op);
  for (auto [i, op] : llvm::enumerate(opList)) {
    for (Value operand : op->getOperands())
      last[operand] = static_cast<int64_t>(i);
    for (Value result : op->getResults())
      last.try_emplace(result, static_cast<int64_t>(i)); // dead results
  }
  if (Operation *terminator = body.empty() ? nullptr : &body.back())
    if (terminator->hasTrait<OpTrait::IsTerminator>())
      for (Value value : terminator->getOperands())
        last[value] = end();
  dead.resize(opList.size());
  for (auto [value, i] : last)
    if (i >= 0 && i < end())
      dead[i].push_back(value);
}
