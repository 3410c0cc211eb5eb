// The dloss dialect: declarations of the dialect, its enums, attributes and
// ops.
#ifndef DLOSS_DIALECT_DLOSSOPS_H
#define DLOSS_DIALECT_DLOSSOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialect/Adjoint.h"
#include "dialect/CostModel.h"

namespace mlir::dloss {
/// Trait of the ops that communicate: every rank must run them, in order.
template <typename ConcreteType>
class IsCollective : public OpTrait::TraitBase<ConcreteType, IsCollective> {};
} // namespace mlir::dloss

#include "dialect/DlossInterfaces.h.inc"

#include "dialect/DlossOpsDialect.h.inc"

#include "dialect/DlossEnums.h.inc"

#include "dialect/DlossAttrInterfaces.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/DlossAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialect/DlossOps.h.inc"

#endif // DLOSS_DIALECT_DLOSSOPS_H
