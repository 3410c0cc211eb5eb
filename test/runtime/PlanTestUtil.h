// Builds small plans in memory (FlatBuffers builder) for runtime tests, no
// MLIR.
#ifndef DLOSS_TEST_RUNTIME_PLANTESTUTIL_H
#define DLOSS_TEST_RUNTIME_PLANTESTUTIL_H

#include "runtime/exec/Executor.h"
#include "runtime/plan/PlanFile.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dloss::test {

/// One attribute of a step, in the compiler's encoding.
struct AttrSpec {
  std::string name;
  plan::AttrKind kind = plan::AttrKind::integer;
  int64_t i = 0;
  double f = 0;
  std::vector<int64_t> ints;
  std::string s;
  // kind == constant: the tensor whose bytes are stored (one element when
  // splat).
  at::Tensor constant;
  bool splat = false;
  // Overrides the constant's bytes (to test malformed plans).
  std::vector<uint8_t> rawBytes;
  bool useRawBytes = false;
};

AttrSpec intAttr(std::string name, int64_t value);
/// A UnitAttr as the compiler writes it: integer 1.
AttrSpec unitAttr(std::string name);
AttrSpec realAttr(std::string name, double value);
AttrSpec intsAttr(std::string name, std::vector<int64_t> values);
AttrSpec textAttr(std::string name, std::string value);
/// A dense constant holding `value` (its dtype and shape); with `splat`,
/// `value` must hold one element, repeated to `splatShape`.
AttrSpec constantAttr(std::string name, const at::Tensor &value);
AttrSpec splatAttr(std::string name, const at::Tensor &element,
                   std::vector<int64_t> splatShape);

struct StepSpec {
  std::string op;
  std::vector<int32_t> operands;
  std::vector<int32_t> results;
  std::vector<AttrSpec> attrs;
  std::string loc = "test.mlir:1:1";
  std::vector<int32_t> free;
};

struct ArgSpec {
  std::string name;
  plan::RegisterKind kind = plan::RegisterKind::tensor;
  plan::DType dtype = plan::DType::f32;
  std::vector<int64_t> shape;
  bool replicated = false;
};

/// An argument typed like `example`; dims listed in `dynamicDims` become -1.
ArgSpec tensorArg(std::string name, const at::Tensor &example,
                  std::vector<int64_t> dynamicDims = {});
ArgSpec indexArg(std::string name);

struct FunctionSpec {
  std::string name = "f";
  std::vector<ArgSpec> args;
  std::vector<int32_t> results;
  int32_t numRegisters = 0;
  std::vector<StepSpec> steps;
  /// For losses and their gradients: "ddp" or "global"; empty otherwise.
  std::string gradMode;
  /// For a gradient function: the loss it differentiates, and the argument
  /// of each gradient result (results 1, 2, ...).
  std::string gradientOf;
  std::vector<int32_t> gradArguments;
};

/// The serialised plan.
std::vector<uint8_t> buildPlanBytes(const std::vector<FunctionSpec> &functions,
                                    uint64_t fingerprint = 0x1234,
                                    int version = kPlanVersion);
std::shared_ptr<const PlanFile>
buildPlan(const std::vector<FunctionSpec> &functions,
          uint64_t fingerprint = 0x1234);

/// An operand of a one-op test: a tensor argument or an index argument.
struct Operand {
  /*implicit*/ Operand(at::Tensor tensor) : tensor(std::move(tensor)) {}
  /*implicit*/ Operand(int64_t index) : index(index), isIndex(true) {}
  /*implicit*/ Operand(int index) : index(index), isIndex(true) {}
  at::Tensor tensor;
  int64_t index = 0;
  bool isIndex = false;
};

/// A function @f whose arguments are `operands` and whose body is the one
/// step `op` with `attrs`, returning its result.
FunctionSpec singleOpFunction(const std::string &op,
                              const std::vector<Operand> &operands,
                              const std::vector<AttrSpec> &attrs,
                              const std::string &loc = "test.mlir:1:1");

/// Runs `op` on `operands` through a plan and an Executor over `comm` (a
/// single-process communicator when null); index results come back as 0-d
/// int64 tensors.
at::Tensor runOp(const std::string &op, const std::vector<Operand> &operands,
                 const std::vector<AttrSpec> &attrs = {},
                 Communicator *comm = nullptr);

/// The Executor runFused calls once; for tests whose calls build on the
/// ones before (the preflight's fold).
std::unique_ptr<Executor>
fusedExecutor(Communicator &comm, const std::string &op,
              const std::vector<at::Tensor> &operands, int numResults,
              const std::vector<size_t> &replicated = {},
              const std::vector<AttrSpec> &attrs = {});
/// Runs one fused step `op` with `numResults` results through a plan and an
/// Executor over `comm`. Operands listed in `replicated` are the same on
/// every rank; the others may differ along axis 0.
std::vector<at::Tensor> runFused(Communicator &comm, const std::string &op,
                                 const std::vector<at::Tensor> &operands,
                                 int numResults,
                                 const std::vector<size_t> &replicated = {},
                                 const std::vector<AttrSpec> &attrs = {});

/// The sum of per-rank sizes.
int64_t total(const std::vector<int64_t> &sizes);

/// The sum of the sizes of the ranks before `rank`.
int64_t offsetOf(const std::vector<int64_t> &sizes, int rank);

/// Rank `rank`'s rows of `global`, sharded by `sizes` (contiguous).
at::Tensor shard(const at::Tensor &global, const std::vector<int64_t> &sizes,
                 int rank);

/// Sets DLOSS_TILE for its lifetime ("" unsets it), then restores it: the
/// fused kernels' tests cross tile edges with it.
class TileEnv {
public:
  explicit TileEnv(const std::string &tile);
  ~TileEnv();
  TileEnv(const TileEnv &) = delete;
  TileEnv &operator=(const TileEnv &) = delete;

private:
  static void set(const std::string &tile);
  std::string previous;
  bool hadPrevious = false;
};

/// The index result of `op` as an integer.
int64_t runIndexOp(const std::string &op, const std::vector<Operand> &operands,
                   const std::vector<AttrSpec> &attrs = {},
                   Communicator *comm = nullptr);

/// The message of the dloss::Error `fn` raises; a test failure (and "") when
/// it raises nothing or something else.
template <typename Fn> std::string errorOf(Fn &&fn);

} // namespace dloss::test

#include "runtime/support/Error.h"
#include <gtest/gtest.h>

template <typename Fn> std::string dloss::test::errorOf(Fn &&fn) {
  try {
    fn();
  } catch (const dloss::Error &error) {
    return error.what();
  } catch (const std::exception &error) {
    ADD_FAILURE() << "expected a dloss::Error, got: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected a dloss::Error, nothing was raised";
  return "";
}

#endif // DLOSS_TEST_RUNTIME_PLANTESTUTIL_H
