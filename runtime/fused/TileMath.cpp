// The fused ops' tile arithmetic that is not a template: the similarity GEMM,
// log-sum-exp merging, backpropagation (the vectorised loops: TileLoops.cpp).
#include "runtime/fused/TileMath.h"

namespace dloss::fused {

namespace {

/// The row-major data of a matrix whose rows are contiguous, from row `row`
/// (tileGemm reads it with the matrix's row stride).
template <typename T> T *rowsOf(const at::Tensor &matrix, int64_t row) {
  TORCH_CHECK(matrix.dim() == 2 &&
                  (matrix.stride(1) == 1 || matrix.size(1) <= 1) && row >= 0 &&
                  row <= matrix.size(0),
              "a tile GEMM's operand is not a matrix with contiguous rows");
  return matrix.data_ptr<T>() + row * matrix.stride(0);
}

} // namespace

at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out) {
  checkTile(out, block, "similarityTile");
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "similarityTile", [&] {
    tileGemm<scalar_t>(false, true, block.rows, block.cols, sim.rows.size(1), 1,
                       rowsOf<scalar_t>(sim.rows, block.row),
                       sim.rows.stride(0), rowsOf<scalar_t>(cols, block.col),
                       cols.stride(0), 0, out.data_ptr<scalar_t>(), block.cols);
  });
  return out;
}

at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out,
                          const at::Tensor &kept, int64_t colBase) {
  if (!kept.defined())
    return similarityTile(sim, cols, block, out);
  checkTile(out, block, "similarityTile");
  out.view({block.rows, block.cols})
      .copy_(kept.narrow(0, block.row, block.rows)
                 .narrow(1, colBase + block.col, block.cols));
  return out;
}

void keepTile(const at::Tensor &kept, const at::Tensor &s, const Block &block,
              int64_t colBase) {
  if (kept.defined())
    kept.narrow(0, block.row, block.rows)
        .narrow(1, colBase + block.col, block.cols)
        .copy_(s.view({block.rows, block.cols}));
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
  backpropGemms(grad, block, operands.rows, cols, operands.scale, dRows, dCols);
}

void backpropGemms(const at::Tensor &grad, const Block &block,
                   const at::Tensor &rows, const at::Tensor &cols, double scale,
                   at::Tensor &dRows, at::Tensor &dCols) {
  checkTile(grad, block, "backpropGemms");
  const int64_t d = rows.size(1);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "backpropGemms", [&] {
    const scalar_t *g = grad.data_ptr<scalar_t>();
    const auto alpha = static_cast<scalar_t>(scale);
    if (dRows.defined())
      tileGemm<scalar_t>(false, false, block.rows, d, block.cols, alpha, g,
                         block.cols, rowsOf<scalar_t>(cols, block.col),
                         cols.stride(0), 1, rowsOf<scalar_t>(dRows, block.row),
                         dRows.stride(0));
    if (dCols.defined())
      tileGemm<scalar_t>(true, false, block.cols, d, block.rows, alpha, g,
                         block.cols, rowsOf<scalar_t>(rows, block.row),
                         rows.stride(0), 1, rowsOf<scalar_t>(dCols, block.col),
                         dCols.stride(0));
  });
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
