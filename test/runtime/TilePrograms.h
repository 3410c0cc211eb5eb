// The tile programs of dloss.fused_similarity that the runtime's tests run
// (InfoNCE, NT-Xent, SupCon, DCL, ArcFace, CLIP, every opcode), written
// instruction by instruction with the facts the compiler would add.
#ifndef DLOSS_TEST_RUNTIME_TILEPROGRAMS_H
#define DLOSS_TEST_RUNTIME_TILEPROGRAMS_H

#include "PlanTestUtil.h"

#include "runtime/fused/Epilogue.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dloss::test {

/// Where the columns come from.
enum class Mode {
  Gathered, ///< every rank's columns, round the ring
  Local,    ///< one class matrix, the same on every rank, tiled in place
  Sharded,  ///< the classes sharded; the rows the same on every rank
};

inline const char *modeName(Mode mode) {
  return mode == Mode::Gathered ? "gathered"
         : mode == Mode::Local  ? "local"
                                : "sharded";
}

/// A result that picks register `reg` at the place leaf `leaf` names (the
/// `picks` fact, runtime/plan/TileEncoding.h); -1: not a pick.
struct Pick {
  int64_t reg = -1, leaf = -1;
};

/// A tile program being written: each call appends one instruction and
/// returns its register. The facts the compiler would write beside it are
/// stated with the results (the runtime matches nothing itself).
struct Program {
  std::vector<int64_t> code, outputs, colOutputs;
  int64_t rowLeaves = 0, colLeaves = 0;
  std::vector<int64_t> picks, colPicks, lsePairs, classTargets;

  int64_t emit(epilogue::Op op, int64_t a = 0, int64_t b = 0, int64_t c = 0) {
    code.insert(code.end(), {static_cast<int64_t>(op), a, b, c});
    return static_cast<int64_t>(code.size()) / 4 - 1;
  }
  int64_t constant(double value) {
    return emit(epilogue::Op::Const, epilogue::doubleToBits(value));
  }
  int64_t clamp(int64_t x, double lo, double hi) {
    return emit(epilogue::Op::Clamp, x, epilogue::doubleToBits(lo),
                epilogue::doubleToBits(hi));
  }
  void output(int64_t reg, epilogue::Reduce kind, Pick pick = {}) {
    outputs.insert(outputs.end(), {reg, static_cast<int64_t>(kind)});
    picks.insert(picks.end(), {pick.reg, pick.leaf});
  }
  /// A column result (gathered steps only); `pairedRow`: the row result
  /// that is the log-sum-exp of the same register.
  void colOutput(int64_t reg, epilogue::Reduce kind, Pick pick = {},
                 int64_t pairedRow = -1) {
    colOutputs.insert(colOutputs.end(), {reg, static_cast<int64_t>(kind)});
    colPicks.insert(colPicks.end(), {pick.reg, pick.leaf});
    lsePairs.push_back(pairedRow);
  }
  /// The same program with no picks and no pairs: the kernels' general
  /// path for every result.
  Program withoutFacts() const {
    Program p = *this;
    std::fill(p.picks.begin(), p.picks.end(), -1);
    std::fill(p.colPicks.begin(), p.colPicks.end(), -1);
    std::fill(p.lsePairs.begin(), p.lsePairs.end(), -1);
    return p;
  }
  int64_t numOutputs() const {
    return static_cast<int64_t>(outputs.size()) / 2;
  }
  int64_t numColOutputs() const {
    return static_cast<int64_t>(colOutputs.size()) / 2;
  }

  std::vector<AttrSpec> attrs(Mode mode) const {
    std::vector<AttrSpec> out = {intAttr("row_leaves", rowLeaves),
                                 intAttr("col_leaves", colLeaves),
                                 intsAttr("program", code),
                                 intsAttr("outputs", outputs),
                                 intsAttr("picks", picks),
                                 intsAttr("class_targets", classTargets)};
    if (!colOutputs.empty()) {
      out.push_back(intsAttr("col_outputs", colOutputs));
      out.push_back(intsAttr("col_picks", colPicks));
      out.push_back(intsAttr("lse_pairs", lsePairs));
    }
    if (mode == Mode::Gathered)
      out.push_back(unitAttr("gathered"));
    if (mode == Mode::Sharded)
      out.push_back(unitAttr("sharded"));
    return out;
  }
};

/// The global leaves: per-row [N], per-column [M], then 0-d. Float leaves are
/// f64 (the kernel gets them in the tested type), integer ones any type.
using LeafMaker = std::function<std::vector<at::Tensor>(int64_t N, int64_t M)>;

/// One tested program.
struct ProgramCase {
  std::string name;
  Program program;
  LeafMaker leaves;
};

/// Every program the tests run: InfoNCE, NT-Xent, SupCon, DCL, ArcFace,
/// every transcendental opcode, CLIP's two directions (near and far logits,
/// with and without the facts), uniform operands, a stop-gradient hardness
/// weighting.
std::vector<ProgramCase> tilePrograms();

} // namespace dloss::test

#endif // DLOSS_TEST_RUNTIME_TILEPROGRAMS_H
