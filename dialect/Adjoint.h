// The contract between per-op adjoint rules (dialect/DlossAdjoints.cpp) and the
// autodiff pass.
#ifndef DLOSS_DIALECT_ADJOINT_H
#define DLOSS_DIALECT_ADJOINT_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/ArrayRef.h"

namespace mlir::dloss {

/// Whether a value is equal on every rank (invariant) or may differ (varying).
enum class Replication { Invariant, Varying };

inline Replication joinReplication(llvm::ArrayRef<Replication> operands) {
  for (Replication r : operands)
    if (r == Replication::Varying)
      return Replication::Varying;
  return Replication::Invariant;
}

/// The form of a cotangent. A varying value's cotangent is this rank's own.
/// An invariant value's cotangent is either `Reduced` (the full cotangent,
/// equal on every rank) or `Partial` (this rank's contribution; the full
/// cotangent is the sum over ranks). Partial cotangents arise where an
/// invariant value feeds varying computation (JAX's implicit `pvary`): their
/// reduction is deferred until a rule needs it, so that an all_gather's
/// adjoint is one reduce_scatter rather than an all_reduce.
enum class CotangentKind { Varying, Reduced, Partial };

struct Cotangent {
  Value value;
  CotangentKind kind = CotangentKind::Varying;
  explicit operator bool() const { return static_cast<bool>(value); }
};

/// What an op's adjoint rule sees: the op's result cotangents and a builder
/// positioned where the rule's ops go. Implemented by the autodiff pass.
class AdjointBuilder {
public:
  AdjointBuilder(OpBuilder &builder, Location loc) : b(builder), loc(loc) {}
  virtual ~AdjointBuilder();

  OpBuilder &b;
  Location loc;

  /// The cotangent of result `i`; null when no gradient reaches it (zero).
  virtual Cotangent resultCotangent(unsigned i) = 0;
  /// Adds `ct` (of the operand's type) to the cotangent of operand `i`. Its
  /// kind follows from the operand's replication (see CotangentKind) unless
  /// given.
  virtual void addOperandCotangent(unsigned i, Value ct,
                                   std::optional<CotangentKind> kind = {}) = 0;
  /// The replication of a value of the forward program.
  virtual Replication replicationOf(Value value) = 0;

  /// The full cotangent of an invariant value (an all_reduce sum of a partial
  /// one), or `ct` itself for a varying value.
  Value reduced(Cotangent ct);
  /// A per-rank partial form of an invariant value's cotangent (a reduced one
  /// divided by the number of ranks), or `ct` itself for a varying value.
  Value partial(Cotangent ct);

  // Small builders shared by the rules.
  /// A 0-d tensor constant of `elementType`.
  Value scalar(double value, Type elementType);
  /// The number of ranks as a 0-d tensor of `elementType`.
  Value worldSize(Type elementType);
  /// Sums a cotangent of a broadcast operand back to the operand's type
  /// (element-wise ops broadcast 0-d operands).
  Value unbroadcast(Value ct, Type operandType);
  /// `ct` with `axis` re-inserted to the shape of `like` (adjoint of a
  /// reduction over `axis`).
  Value expand(Value ct, int64_t axis, Value like);
};

} // namespace mlir::dloss

#endif // DLOSS_DIALECT_ADJOINT_H
