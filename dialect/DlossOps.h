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
/// Trait of the ops users never build (Dloss_Internal in
/// DlossInterfaces.td).
template <typename ConcreteType>
class IsInternal : public OpTrait::TraitBase<ConcreteType, IsInternal> {};
/// Trait of the fused ring-tiled ops (Dloss_Fused).
template <typename ConcreteType>
class IsFused : public OpTrait::TraitBase<ConcreteType, IsFused> {};
/// Trait of the ops whose operand `Indices` indexes dimension `axis` of
/// operand `Data` (Dloss_IndexOperand). The operand numbers reach the
/// runtime through the op table (gen_op_table.py reads them from the .td);
/// no C++ reads them from the trait.
template <unsigned Data, unsigned Indices> struct IndexOperand {
  template <typename ConcreteType>
  class Impl : public OpTrait::TraitBase<ConcreteType, Impl> {};
};
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
