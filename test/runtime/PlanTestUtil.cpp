// Builds small plans in memory (FlatBuffers builder) for runtime tests, no
// MLIR.
#include "PlanTestUtil.h"

#include "runtime/comm/Engines.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/kernels/KernelTable.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace dloss::test {

AttrSpec intAttr(std::string name, int64_t value) {
  AttrSpec attr;
  attr.name = std::move(name);
  attr.kind = plan::AttrKind::integer;
  attr.i = value;
  return attr;
}

AttrSpec unitAttr(std::string name) { return intAttr(std::move(name), 1); }

AttrSpec realAttr(std::string name, double value) {
  AttrSpec attr;
  attr.name = std::move(name);
  attr.kind = plan::AttrKind::real;
  attr.f = value;
  return attr;
}

AttrSpec intsAttr(std::string name, std::vector<int64_t> values) {
  AttrSpec attr;
  attr.name = std::move(name);
  attr.kind = plan::AttrKind::integers;
  attr.ints = std::move(values);
  return attr;
}

AttrSpec textAttr(std::string name, std::string value) {
  AttrSpec attr;
  attr.name = std::move(name);
  attr.kind = plan::AttrKind::text;
  attr.s = std::move(value);
  return attr;
}

AttrSpec constantAttr(std::string name, const at::Tensor &value) {
  AttrSpec attr;
  attr.name = std::move(name);
  attr.kind = plan::AttrKind::constant;
  attr.constant = value.contiguous();
  return attr;
}

AttrSpec splatAttr(std::string name, const at::Tensor &element,
                   std::vector<int64_t> splatShape) {
  AttrSpec attr = constantAttr(std::move(name), element.reshape({}));
  attr.splat = true;
  attr.ints = std::move(splatShape);
  return attr;
}

ArgSpec tensorArg(std::string name, const at::Tensor &example,
                  std::vector<int64_t> dynamicDims) {
  ArgSpec arg;
  arg.name = std::move(name);
  arg.kind = plan::RegisterKind::tensor;
  arg.dtype = *toPlanDType(example.scalar_type());
  arg.shape.assign(example.sizes().begin(), example.sizes().end());
  for (int64_t d : dynamicDims)
    arg.shape[d] = -1;
  return arg;
}

ArgSpec indexArg(std::string name) {
  ArgSpec arg;
  arg.name = std::move(name);
  arg.kind = plan::RegisterKind::index;
  arg.dtype = plan::DType::i64;
  return arg;
}

namespace {

flatbuffers::Offset<plan::Attr> buildAttr(flatbuffers::FlatBufferBuilder &fbb,
                                          const AttrSpec &attr) {
  flatbuffers::Offset<plan::Constant> constant;
  if (attr.kind == plan::AttrKind::constant) {
    const at::Tensor &value = attr.constant;
    std::vector<int64_t> shape =
        attr.splat
            ? attr.ints
            : std::vector<int64_t>(value.sizes().begin(), value.sizes().end());
    std::vector<uint8_t> bytes = attr.rawBytes;
    if (!attr.useRawBytes) {
      bytes.resize(value.numel() * value.element_size());
      if (!bytes.empty())
        std::memcpy(bytes.data(), value.data_ptr(), bytes.size());
    }
    constant = plan::CreateConstantDirect(
        fbb, *toPlanDType(value.scalar_type()), &shape, attr.splat, &bytes);
  }
  bool hasInts = attr.kind == plan::AttrKind::integers;
  return plan::CreateAttrDirect(
      fbb, attr.name.c_str(), attr.kind, attr.i, attr.f,
      hasInts ? &attr.ints : nullptr,
      attr.kind == plan::AttrKind::text ? attr.s.c_str() : nullptr, constant);
}

} // namespace

std::vector<uint8_t> buildPlanBytes(const std::vector<FunctionSpec> &functions,
                                    uint64_t fingerprint, int version) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<plan::Function>> builtFunctions;
  for (const FunctionSpec &function : functions) {
    std::vector<flatbuffers::Offset<plan::Argument>> args;
    for (const ArgSpec &arg : function.args) {
      auto type =
          plan::CreateTypeInfoDirect(fbb, arg.kind, arg.dtype, &arg.shape);
      args.push_back(plan::CreateArgumentDirect(fbb, arg.name.c_str(), type,
                                                arg.replicated));
    }
    std::vector<flatbuffers::Offset<plan::Step>> steps;
    for (const StepSpec &step : function.steps) {
      std::vector<flatbuffers::Offset<plan::Attr>> attrs;
      for (const AttrSpec &attr : step.attrs)
        attrs.push_back(buildAttr(fbb, attr));
      steps.push_back(plan::CreateStepDirect(
          fbb, step.op.c_str(), &step.operands, &step.results, &attrs,
          step.loc.c_str(), &step.free));
    }
    builtFunctions.push_back(plan::CreateFunctionDirect(
        fbb, function.name.c_str(), &args, &function.results,
        /*result_types=*/nullptr, function.numRegisters, &steps,
        function.gradMode.empty() ? nullptr : function.gradMode.c_str(),
        function.gradientOf.empty() ? nullptr : function.gradientOf.c_str(),
        function.gradArguments.empty() ? nullptr : &function.gradArguments));
  }
  auto root = plan::CreatePlanDirect(fbb, version, fingerprint, "test",
                                     &builtFunctions);
  plan::FinishPlanBuffer(fbb, root);
  return std::vector<uint8_t>(fbb.GetBufferPointer(),
                              fbb.GetBufferPointer() + fbb.GetSize());
}

