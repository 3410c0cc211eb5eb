// The text form of a plan (FlatBuffers only: no LibTorch, no MLIR).
#include "runtime/plan/PlanText.h"

#include "runtime/plan/Plan_generated.h"

#include <sstream>

using namespace dloss::plan;

static const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DType::f16:
    return "f16";
  case DType::bf16:
    return "bf16";
  case DType::f32:
    return "f32";
  case DType::f64:
    return "f64";
  case DType::i8:
    return "i8";
  case DType::i16:
    return "i16";
  case DType::i32:
    return "i32";
  case DType::i64:
    return "i64";
  case DType::u8:
    return "ui8";
  case DType::boolean:
    return "i1";
  }
  return "?";
}

template <typename T>
static void list(std::ostringstream &os, const flatbuffers::Vector<T> *values,
                 const char *prefix = "") {
  if (!values)
    return;
  for (unsigned i = 0; i < values->size(); ++i)
    os << (i ? ", " : "") << prefix << values->Get(i);
}

std::string dloss::plan::typeToText(const TypeInfo &type) {
  if (type.kind() == RegisterKind::index)
    return "index";
  std::ostringstream os;
  os << "tensor<";
  if (type.shape())
    for (int64_t d : *type.shape()) {
      if (d < 0)
        os << "?x";
      else
        os << d << "x";
    }
  os << dtypeName(type.dtype()) << ">";
  return os.str();
}

static void attrToText(std::ostringstream &os, const Attr &attr) {
  os << attr.name()->str() << " = ";
  switch (attr.kind()) {
  case AttrKind::integer:
    os << attr.i();
    break;
  case AttrKind::real:
    os << attr.f();
    break;
  case AttrKind::integers:
    os << "[";
    list(os, attr.ints());
    os << "]";
    break;
  case AttrKind::text:
    os << '"' << (attr.s() ? attr.s()->str() : "") << '"';
    break;
  case AttrKind::constant: {
    const Constant *c = attr.constant();
    os << "constant<";
    if (c && c->shape())
      for (int64_t d : *c->shape())
        os << d << "x";
    os << (c ? dtypeName(c->dtype()) : "?")
       << (c && c->splat() ? ", splat" : "") << ", "
       << (c && c->data() ? c->data()->size() : 0) << " bytes>";
    break;
  }
  }
}

std::string dloss::plan::toText(const Plan &plan) {
  std::ostringstream os;
  os << "plan version " << plan.version() << " fingerprint 0x" << std::hex
     << plan.fingerprint() << std::dec;
  if (plan.source())
    os << " source \"" << plan.source()->str() << "\"";
  os << "\n";
  if (!plan.functions())
    return os.str();
  for (const Function *f : *plan.functions()) {
    os << "func @" << f->name()->str() << "(";
    if (f->arguments())
      for (unsigned i = 0; i < f->arguments()->size(); ++i) {
        const Argument *a = f->arguments()->Get(i);
        os << (i ? ", " : "") << "%" << i << ": " << typeToText(*a->type());
        if (a->name() && a->name()->size())
          os << " \"" << a->name()->str() << "\"";
        if (a->replicated())
          os << " replicated";
        if (a->state())
          os << " state";
      }
    os << ")";
    if (f->grad_mode() && f->grad_mode()->size())
      os << " grad_mode \"" << f->grad_mode()->str() << "\"";
    if (f->gradient_of() && f->gradient_of()->size()) {
      os << " gradient_of @" << f->gradient_of()->str() << " wrt (";
      list(os, f->grad_arguments(), "%");
      os << ")";
    }
    os << " registers " << f->num_registers() << "\n";
    if (f->steps())
      for (const Step *s : *f->steps()) {
        os << "  ";
        if (s->results() && s->results()->size()) {
          list(os, s->results(), "%");
          os << " = ";
        }
        os << s->op()->str() << "(";
        list(os, s->operands(), "%");
        os << ")";
        if (s->attrs() && s->attrs()->size()) {
          os << " {";
          for (unsigned i = 0; i < s->attrs()->size(); ++i) {
            os << (i ? ", " : "");
            attrToText(os, *s->attrs()->Get(i));
          }
          os << "}";
        }
        if (s->loc() && s->loc()->size())
          os << " loc(" << s->loc()->str() << ")";
        if (s->free() && s->free()->size()) {
          os << " free(";
          list(os, s->free(), "%");
          os << ")";
        }
        os << "\n";
      }
    os << "  return(";
    list(os, f->results(), "%");
    os << ")\n";
  }
  return os.str();
}
