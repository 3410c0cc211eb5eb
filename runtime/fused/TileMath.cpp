// The fused ops' tile arithmetic that is not a template: the similarity GEMM,
// log-sum-exp merging, backpropagation (the vectorised loops: TileLoops.cpp).
#include "runtime/fused/TileMath.h"

namespace dloss::fused {

at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out) {
  at::mm_out(out, sim.rows.narrow(0, block.row, block.rows),
             cols.narrow(0, block.col, block.cols).t());
  return out;
}

at::Tensor finiteShift(const at::Tensor &x) {
  return x.masked_fill(x.isinf(), 0);
}

void mergeLse(at::Tensor max1, at::Tensor sum1, const at::Tensor &max2,
              const at::Tensor &sum2) {
  at::Tensor top = at::maximum(max1, max2);
  at::Tensor shift = finiteShift(top);
  sum1.mul_((max1 - shift).exp_()).add_(sum2 * (max2 - shift).exp_());
  max1.copy_(top);
}

at::Tensor lseOf(const at::Tensor &max, const at::Tensor &sum) {
  return max + sum.log();
}

void backpropGemms(const at::Tensor &grad, const Block &block,
                   const Similarity &operands, const at::Tensor &cols,
                   at::Tensor &dRows, at::Tensor &dCols) {
  dRows.narrow(0, block.row, block.rows)
      .addmm_(grad, cols.narrow(0, block.col, block.cols), 1, operands.scale);
  dCols.narrow(0, block.col, block.cols)
      .addmm_(grad.t(), operands.rows.narrow(0, block.row, block.rows), 1,
              operands.scale);
}

double backpropTile(const at::Tensor &grad, const at::Tensor &sim,
                    const Block &block, const Similarity &operands,
                    const at::Tensor &cols, at::Tensor &dRows,
                    at::Tensor &dCols) {
  backpropGemms(grad, block, operands, cols, dRows, dCols);
  return at::dot(grad.view({-1}), sim.view({-1})).item<double>();
}

RowStatistics rowStatistics(int64_t n, const FusedArgs &args) {
  return {at::full({n}, -kInf, args.options()), at::zeros({n}, args.options()),
          at::zeros({n}, args.options())};
}

} // namespace dloss::fused
