// The ops a plan may hold, as their ODS definitions declare them (generated:
// runtime/kernels/OpTable.inc).
#ifndef DLOSS_RUNTIME_OPTABLE_H
#define DLOSS_RUNTIME_OPTABLE_H

#include <string>
#include <vector>

namespace dloss {

/// How a plan carries an attribute (plan::AttrKind, plus a UnitAttr's
/// presence and arith.constant's typed value).
enum class OpAttrKind {
  Integer,  ///< plan integer
  Real,     ///< plan real (an integer is accepted)
  Integers, ///< plan integers
  Text,     ///< plan text; an enum's case by name
  Flag,     ///< a UnitAttr: plan integer 1 when present
  Any,      ///< a typed constant: integer, real or constant
};

struct OpAttrSpec {
  std::string name;
  OpAttrKind kind;
  /// Optional, default-valued or a flag: a plan may leave it out.
  bool mayBeAbsent;
};

/// An op's operand whose values index a dimension of another operand
/// (Dloss_IndexOperand): per row, one index into dimension `axis` (the op's
/// `axis` attribute) of operand `data`.
struct OpIndexOperand {
  int data = -1;
  int indices = -1; ///< -1: the op has no such operand
  bool present() const { return indices >= 0; }
};

struct OpSpec {
  std::string name; ///< "dloss.all_gather"
  int minOperands;
  int maxOperands; ///< -1: any number (variadic)
  int numResults;  ///< -1: any number (a variadic result list)
  std::vector<OpAttrSpec> attrs;
  OpIndexOperand index;
  /// It communicates: every rank runs it, in the same order
  /// (Dloss_Collective).
  bool collective;
  /// Users never build it: passes produce it (Dloss_Internal).
  bool internal;
  /// A fused ring-tiled op (Dloss_Fused); internal too.
  bool fused;
};

/// The spec of op `name`, or nullptr when no ODS definition names it.
const OpSpec *findOpSpec(const std::string &name);

/// Every op of the table (the dloss dialect and arith), sorted by name.
const std::vector<OpSpec> &opSpecs();

} // namespace dloss

#endif // DLOSS_RUNTIME_OPTABLE_H
