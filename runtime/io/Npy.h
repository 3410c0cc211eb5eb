// Reading and writing NumPy .npy files as at::Tensor (inputs and outputs of
// dloss-run, test data).
#ifndef DLOSS_RUNTIME_NPY_H
#define DLOSS_RUNTIME_NPY_H

#include <ATen/core/Tensor.h>

#include <string>

namespace dloss {
namespace npy {

/// Loads a .npy file (format 1.0, 2.0 or 3.0) into a contiguous CPU tensor.
///
/// Supported dtypes: float16, float32, float64, int8, int16, int32, int64,
/// uint8 and bool, little-endian. Fortran-ordered arrays are transposed into
/// C order, so the result has the same shape and element order numpy shows.
/// 0-d arrays give 0-d tensors; zero-size dims are kept.
///
/// Throws dloss::Error naming the file for anything it cannot load exactly:
/// unreadable path, malformed or truncated header, big-endian or unsupported
/// dtype, data shorter or longer than the shape says.
at::Tensor load(const std::string &path);

/// Writes a CPU tensor as a format 1.0 .npy file in C order, byte for byte
/// what numpy.save writes for the same array. Non-contiguous tensors are
/// written in their logical order. Throws dloss::Error for non-CPU tensors,
/// unsupported dtypes or I/O failures.
void save(const std::string &path, const at::Tensor &tensor);

} // namespace npy
} // namespace dloss

#endif // DLOSS_RUNTIME_NPY_H
