// The tile program of a similarity: which ops of the IR read a similarity
// matrix element by element and end in row reductions, as the program that
// dloss.fused_similarity runs on each tile (runtime/plan/TileEncoding.h), and
// the facts about it that the op carries for the kernels.
#ifndef DLOSS_PASSES_TILEPROGRAM_H
#define DLOSS_PASSES_TILEPROGRAM_H

#include "dialect/DlossOps.h"
#include "runtime/plan/TileEncoding.h"

#include "llvm/ADT/SmallVector.h"

#include <string>
#include <variant>

namespace mlir {
class DominanceInfo;
} // namespace mlir

namespace mlir::dloss {

/// The tile-program opcode of an element-wise op whose operands are taken as
/// they are (the fused similarity's tiles and dloss-fuse-elementwise's chains
/// share it), or nullopt.
std::optional<::dloss::epilogue::Op> elementwiseOpcode(Operation *op);

/// A reduction of the tile that the fused op computes: `op` is replaced by
/// results [first, first + count) of the fused op.
struct TileTerminal {
  Operation *op;
  unsigned first, count;
};

/// What dloss.fused_similarity needs to replace a similarity and every op
/// reading it.
struct TileProgram {
  MatmulOp matmul;
  AllGatherOp gather; ///< of the columns; null when tiled over local classes
  Value rows, cols;
  SmallVector<Value> rowLeaves, colLeaves, scalars;
  SmallVector<int64_t> program, outputs;
  /// Column results (a mirrored similarity's rows, see mergeMirror).
  SmallVector<int64_t> colOutputs;
  /// The element-wise ops the program holds, in program order.
  SmallVector<Operation *> region;
  /// The reductions, in program order; the fused op goes before the first.
  SmallVector<TileTerminal> terminals;
  /// Ops that produce per-column values (expands, then the gathers the
  /// ring replaces), erased with the tile when nothing else reads them.
  SmallVector<Operation *> leafOps;
};

/// Why a similarity stays unfused: the op that prevents it and the reason,
/// phrased to follow "not fused: ".
struct TileDecline {
  Operation *op;
  std::string reason;
};

/// Derives the tile program of `matmul` (`rows x cols^T`, the columns an
/// exact all_gather or a local class matrix), or says why there is none.
std::variant<TileProgram, TileDecline>
deriveTileProgram(MatmulOp matmul, const DominanceInfo &dominance);

/// The matmul `cols x all_gather(rows)^T` that mirrors a gathered `p` in
/// its block (CLIP's second direction), or null.
MatmulOp findMirror(const TileProgram &p);

/// Folds the program of the mirrored similarity `mirror` into `p` as column
/// results: the mirror's row values become `p`'s column values, its column
/// ids `p`'s row ids, its terminals `p`'s (their results after `p`'s row
/// results). Fails, leaving `p` unchanged, when the mirror reads a float
/// per-row value (a column value would need a gradient).
LogicalResult mergeMirror(TileProgram &p, const TileProgram &mirror);

/// Removes repeated instructions (same opcode and operands; `add`, `mul` and
/// `eq` in either order) and those no result reads, renumbering registers.
void simplifyProgram(TileProgram &p);

/// Creates a dloss.fused_similarity running `program` (results `outputs`,
/// then `colOutputs`, each of type `perRow`) with the facts
/// epilogue::deriveFacts gives (runtime/plan/TileEncoding.h). `leaves` holds
/// `rowLeaves` per-row values, `colLeaves` per-column ones, then the 0-d ones.
FusedSimilarityOp
createFusedSimilarity(OpBuilder &builder, Location loc, Type perRow, Value rows,
                      Value cols, ValueRange leaves, int64_t rowLeaves,
                      int64_t colLeaves, ArrayRef<int64_t> program,
                      ArrayRef<int64_t> outputs, ArrayRef<int64_t> colOutputs,
                      bool gathered, bool sharded);

/// The op before which the fused op goes: the first terminal in its block.
Operation *firstTerminal(const TileProgram &p);

/// The program as text, one instruction per line, for remarks and reports.
std::string tileProgramText(ArrayRef<int64_t> program,
                            ArrayRef<int64_t> outputs);

} // namespace mlir::dloss

#endif // DLOSS_PASSES_TILEPROGRAM_H
