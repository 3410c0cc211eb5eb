// The fused ops' tile GEMMs on the CPU: the BLAS that ATen itself calls,
// without ATen's dispatch (TileGemm.h).
#include "runtime/fused/TileGemm.h"

#include <ATen/ATen.h>
#include <ATen/ops/mm_ops.h>

#include <dlfcn.h>

#include <climits>

namespace dloss::fused {

namespace {

/// The Fortran BLAS GEMM (column-major), as ATen declares and calls it.
template <typename T>
using FortranGemm = void (*)(const char *transa, const char *transb,
                             const int *m, const int *n, const int *k,
                             const T *alpha, const T *a, const int *lda,
                             const T *b, const int *ldb, const T *beta, T *c,
                             const int *ldc);

/// sgemm_/dgemm_ as ATen's own library (libtorch_cpu) resolves them: dlsym
/// on its handle searches it and the libraries it depends on, so this finds
/// MKL where the wheel links it in (pip's x86 torch, which exports it) and the
/// system BLAS where LibTorch links one (libblas.so.3), whether LibTorch was
/// loaded globally (dloss-run) or RTLD_LOCAL (a Python extension). Never
/// loads a library. Null when neither exports the symbol: ATen then.
template <typename T> FortranGemm<T> processGemm() {
  static const FortranGemm<T> gemm = []() -> FortranGemm<T> {
    const char *name = sizeof(T) == sizeof(float) ? "sgemm_" : "dgemm_";
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void *>(&at::_ops::mm::call), &info) ||
        !info.dli_fname)
      return nullptr;
    // The handle stays open: we call into the library it names.
    void *aten = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    return aten ? reinterpret_cast<FortranGemm<T>>(dlsym(aten, name)) : nullptr;
  }();
  return gemm;
}

bool fitsInt(int64_t value) { return value >= 0 && value <= INT_MAX; }

} // namespace

template <typename T>
void tileGemmATen(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  T alpha, const T *a, int64_t lda, const T *b, int64_t ldb,
                  T beta, T *c, int64_t ldc) {
  auto type = at::TensorOptions(c10::CppTypeToScalarType<T>::value);
  // A row-major r x s matrix with row stride ld, seen as op(x).
  auto view = [&](const T *x, int64_t rows, int64_t cols, int64_t ld,
                  bool trans) {
    at::Tensor t = at::from_blob(const_cast<T *>(x),
                                 {trans ? cols : rows, trans ? rows : cols},
                                 {ld, 1}, type);
    return trans ? t.t() : t;
  };
  // One BLAS call, as the tiles made before tileGemm; beta = 0 ignores c.
  at::from_blob(c, {m, n}, {ldc, 1}, type)
      .addmm_(view(a, m, k, lda, transA), view(b, k, n, ldb, transB), beta,
              alpha);
}

template <typename T>
void tileGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              T alpha, const T *a, int64_t lda, const T *b, int64_t ldb, T beta,
              T *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  FortranGemm<T> gemm = processGemm<T>();
  if (!gemm || !fitsInt(m) || !fitsInt(n) || !fitsInt(k) || !fitsInt(lda) ||
      !fitsInt(ldb) || !fitsInt(ldc)) {
    tileGemmATen(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // operands swap, each keeping its own transposition flag.
  const char ta = transB ? 'T' : 'N', tb = transA ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m),
            K = static_cast<int>(k), LDA = static_cast<int>(ldb),
            LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  // BLAS rejects a leading dimension below 1 even where nothing is read.
  const int one = 1;
  gemm(&ta, &tb, &M, &N, &K, &alpha, b, LDA > 0 ? &LDA : &one, a,
       LDB > 0 ? &LDB : &one, &beta, c, LDC > 0 ? &LDC : &one);
}

bool tileGemmCallsBlas() {
  return processGemm<float>() != nullptr && processGemm<double>() != nullptr;
}

#define DLOSS_TILE_GEMM(T)                                                     \
  template void tileGemm<T>(bool, bool, int64_t, int64_t, int64_t, T,          \
                            const T *, int64_t, const T *, int64_t, T, T *,    \
                            int64_t);                                          \
  template void tileGemmATen<T>(bool, bool, int64_t, int64_t, int64_t, T,      \
                                const T *, int64_t, const T *, int64_t, T,     \
                                T *, int64_t);
DLOSS_TILE_GEMM(float)
DLOSS_TILE_GEMM(double)
#undef DLOSS_TILE_GEMM

} // namespace dloss::fused
