// The fused ops' tile GEMMs on the CPU (TileGemm.cpp): the BLAS that ATen
// itself calls, without ATen's dispatch.
#ifndef DLOSS_RUNTIME_FUSED_TILEGEMM_H
#define DLOSS_RUNTIME_FUSED_TILEGEMM_H

#include <cstdint>

namespace dloss::fused {

/// c = alpha op(a) op(b) + beta c for row-major f32 or f64 matrices: op(a)
/// is m x k, op(b) k x n and c m x n, with row strides lda, ldb, ldc (op(x)
/// = x^T where trans). The CPU tiles' GEMMs: sgemm_/dgemm_ of the BLAS that
/// ATen calls, found in the process, so the same kernels as at::mm without
/// its per-call dispatch, views and checks (about 20 ATen calls per CLIP
/// tile cost 2% of a step); addmm_ (tileGemmATen) where LibTorch keeps its
/// BLAS to itself (wheels with MKL linked in) or a size exceeds BLAS's int.
template <typename T>
void tileGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              T alpha, const T *a, int64_t lda, const T *b, int64_t ldb, T beta,
              T *c, int64_t ldc);
/// tileGemm through ATen: the fallback (tested beside tileGemm).
template <typename T>
void tileGemmATen(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  T alpha, const T *a, int64_t lda, const T *b, int64_t ldb,
                  T beta, T *c, int64_t ldc);
/// Whether tileGemm calls the process's BLAS (false: ATen).
bool tileGemmCallsBlas();

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_TILEGEMM_H
