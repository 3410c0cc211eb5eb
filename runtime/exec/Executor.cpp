// The plan interpreter: runs one function of a plan, step by step, on this
// rank's tensors.
#include "runtime/exec/Executor.h"

#include "runtime/exec/PreflightRecord.h"
#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/kernels/OpTable.h"
#include "runtime/kernels/StepAttrs.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace dloss {

using namespace exec;

//===----------------------------------------------------------------------===//
// Steps
//===----------------------------------------------------------------------===//

/// The registers of one call, as the kernel of the current step sees them.
class Executor::StepContext final : public KernelContext {
public:
  using KnownShapes = const std::vector<std::vector<int64_t>> *;

  StepContext(Communicator &comm, std::vector<Value> &registers,
              std::vector<KnownShapes> &known, const std::vector<char> &kept,
              at::Device device)
      : comm(comm), registers(registers), known(known), kept(kept),
        callDevice(device) {}

  void begin(const BoundStep &next) {
    step = &next;
    pending.assign(next.results.size(), Value());
  }

  /// Moves the kernel's results into their registers (after the kernel, so
  /// a result register may also be an operand of the same step), with the
  /// per-rank sizes of result 0 when its shape flow tells them.
  void commit() {
    KnownShapes flowed = nullptr;
    switch (step->kernel.shapeFlow) {
    case ShapeFlow::None:
      break;
    case ShapeFlow::Operand0:
      flowed = known[step->operands[0]];
      break;
    case ShapeFlow::Elementwise: {
      // Which operand is 0-d is fixed by the plan, so every rank picks the
      // same one (and keeps sizes exactly when the others do).
      const Value &lhs = registers[step->operands[0]];
      flowed = known[step->operands[lhs.tensor().dim() != 0 ? 0 : 1]];
      break;
    }
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].isEmpty())
        throw Error("the kernel produced no result " + std::to_string(i),
                    "Report a bug in the dloss runtime");
      int32_t reg = step->results[i];
      registers[reg] = std::move(pending[i]);
      known[reg] = i == 0 ? flowed : nullptr;
    }
  }

  Communicator &communicator() override { return comm; }
  at::Device device() const override { return callDevice; }
  size_t numOperands() const override { return step->operands.size(); }
  int64_t operandKey(size_t i) const override {
    return i < step->operands.size() ? step->operands[i] : -1;
  }
  const Value &operand(size_t i) const override {
    if (i >= step->operands.size())
      throw Error("the kernel read operand " + std::to_string(i) +
                      " of a step with " +
                      std::to_string(step->operands.size()),
                  kPlanBugHint);
    const Value &value = registers[step->operands[i]];
    if (value.isEmpty())
      throw Error("operand " + std::to_string(i) + " (register " +
                      std::to_string(step->operands[i]) +
                      ") is read before it is written or after it is freed",
                  kPlanBugHint);
    return value;
  }
  at::Tensor consumable(size_t i) const override {
    if (i >= step->operands.size())
      return {};
    const int32_t reg = step->operands[i];
    // Freed after this step (and not kept for a step after the flush),
    // read by no other operand of it, and referenced by nothing else.
    if (kept[reg] ||
        std::find(step->free.begin(), step->free.end(), reg) ==
            step->free.end() ||
        std::count(step->operands.begin(), step->operands.end(), reg) != 1)
      return {};
    const Value &value = registers[reg];
    if (!value.isTensor())
      return {};
    const at::Tensor &tensor = value.tensor();
    if (tensor.use_count() != 1 || !tensor.has_storage() ||
        tensor.storage().use_count() != 1 || !tensor.is_contiguous() ||
        tensor.storage_offset() != 0)
      return {};
    return tensor;
  }
  void setResult(size_t i, Value value) override {
    if (i >= pending.size())
      throw Error("the kernel wrote result " + std::to_string(i) +
                      " of a step with " + std::to_string(pending.size()),
                  kPlanBugHint);
    pending[i] = std::move(value);
  }

  std::vector<int64_t> rankSizes(size_t i, int64_t axis) override {
    const at::Tensor &input = tensor(i);
    if (KnownShapes shapes = known[step->operands[i]]) {
      std::vector<int64_t> sizes;
      for (const std::vector<int64_t> &shape : *shapes)
        sizes.push_back(shape.at(axis));
      return sizes;
    }
    // A computed value: every rank reaches this step with the same register
    // state, so every rank makes this collective call too.
    return comm.allGatherInts({input.size(axis)});
  }

