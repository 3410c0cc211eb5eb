// The fused ops' tile GEMMs on the CPU: the BLAS that ATen itself calls,
// without ATen's dispatch (TileMath.h, tileGemm).
#include "runtime/fused/TileMath.h"

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

/// sgemm_/dgemm_ of a BLAS already in the process: from the global scope,
/// else (LibTorch loaded RTLD_LOCAL, as a Python extension can be) from
/// libblas.so.3 if it is loaded; never loads a library. With a LibTorch that
/// links the system BLAS (Debian's: libblas.so.3, OpenBLAS) these are the
/// functions its at::mm calls. Null where no BLAS is loaded but one LibTorch
/// keeps to itself (wheels with MKL linked in): ATen then.
template <typename T> FortranGemm<T> processGemm() {
  static const FortranGemm<T> gemm = [] {
    const char *name = sizeof(T) == sizeof(float) ? "sgemm_" : "dgemm_";
    void *found = dlsym(RTLD_DEFAULT, name);
    if (!found)
      if (void *blas = dlopen("libblas.so.3", RTLD_LAZY | RTLD_NOLOAD))
        found = dlsym(blas, name); // the handle stays open: we call into it
    return reinterpret_cast<FortranGemm<T>>(found);
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
