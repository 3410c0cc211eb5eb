// The plan's element types in ATen's terms and in MLIR's spelling.
#ifndef DLOSS_RUNTIME_KERNELS_DTYPES_H
#define DLOSS_RUNTIME_KERNELS_DTYPES_H

#include "runtime/plan/Plan_generated.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace dloss {

/// Conversions between plan dtypes and ATen's.
at::ScalarType toScalarType(plan::DType dtype);
std::optional<plan::DType> toPlanDType(at::ScalarType type);
/// The MLIR spelling of a plan dtype ("f32", "i1"), for messages.
std::string dtypeName(plan::DType dtype);

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_DTYPES_H