private:
  Communicator &comm;
  std::vector<Value> &registers;
  std::vector<KnownShapes> &known;
  const std::vector<char> &kept;
  at::Device callDevice;
  const BoundStep *step = nullptr;
  std::vector<Value> pending;
};

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

Executor::Executor(std::shared_ptr<const PlanFile> planFile,
                   Communicator &communicator)
    : Executor(std::move(planFile), communicator,
               ExecutorOptions::fromEnvironment()) {}

Executor::Executor(std::shared_ptr<const PlanFile> planFile,
                   Communicator &communicator, ExecutorOptions options)
    : plan(std::move(planFile)), comm(communicator), opts(options) {
  if (!plan)
    throw Error("Executor built without a plan",
                "Load one with PlanFile::load");
  if (!plan->plan().functions())
    return;
  for (const plan::Function *function : *plan->plan().functions()) {
    std::string name = function->name()->str();
    auto fail = [&](const std::string &problem) -> Error {
      return Error("plan '" + plan->name() + "', function @" + name + ": " +
                       problem,
                   kPlanBugHint);
    };
    int32_t numRegisters = function->num_registers();
    size_t numArgs = numArguments(*function);
    if (numRegisters < 0 || numArgs > static_cast<size_t>(numRegisters))
      throw fail(std::to_string(numArgs) + " arguments do not fit in " +
                 std::to_string(numRegisters) + " registers");
    auto checkRegisters = [&](const flatbuffers::Vector<int32_t> *regs,
                              const char *what) {
      std::vector<int32_t> out;
      if (!regs)
        return out;
      for (int32_t reg : *regs) {
        if (reg < 0 || reg >= numRegisters)
          throw fail(std::string(what) + " register " + std::to_string(reg) +
                     " is outside [0, " + std::to_string(numRegisters) + ")");
        out.push_back(reg);
      }
      return out;
    };
    checkRegisters(function->results(), "result");

    BoundFunction bound;
    bound.function = function;
    std::vector<std::optional<Reduction>> kinds;
    if (function->steps()) {
      for (const plan::Step *step : *function->steps()) {
        BoundStep boundStep;
        boundStep.op = step->op()->str();
        boundStep.loc = step->loc() ? step->loc()->str() : "";
        try {
          boundStep.operands = checkRegisters(step->operands(), "operand");
          boundStep.results = checkRegisters(step->results(), "result");
          boundStep.free = checkRegisters(step->free(), "freed");
        } catch (const Error &error) {
          throw error.withOp(boundStep.op).withLocation(boundStep.loc);
        }
        boundStep.kernel = bindKernel(*step);
        boundStep.site = CallSite{name, boundStep.op, boundStep.loc, ""};
        kinds.emplace_back();
        if (boundStep.op == "dloss.all_reduce") {
          StepAttrs attrs(*step);
          kinds.back() = reductionFromName(attrs.text("kind"));
          boundStep.deferred = kinds.back();
          std::optional<int64_t> group = attrs.optionalInteger("coalesce");
          if (group && *group < 2)
            throw fail("all_reduce's coalesce = " + std::to_string(*group) +
                       " (a group has at least 2)")
                .withOp(boundStep.op)
                .withLocation(boundStep.loc);
          boundStep.coalesce = static_cast<size_t>(group.value_or(1));
        }
        bound.steps.push_back(std::move(boundStep));
      }
    }
    try {
      markCoalesced(bound.steps, kinds);
    } catch (const Error &error) {
      throw fail(error.what());
    }
    markDeferred(bound.steps, numRegisters);
    bound.indexUses = preflight::indexUses(*function);
    bound.foldRegisters = foldRegisters(bound.steps, *function);
    functions.emplace(std::move(name), std::move(bound));
  }
}

