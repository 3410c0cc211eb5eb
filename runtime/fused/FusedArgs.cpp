// The fused steps' shared operand helpers: rank offsets, the similarity
// operands, the gradient results.
#include "runtime/fused/FusedArgs.h"

#include <algorithm>
#include <numeric>

namespace dloss::fused {

int64_t total(const std::vector<int64_t> &sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

int64_t largest(const std::vector<int64_t> &sizes) {
  return *std::max_element(sizes.begin(), sizes.end());
}

int64_t offsetOf(const std::vector<int64_t> &sizes, int rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

Similarity similarityOperands(const FusedArgs &args) {
  at::Tensor rows = args.matrix(0, "rows");
  return {rows, args.matrix(1, args.colsName, rows.size(1)),
          args.scalar(2, "scale")};
}

/// Sets a backward op's results: the gradients of rows and cols (of the
/// types of operands 0 and 1), then those of its 0-d operands 2, 3, ...
/// (this rank's partial gradients, on the operands' device).
void setGradients(KernelContext &ctx, const FusedArgs &args,
                  const at::Tensor &dRows, const at::Tensor &dCols,
                  std::initializer_list<double> scalars) {
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  size_t i = 2;
  for (double value : scalars) {
    ctx.setResult(i, at::scalar_tensor(value, at::TensorOptions(args.type(i)))
                         .to(args.device));
    ++i;
  }
}

} // namespace dloss::fused
