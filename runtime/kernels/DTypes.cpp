// Conversions between the plan's element types and ATen's.
#include "runtime/kernels/DTypes.h"

#include "runtime/support/Error.h"

namespace dloss {

at::ScalarType toScalarType(plan::DType dtype) {
  switch (dtype) {
  case plan::DType::f16:
    return at::kHalf;
  case plan::DType::bf16:
    return at::kBFloat16;
  case plan::DType::f32:
    return at::kFloat;
  case plan::DType::f64:
    return at::kDouble;
  case plan::DType::i8:
    return at::kChar;
  case plan::DType::i16:
    return at::kShort;
  case plan::DType::i32:
    return at::kInt;
  case plan::DType::i64:
    return at::kLong;
  case plan::DType::u8:
    return at::kByte;
  case plan::DType::boolean:
    return at::kBool;
  }
  // A plan from a newer compiler may name a dtype this runtime lacks: an
  // error, never a silent fallback.
  throw Error("unknown dtype code " + std::to_string(static_cast<int>(dtype)),
              kPlanBugHint);
}

std::optional<plan::DType> toPlanDType(at::ScalarType type) {
  for (plan::DType dtype : plan::EnumValuesDType())
    if (toScalarType(dtype) == type)
      return dtype;
  return std::nullopt;
}

std::string dtypeName(plan::DType dtype) {
  switch (dtype) {
  case plan::DType::u8:
    return "ui8";
  case plan::DType::boolean:
    return "i1";
  default:
    return plan::EnumNameDType(dtype);
  }
}

} // namespace dloss
