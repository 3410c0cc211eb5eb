// The dloss enum attributes (ReduceKind, GatherGrad), with the one syntax they
// share.
#include "dialect/DlossOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::dloss;

#include "dialect/DlossAttrInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/DlossAttrs.cpp.inc"

namespace {

/// A bare case keyword (`sum`). The enum's FieldParser names the cases when
/// the keyword is not one; the declarative format would add a second error
/// about its parameter, which says nothing more to a user.
template <typename AttrT> Attribute parseEnumAttr(AsmParser &parser) {
  using Enum = decltype(std::declval<AttrT>().getValue());
  FailureOr<Enum> value = FieldParser<Enum>::parse(parser);
  if (failed(value))
    return {};
  return AttrT::get(parser.getContext(), *value);
}

/// ` sum`: the space separates the case from the mnemonic in the generic
/// form (`#dloss<reduce_kind sum>`); op formats write `` before the enum.
template <typename AttrT> void printEnumAttr(AttrT attr, AsmPrinter &printer) {
  printer << ' ' << stringifyEnum(attr.getValue());
}

} // namespace

Attribute ReduceKindAttr::parse(AsmParser &parser, Type) {
  return parseEnumAttr<ReduceKindAttr>(parser);
}

void ReduceKindAttr::print(AsmPrinter &printer) const {
  printEnumAttr(*this, printer);
}

Attribute GatherGradAttr::parse(AsmParser &parser, Type) {
  return parseEnumAttr<GatherGradAttr>(parser);
}

void GatherGradAttr::print(AsmPrinter &printer) const {
  printEnumAttr(*this, printer);
}

void DlossDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/DlossAttrs.cpp.inc"
      >();
}