void Executor::markCoalesced(
    std::vector<BoundStep> &steps,
    const std::vector<std::optional<Reduction>> &kinds) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t n = steps[i].coalesce;
    if (n < 2)
      continue;
    if (i + n > steps.size())
      throw Error("all_reduce at step " + std::to_string(i) + " coalesces " +
                  std::to_string(n) + " steps, past the function's end");
    std::vector<int32_t> written;
    for (size_t k = i; k < i + n; ++k) {
      BoundStep &step = steps[k];
      if (!kinds[k] || kinds[k] != kinds[i] || step.operands.size() != 1 ||
          step.results.size() != 1 || (k > i && step.coalesce != 1))
        throw Error("step " + std::to_string(k) + " (" + step.op +
                    ") is in the group of all_reduces at step " +
                    std::to_string(i) +
                    " but is no all_reduce of its kind, of one operand");
      if (std::find(written.begin(), written.end(), step.operands[0]) !=
          written.end())
        throw Error("all_reduce at step " + std::to_string(k) +
                    " reads the result of one of its group");
      written.push_back(step.results[0]);
      // One collective for the group: none rides on a later gather.
      step.deferred.reset();
      step.coalesceKind = *kinds[i];
      step.joined = k > i;
    }
    i += n - 1;
  }
}

void Executor::markDeferred(std::vector<BoundStep> &steps,
                            int64_t numRegisters) {
  // Steps are marked by index; a root reduction whose value (or a value
  // computed from it) reaches a collective is unmarked, and the marks are
  // worked out again, until none does.
  for (bool changed = true; changed;) {
    changed = false;
    // The root reductions each register's value waits for.
    std::vector<std::vector<size_t>> waitsFor(numRegisters);
    for (size_t i = 0; i < steps.size() && !changed; ++i) {
      BoundStep &step = steps[i];
      std::vector<size_t> roots;
      for (int32_t reg : step.operands)
        roots.insert(roots.end(), waitsFor[reg].begin(), waitsFor[reg].end());
      const OpSpec *spec = findOpSpec(step.op);
      step.afterFlush = false;
      if (step.deferred && roots.empty()) {
        roots.push_back(i);
      } else if (!roots.empty() && spec && !spec->collective) {
        step.deferred.reset();
        step.afterFlush = true;
      } else if (!roots.empty()) {
        for (size_t root : roots)
          steps[root].deferred.reset();
        changed = true;
        continue;
      }
      for (int32_t reg : step.results)
        waitsFor[reg] = roots;
    }
  }
}

std::vector<int32_t>
Executor::foldRegisters(const std::vector<BoundStep> &steps,
                        const plan::Function &function) {
  const size_t numArgs = numArguments(function);
  for (const BoundStep &step : steps) {
    const OpSpec *spec = findOpSpec(step.op);
    if (!spec || !spec->collective)
      continue;
    // The first collective: its gathered operands that are varying tensor
    // arguments, each once.
    std::vector<int32_t> registers;
    for (int k : step.kernel.foldOperands) {
      if (k < 0 || static_cast<size_t>(k) >= step.operands.size())
        continue;
      const int32_t reg = step.operands[static_cast<size_t>(k)];
      if (static_cast<size_t>(reg) >= numArgs)
        continue;
      const plan::Argument *argument = function.arguments()->Get(reg);
      // At most 62, for the preflight's FoldMask (a fused op has 2).
      if (argument->type()->kind() == plan::RegisterKind::tensor &&
          !argument->replicated() && registers.size() < 62 &&
          std::find(registers.begin(), registers.end(), reg) == registers.end())
        registers.push_back(reg);
    }
    return registers;
  }
  return {};
}