std::shared_ptr<const PlanFile>
buildPlan(const std::vector<FunctionSpec> &functions, uint64_t fingerprint) {
  return PlanFile::fromBytes(buildPlanBytes(functions, fingerprint),
                             "test.plan");
}

FunctionSpec singleOpFunction(const std::string &op,
                              const std::vector<Operand> &operands,
                              const std::vector<AttrSpec> &attrs,
                              const std::string &loc) {
  FunctionSpec function;
  StepSpec step;
  step.op = op;
  step.attrs = attrs;
  step.loc = loc;
  for (size_t i = 0; i < operands.size(); ++i) {
    std::string name = "arg" + std::to_string(i);
    function.args.push_back(operands[i].isIndex
                                ? indexArg(name)
                                : tensorArg(name, operands[i].tensor));
    step.operands.push_back(static_cast<int32_t>(i));
  }
  int32_t result = static_cast<int32_t>(operands.size());
  step.results = {result};
  function.steps = {step};
  function.results = {result};
  function.numRegisters = result + 1;
  return function;
}

namespace {
std::vector<at::Tensor> inputsOf(const std::vector<Operand> &operands) {
  std::vector<at::Tensor> inputs;
  for (const Operand &operand : operands)
    inputs.push_back(
        operand.isIndex
            ? at::scalar_tensor(operand.index, at::TensorOptions(at::kLong))
            : operand.tensor);
  return inputs;
}
} // namespace

at::Tensor runOp(const std::string &op, const std::vector<Operand> &operands,
                 const std::vector<AttrSpec> &attrs, Communicator *comm) {
  std::unique_ptr<Communicator> single;
  if (!comm) {
    single = makeSingleProcessCommunicator();
    comm = single.get();
  }
  Executor executor(buildPlan({singleOpFunction(op, operands, attrs)}), *comm);
  std::vector<at::Tensor> results = executor.run("f", inputsOf(operands));
  if (results.size() != 1)
    throw std::runtime_error("expected one result");
  return results[0];
}

int64_t runIndexOp(const std::string &op, const std::vector<Operand> &operands,
                   const std::vector<AttrSpec> &attrs, Communicator *comm) {
  at::Tensor result = runOp(op, operands, attrs, comm);
  if (result.scalar_type() != at::kLong || result.dim() != 0)
    throw std::runtime_error("expected an index result");
  return result.item<int64_t>();
}

std::unique_ptr<Executor> fusedExecutor(Communicator &comm,
                                        const std::string &op,
                                        const std::vector<at::Tensor> &operands,
                                        int numResults,
                                        const std::vector<size_t> &replicated,
                                        const std::vector<AttrSpec> &attrs) {
  FunctionSpec function;
  StepSpec step;
  step.op = op;
  step.attrs = attrs;
  for (size_t i = 0; i < operands.size(); ++i) {
    bool same =
        std::find(replicated.begin(), replicated.end(), i) != replicated.end();
    std::vector<int64_t> dynamic;
    if (operands[i].dim() > 0 && !same)
      dynamic.push_back(0);
    ArgSpec arg = tensorArg("arg" + std::to_string(i), operands[i], dynamic);
    arg.replicated = same;
    function.args.push_back(arg);
    step.operands.push_back(static_cast<int32_t>(i));
  }
  for (int j = 0; j < numResults; ++j)
    step.results.push_back(static_cast<int32_t>(operands.size()) + j);
  function.results = step.results;
  function.numRegisters = static_cast<int32_t>(operands.size()) + numResults;
  function.steps = {step};
  return std::make_unique<Executor>(buildPlan({function}), comm);
}

std::vector<at::Tensor> runFused(Communicator &comm, const std::string &op,
                                 const std::vector<at::Tensor> &operands,
                                 int numResults,
                                 const std::vector<size_t> &replicated,
                                 const std::vector<AttrSpec> &attrs) {
  return fusedExecutor(comm, op, operands, numResults, replicated, attrs)
      ->run("f", operands);
}

int64_t total(const std::vector<int64_t> &sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

int64_t offsetOf(const std::vector<int64_t> &sizes, int rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

at::Tensor shard(const at::Tensor &global, const std::vector<int64_t> &sizes,
                 int rank) {
  return global.narrow(0, offsetOf(sizes, rank), sizes[rank]).contiguous();
}

TileEnv::TileEnv(const std::string &tile) {
  if (const char *old = std::getenv("DLOSS_TILE")) {
    previous = old;
    hadPrevious = true;
  }
  set(tile);
}

TileEnv::~TileEnv() { set(hadPrevious ? previous : ""); }

void TileEnv::set(const std::string &tile) {
  if (tile.empty())
    ::unsetenv("DLOSS_TILE");
  else
    ::setenv("DLOSS_TILE", tile.c_str(), 1);
}

} // namespace dloss::test
