// Decoding a plan step's attributes: a missing or ill-kinded attribute is a
// plan bug.
#include "runtime/kernels/StepAttrs.h"

#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"

namespace dloss {

const plan::Attr *StepAttrs::find(const char *name) const {
  if (!step.attrs())
    return nullptr;
  for (const plan::Attr *attr : *step.attrs())
    if (attr->name()->string_view() == name)
      return attr;
  return nullptr;
}

const plan::Attr &StepAttrs::require(const char *name,
                                     const char *expected) const {
  const plan::Attr *attr = find(name);
  if (!attr)
    fail(std::string("missing ") + expected + " attribute '" + name + "'",
         kPlanBugHint);
  return *attr;
}

namespace {
[[noreturn]] void wrongKind(const plan::Attr &attr, const char *expected) {
  fail("attribute '" + attr.name()->str() + "' is " +
           plan::EnumNameAttrKind(attr.kind()) + ", expected " + expected,
       kPlanBugHint);
}
} // namespace

int64_t StepAttrs::integer(const char *name) const {
  const plan::Attr &attr = require(name, "integer");
  if (attr.kind() != plan::AttrKind::integer)
    wrongKind(attr, "integer");
  return attr.i();
}

std::optional<int64_t> StepAttrs::optionalInteger(const char *name) const {
  if (!has(name))
    return std::nullopt;
  return integer(name);
}

bool StepAttrs::flag(const char *name) const {
  std::optional<int64_t> value = optionalInteger(name);
  return value && *value != 0;
}

double StepAttrs::real(const char *name) const {
  const plan::Attr &attr = require(name, "real");
  if (attr.kind() == plan::AttrKind::integer)
    return static_cast<double>(attr.i());
  if (attr.kind() != plan::AttrKind::real)
    wrongKind(attr, "real");
  return attr.f();
}

std::optional<double> StepAttrs::optionalReal(const char *name) const {
  if (!has(name))
    return std::nullopt;
  return real(name);
}

std::vector<int64_t> StepAttrs::integers(const char *name) const {
  const plan::Attr &attr = require(name, "integers");
  if (attr.kind() != plan::AttrKind::integers)
    wrongKind(attr, "integers");
  if (!attr.ints())
    return {};
  return std::vector<int64_t>(attr.ints()->begin(), attr.ints()->end());
}

std::string StepAttrs::text(const char *name) const {
  const plan::Attr &attr = require(name, "text");
  if (attr.kind() != plan::AttrKind::text)
    wrongKind(attr, "text");
  return attr.s() ? attr.s()->str() : std::string();
}

at::ScalarType StepAttrs::resultType() const {
  // The compiler records every result's type on the step.
  if (step.result_types() && step.result_types()->size() > 0 && !has("dtype"))
    return toScalarType(step.result_types()->Get(0)->dtype());
  const plan::Attr &attr = require("dtype", "dtype (result element type)");
  if (attr.kind() == plan::AttrKind::integer) {
    int64_t code = attr.i();
    if (code < static_cast<int64_t>(plan::DType::MIN) ||
        code > static_cast<int64_t>(plan::DType::MAX))
      fail("attribute 'dtype' holds the unknown dtype code " +
               std::to_string(code),
           kPlanBugHint);
    return toScalarType(static_cast<plan::DType>(code));
  }
  if (attr.kind() != plan::AttrKind::text)
    wrongKind(attr, "text or integer");
  std::string name = attr.s() ? attr.s()->str() : std::string();
  for (plan::DType dtype : plan::EnumValuesDType())
    if (name == dtypeName(dtype) || name == plan::EnumNameDType(dtype))
      return toScalarType(dtype);
  if (name == "ui8")
    return at::kByte;
  fail("attribute 'dtype' names the unsupported element type '" + name + "'",
       kPlanBugHint);
}

} // namespace dloss