std::vector<at::Tensor> Executor::run(const std::string &name,
                                      const std::vector<at::Tensor> &inputs) {
  auto found = functions.find(name);
  BoundFunction *bound = found == functions.end() ? nullptr : &found->second;
  // Nothing may raise before the preflight: the other ranks would wait in it
  // until their deadline instead of hearing what went wrong.
  // The schedule setting is read once: the preflight agrees on it, and the
  // fused ops' passes run under it, even if set_schedule changes the
  // process default meanwhile.
  const fused::Schedule setting = scheduleSetting();
  RankShapes shapes;
  Folded folded;
  {
    CallSite site{name, "", "", "preflight"};
    CallSiteScope scope(site);
    shapes = preflight(name, bound, inputs, setting, folded);
  }
  const plan::Function &function = *bound->function;
  int rank = comm.rank();
  fused::ScheduleScope schedule(setting);
  // What the preflight carried, the first fused op's gather need not move.
  for (auto &[reg, rows] : folded)
    fused::keepGathered(reg, std::move(rows));

  std::vector<Value> registers(function.num_registers());
  std::vector<StepContext::KnownShapes> known(registers.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (function.arguments()->Get(i)->type()->kind() ==
        plan::RegisterKind::index)
      registers[i] = Value::ofIndex(inputs[i].item<int64_t>());
    else
      registers[i] = inputs[i];
    if (!shapes[i].empty())
      known[i] = &shapes[i];
  }

  // What waits for the deferred reductions: the registers they and the
  // steps after them will fill, those steps, and the registers those steps
  // read (kept until they run, whatever the plan's frees say).
  std::vector<char> waiting(registers.size(), 0), kept(registers.size(), 0);
  StepContext context(comm, registers, known, kept,
                      preflight::callDevice(function, inputs));
  // Reductions deferred by a call that fails are not this call's.
  struct DropDeferred {
    Communicator &comm;
    ~DropDeferred() { comm.dropReductions(); }
  } dropDeferred{comm};
  // The call's last step is the flush of the deferred reductions.
  const BoundStep *flush = nullptr;
  for (const BoundStep &step : bound->steps)
    if (step.deferred)
      flush = &step;
  auto runStep = [&](const BoundStep &step, auto &&body) {
    // A rank failing alone leaves its peers waiting at their next
    // collective: tell the communicator, so that they can name this rank.
    auto failed = [this](const Error &error) {
      comm.noteFailure(error.what());
      return error;
    };
    try {
      CallSiteScope scope(step.site);
      body();
    } catch (const Error &error) {
      throw failed(error.withRank(rank).withOp(step.op).withLocation(step.loc));
    } catch (const c10::Error &error) {
      throw failed(Error(ErrorInfo{error.what_without_backtrace(),
                                   "ATen rejected the operands; check the "
                                   "shapes and dtypes of the function's "
                                   "inputs",
                                   rank, step.op, step.loc}));
    } catch (const std::exception &error) {
      throw failed(Error(ErrorInfo{error.what(), "", rank, step.op, step.loc}));
    }
  };
  std::vector<const BoundStep *> late;
  auto runNow = [&](const BoundStep &step) {
    runStep(step, [&] {
      // Each step a row of torch.profiler's tables, named by its op (a
      // collective's row holds its wait for the peers).
      RECORD_FUNCTION(step.op, std::vector<c10::IValue>());
      context.begin(step);
      step.kernel.run(context);
      context.commit();
    });
  };
  auto release = [&](const BoundStep &step) {
    // Drop dead values now, so their buffers return to the allocator before
    // the next (possibly large) intermediate is allocated.
    for (int32_t reg : step.free) {
      if (kept[reg])
        continue;
      registers[reg].reset();
      known[reg] = nullptr;
      fused::forgetGathered(reg);
    }
  };
  // A group of all-reduces: one collective over their operands, flattened
  // into one buffer (all read before any result is written: a result may
  // take the register of an operand freed in the group).
  auto runCoalesced = [&](const BoundStep *first) {
    runStep(*first, [&] {
      RECORD_FUNCTION(first->op, std::vector<c10::IValue>());
      const size_t n = first->coalesce;
      std::vector<at::Tensor> parts;
      for (size_t k = 0; k < n; ++k) {
        const Value &value = registers[first[k].operands[0]];
        if (!value.isTensor())
          throw Error("all_reduce " + std::to_string(k) +
                          " of a group reads no tensor",
                      kPlanBugHint);
        parts.push_back(value.tensor().reshape(-1));
      }
      for (size_t k = 1; k < n; ++k)
        if (parts[k].scalar_type() != parts[0].scalar_type() ||
            parts[k].device() != parts[0].device())
          throw Error("the all_reduces of a group hold " +
                          std::string(c10::toString(parts[0].scalar_type())) +
                          " on " + parts[0].device().str() + " and " +
                          c10::toString(parts[k].scalar_type()) + " on " +
                          parts[k].device().str(),
                      kPlanBugHint);
      at::Tensor reduced = comm.allReduce(at::cat(parts), first->coalesceKind);
      int64_t offset = 0;
      std::vector<at::Tensor> results;
      for (size_t k = 0; k < n; ++k) {
        const at::Tensor &input = registers[first[k].operands[0]].tensor();
        results.push_back(
            reduced.narrow(0, offset, input.numel()).view(input.sizes()));
        offset += input.numel();
      }
      for (size_t k = 0; k < n; ++k) {
        const int32_t reg = first[k].results[0];
        known[reg] = known[first[k].operands[0]];
        registers[reg] = std::move(results[k]);
      }
    });
  };
  for (const BoundStep &step : bound->steps) {
    if (step.coalesce > 1 || step.joined) {
      if (step.coalesce > 1)
        runCoalesced(&step);
      release(step);
      continue;
    }
    const Value *input =
        step.deferred ? &registers[step.operands.front()] : nullptr;
    bool waits = false;
    for (int32_t reg : step.operands)
      waits = waits || waiting[reg];
    if (input && !input->isIndex() && !input->isEmpty() &&
        input->tensor().dim() == 0) {
      runStep(step, [&] {
        comm.deferReduction(
            input->tensor(), *step.deferred,
            [&registers, reg = step.results.front()](at::Tensor result) {
              registers[reg] = std::move(result);
            });
      });
      waiting[step.results.front()] = 1;
    } else if (step.afterFlush && waits) {
      late.push_back(&step);
      for (int32_t reg : step.operands)
        kept[reg] = 1;
      for (int32_t reg : step.results)
        waiting[reg] = 1;
      continue;
    } else {
      runNow(step);
    }
    release(step);
  }
  if (flush)
    runStep(*flush, [&] { comm.flushReductions(); });
  for (const BoundStep *step : late)
    runNow(*step);
  // What the next call's preflight folds: what this call's gathers read.
  bound->foldWanted = 0;
  for (size_t k = 0; k < bound->foldRegisters.size(); ++k)
    if (fused::gatherWanted(bound->foldRegisters[k]))
      bound->foldWanted |= int64_t{1} << k;

  std::vector<at::Tensor> results;
  if (function.results()) {
    for (int32_t reg : *function.results()) {
      const Value &value = registers[reg];
      if (value.isEmpty())
        throw Error(ErrorInfo{"result register " + std::to_string(reg) +
                                  " of @" + name + " holds no value",
                              kPlanBugHint,
                              rank,
                              {},
                              {}});
      results.push_back(
          value.isIndex()
              ? at::scalar_tensor(value.index(), at::TensorOptions(at::kLong))
              : value.tensor());
    }
  }
  if (opts.check && isDerivedGradient(function) &&
      gradModeOf(function) == "global")
    checkReplicatedGradients(name, function, results);
  return results;
}

} // namespace dloss
