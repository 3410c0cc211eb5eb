// Where each value of a straight-line function dies: shared by plan lowering
// (register freeing) and the cost report.
#ifndef DLOSS_PASSES_STRAIGHTLINELIVENESS_H
#define DLOSS_PASSES_STRAIGHTLINELIVENESS_H

#include "mlir/IR/Block.h"
#include "mlir/IR/Value.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <vector>

namespace mlir::dloss {

/// The ops of a one-block body in order (the terminator excluded) and, for
/// every value, the index of the op that last uses it. A result nothing uses
/// dies at its definition; a returned value lives to the end (`end()`); an
/// argument nothing uses has no entry.
class StraightLineLiveness {
public:
  explicit StraightLineLiveness(Block &body);

  ArrayRef<Operation *> ops() const { return opList; }
  int64_t end() const { return static_cast<int64_t>(opList.size()); }
  /// The index of the op that last uses `value`; end() when returned; -1
  /// when it has no entry.
  int64_t lastUse(Value value) const {
    auto it = last.find(value);
    return it == last.end() ? -1 : it->second;
  }
  /// The values that die after op `i` (never a returned value).
  ArrayRef<Value> deadAfter(size_t i) const { return dead[i]; }

private:
  SmallVector<Operation *> opList;
  llvm::DenseMap<Value, int64_t> last;
  std::vector<SmallVector<Value>> dead;
};

} // namespace mlir::dloss

#endif // DLOSS_PASSES_STRAIGHTLINELIVENESS_H
