// The preflight's driver: before each call, the ranks compare plan, function,
// inputs and progress in one collective and fail alike.
#include "runtime/exec/Executor.h"

#include "runtime/comm/ContractCommunicator.h"
#include "runtime/exec/PreflightDiagnosis.h"
#include "runtime/exec/PreflightIndices.h"
#include "runtime/exec/PreflightRecord.h"
#include "runtime/exec/RankGroups.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"

#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace dloss {

using namespace exec;
using namespace preflight;

namespace {

/// Whether this runtime computes on `device`: the CPU, and CUDA GPUs when
/// it was built with CUDA (the fused kernels' GPU tiles).
bool computesOn(const at::Device &device) {
  if (device.is_cpu())
    return true;
#ifdef DLOSS_HAVE_CUDA
  if (device.is_cuda())
    return true;
#endif
  return false;
}

bool isDifferentiated(const plan::Function &function, size_t i) {
  if (!function.grad_arguments())
    return false;
  for (int32_t argument : *function.grad_arguments())
    if (argument == static_cast<int32_t>(i))
      return true;
  return false;
}

/// This rank's record, and its local validation of `inputs` against
/// `function` (nullptr: the plan has no such function) and its `indexUses`,
/// bound with it. Never throws on bad input: a rank must reach the preflight
/// collective whatever it was given. When checking an input raises (it
/// should not), the record says so and `localError` holds the reason.
std::vector<int64_t> localRecord(const PlanFile &plan, const std::string &name,
                                 const plan::Function *function,
                                 const std::vector<IndexUse> &indexUses,
                                 const std::vector<at::Tensor> &inputs,
                                 bool check, int64_t schedule,
                                 int64_t collectiveSeq,
                                 std::string &localError) {
  std::vector<int64_t> record =
      newRecord(plan, name, inputs, check, schedule, collectiveSeq);
  auto reject = [&record](PreflightStatus status, int64_t argument) {
    record[Status] = status;
    record[StatusArgument] = argument;
    return record;
  };
  if (!function)
    return reject(UnknownFunction, -1);
  if (inputs.size() != numArguments(*function))
    return reject(WrongInputCount, -1);
  auto isTensor = [function](size_t i) {
    return function->arguments()->Get(i)->type()->kind() ==
           plan::RegisterKind::tensor;
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined())
      return reject(UndefinedInput, i);
  // Devices before anything reads a value: a meta tensor has none.
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!computesOn(inputs[i].device()))
      return reject(UnsupportedDevice, i);
  at::Device device = callDevice(*function, inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (isTensor(i) && inputs[i].device() != device)
      return reject(MixedDevices, i);
  if (isDerivedGradient(*function))
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad() && !isDifferentiated(*function, i))
        return reject(RequiresGrad, i);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &input = inputs[i];
    const plan::TypeInfo &type = *function->arguments()->Get(i)->type();
    if (type.kind() == plan::RegisterKind::index) {
      if (input.scalar_type() != at::kLong)
        return reject(WrongDType, i);
      if (input.dim() != 0)
        return reject(WrongRank, i);
      continue;
    }
    if (input.scalar_type() != toScalarType(type.dtype()))
      return reject(WrongDType, i);
    size_t rank = type.shape() ? type.shape()->size() : 0;
    if (static_cast<size_t>(input.dim()) != rank)
      return reject(WrongRank, i);
    for (size_t d = 0; d < rank; ++d) {
      int64_t expected = type.shape()->Get(d);
      if (expected >= 0 && input.size(d) != expected)
        return reject(WrongStaticDim, i);
    }
  }
  // Reading values (index ranges, check mode) may raise only on a broken
  // tensor; the rank must still reach the collective.
  size_t current = 0;
  try {
    for (const IndexUse &use : indexUses) {
      current = use.argument;
      if (std::optional<OutOfRange> bad =
              firstOutOfRange(use, inputs[use.argument])) {
        record[Detail0] = bad->value;
        record[Detail1] = bad->flat;
        record[Detail2] = use.size;
        return reject(IndexOutOfRange, use.argument);
      }
    }
    if (check) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        current = i;
        const at::Tensor &input = inputs[i];
        if (!at::isFloatingType(input.scalar_type()) || input.numel() == 0)
          continue;
        int64_t nans = at::isnan(input).sum().item<int64_t>();
        int64_t infs = at::isinf(input).sum().item<int64_t>();
        if (nans || infs) {
          record[Detail0] = nans;
          record[Detail1] = infs;
          return reject(NonFinite, i);
        }
      }
    }
  } catch (const c10::Error &error) {
    localError = error.what_without_backtrace();
    return reject(ValidationFailed, current);
  } catch (const std::exception &error) {
    localError = error.what();
    return reject(ValidationFailed, current);
  }
  return record;
}

} // namespace

at::Device preflight::callDevice(const plan::Function &function,
                                 const std::vector<at::Tensor> &inputs) {
  // An index is read on the host, wherever it lives.
  for (size_t i = 0; i < inputs.size() && i < numArguments(function); ++i)
    if (function.arguments()->Get(i)->type()->kind() ==
            plan::RegisterKind::tensor &&
        inputs[i].defined())
      return inputs[i].device();
  return at::Device(at::kCPU);
}

namespace {

/// The folded arguments' every-rank rows from every rank's payload, where
/// each payload holds what the agreed shapes say: else none (the fused op
/// then gathers them itself).
std::vector<std::pair<int32_t, at::Tensor>>
unfold(const std::vector<int32_t> &registers, const fused::Tensors &like,
       const std::vector<std::vector<std::vector<int64_t>>> &shapes,
       const std::vector<at::Tensor> &payloads) {
  std::vector<std::vector<int64_t>> lengths;
  for (int32_t reg : registers) {
    const auto &byRank = shapes[static_cast<size_t>(reg)];
    if (byRank.size() != payloads.size())
      return {};
    lengths.emplace_back();
    for (const std::vector<int64_t> &shape : byRank)
      lengths.back().push_back(shape.empty() ? -1 : shape[0]);
  }
  for (size_t q = 0; q < payloads.size(); ++q) {
    int64_t expected = 0;
    for (size_t k = 0; k < like.size(); ++k) {
      if (lengths[k][q] < 0)
        return {};
      expected += lengths[k][q] * fused::rowBytes(like[k]);
    }
    if (expected != static_cast<int64_t>(payloads[q].nbytes()))
      return {};
  }
  fused::Tensors rows = fused::unpackRows(payloads, like, lengths);
  std::vector<std::pair<int32_t, at::Tensor>> folded;
  for (size_t k = 0; k < registers.size(); ++k)
    folded.emplace_back(registers[k], rows[k]);
  return folded;
}

} // namespace

// The preflight is one round trip: its record fits allGatherInts' frame.
static_assert(Executor::kPreflightLength <=
                  comm::kIntsFrame - comm::kIntsFrameHeader,
              "the preflight record no longer fits allGatherInts' frame");

Executor::RankShapes Executor::preflight(const std::string &name,
                                         const BoundFunction *bound,
                                         const std::vector<at::Tensor> &inputs,
                                         fused::Schedule schedule,
                                         Folded &folded) {
  const plan::Function *function = bound ? bound->function : nullptr;
  static const std::vector<IndexUse> kNoUses;
  const std::vector<IndexUse> &uses = bound ? bound->indexUses : kNoUses;
  std::string localError;
  std::vector<int64_t> mine = localRecord(
      *plan, name, function, uses, inputs, opts.check,
      static_cast<int64_t>(schedule), comm.collectivesStarted(), localError);
  // The fold: the rows the call's first fused op gathers travel with the
  // record, when every rank's fit the frame's room (the last call's
  // proposal). Only the registers the last call's gathers asked for (all
  // before the first call): a one-sided gather reads the columns alone.
  // The next call's room is this call's folded rows, or none where the
  // call cannot fold (a ring setting, GPU tensors, a rank's bad input).
  fused::Tensors foldRows;
  std::vector<int32_t> foldRegisters;
  int64_t foldBytes = 0, foldMask = 0;
  bool foldable = bound && !bound->foldRegisters.empty() &&
                  comm.worldSize() > 1 && schedule != fused::Schedule::Ring &&
                  localError.empty() && Record{mine.data()}[Status] == Ok;
  for (size_t k = 0; foldable && k < bound->foldRegisters.size(); ++k) {
    const int32_t reg = bound->foldRegisters[k];
    const size_t i = static_cast<size_t>(reg);
    foldable = i < inputs.size() && inputs[i].defined() &&
               inputs[i].device().is_cpu() && inputs[i].dim() >= 1;
    if (foldable && (bound->foldWanted < 0 || (bound->foldWanted >> k) & 1)) {
      foldRows.push_back(inputs[i].detach());
      foldRegisters.push_back(reg);
      foldBytes += static_cast<int64_t>(inputs[i].nbytes());
      foldMask |= int64_t{1} << k;
    }
  }
  foldable = foldable && foldMask != 0;
  mine[FoldMask] = foldable ? foldMask : 0;
  // The communicator writes the rows straight into its frame.
  static const fused::Tensors kNoPayload;
  const fused::Tensors &payload =
      foldable && foldBytes <= comm.foldCapacity() ? foldRows : kNoPayload;
  Communicator::FoldedInts exchanged =
      comm.allGatherIntsFolding(mine, payload, foldable ? foldBytes : 0);
  std::vector<int64_t> &all = exchanged.values;
  int worldSize = comm.worldSize();
  if (all.size() != kPreflightLength * static_cast<size_t>(worldSize))
    throw Error("the preflight exchange returned " +
                    std::to_string(all.size()) + " values, expected " +
                    std::to_string(kPreflightLength * worldSize),
                "Report a bug in the communicator");
  auto record = [&all](int r) {
    return Record{all.data() + static_cast<size_t>(r) * kPreflightLength};
  };
  // Until the ranks are known to call the same function, the message must
  // not start with this rank's own function name: it would differ by rank.
  auto raiseAnonymous = [](const std::string &problem,
                           const std::string &hint) {
    return Error("preflight: " + problem, hint);
  };
  auto raise = [&name](const std::string &problem, const std::string &hint) {
    return Error("preflight of @" + name + ": " + problem, hint);
  };

  // Checked in order: a later check is only meaningful once the earlier
  // ones agree (the same plan, then the same function).
  auto byMagic =
      groupRanks<int64_t>(worldSize, [&](int r) { return record(r)[Magic]; });
  if (byMagic.size() > 1) {
    std::string problem = "ranks run different dloss runtime versions:";
    for (const auto &group : byMagic)
      problem.append(" ")
          .append(rankList(group.second))
          .append(" preflight format ")
          .append(hex(group.first))
          .append(";");
    problem.pop_back();
    throw raiseAnonymous(problem, "Install the same dloss on every rank");
  }

  if (groupRanks<int64_t>(worldSize, [&](int r) {
        return record(r)[Fingerprint];
      }).size() > 1) {
    // A loss compiled per input dtype (the drop-ins) gives a rank that
    // passed another dtype another plan: say so, it is the likely cause.
    bool sameName = groupRanks<std::string>(worldSize, [&](int r) {
                      return unpackName(&record(r).values[Name0]);
                    }).size() == 1;
    bool dtypesDiffer =
        sameName && groupRanks<std::string>(worldSize, [&](int r) {
                      return dtypesText(record(r));
                    }).size() > 1;
    using PlanKey = std::tuple<int64_t, std::string, std::string>;
    auto byPlan = groupRanks<PlanKey>(worldSize, [&](int r) {
      return PlanKey(record(r)[Fingerprint],
                     unpackName(&record(r).values[Name0]),
                     dtypesDiffer ? dtypesText(record(r)) : "");
    });
    std::string problem = "ranks ran different plans:";
    for (size_t g = 0; g < byPlan.size(); ++g) {
      const auto &[fingerprint, called, dtypes] = byPlan[g].first;
      problem += std::string(g ? "," : "") + " " + rankList(byPlan[g].second) +
                 " called @" + called + " of plan fingerprint " +
                 hex(fingerprint);
      if (dtypesDiffer)
        problem += " with inputs of dtypes (" + dtypes + ")";
    }
    throw raiseAnonymous(
        problem,
        dtypesDiffer
            ? "The ranks passed inputs of different dtypes, and a loss is "
              "compiled once per input dtype (the drop-in losses do so): "
              "pass the same dtypes on every rank (x.float(), say)"
            : "Every rank must call the same compiled losses in the same "
              "order: if the ranks hold several, they call them in a "
              "different order (or one rank skipped a call); otherwise "
              "compile the loss once and load the same .plan file on every "
              "rank");
  }

  auto byFunction = groupRanks<int64_t>(
      worldSize, [&](int r) { return record(r)[FunctionHash]; });
  if (byFunction.size() > 1) {
    // Every rank holds the same plan, so each can name the others' calls.
    std::map<int64_t, std::string> names;
    for (const std::string &candidate : plan->functionNames())
      names[hashName(candidate)] = "@" + candidate;
    std::string problem = "ranks called different functions:";
    for (size_t g = 0; g < byFunction.size(); ++g) {
      auto it = names.find(byFunction[g].first);
      problem +=
          std::string(g ? "," : "") + " " + rankList(byFunction[g].second) +
          " called " +
          (it != names.end()
               ? it->second
               : "@" +
                     unpackName(
                         &record(byFunction[g].second.front()).values[Name0]) +
                     ", which the plan does not have");
    }
    throw raiseAnonymous(
        problem, "Every rank must run the same functions in the same order");
  }

  // The same number of earlier collectives: a rank that skipped a call (or
  // made extra ones) would otherwise meet its peers' next call silently,
  // every collective off by one call.
  bool counted = true;
  for (int r = 0; r < worldSize; ++r)
    counted &= record(r)[CollectiveSeq] >= 0;
  if (counted) {
    auto bySeq = groupRanks<int64_t>(
        worldSize, [&](int r) { return record(r)[CollectiveSeq]; });
    if (bySeq.size() > 1) {
      size_t best = majority(bySeq);
      std::string problem;
      for (size_t g = 0; g < bySeq.size(); ++g) {
        if (g == best)
          continue;
        problem += (problem.empty() ? "" : "; ") + rankList(bySeq[g].second) +
                   " made " + std::to_string(bySeq[g].first) +
                   " collective calls before this one, " +
                   rankList(bySeq[best].second) + " made " +
                   std::to_string(bySeq[best].first);
      }
      throw raise(problem +
                      ": the ranks' calls are out of step (a rank skipped a "
                      "call, or made one the others did not)",
                  "Every rank must make the same dloss calls in the same "
                  "order: look for a call made under a rank-dependent "
                  "condition (if rank == 0), an early return, or a caught "
                  "error on the ranks named");
    }
  }

  auto byCheck = groupRanks<int64_t>(
      worldSize, [&](int r) { return record(r)[CheckMode]; });
  if (byCheck.size() > 1) {
    std::string problem = "ranks run with different check modes:";
    for (size_t g = 0; g < byCheck.size(); ++g)
      problem += std::string(g ? "," : "") + " " + rankList(byCheck[g].second) +
                 " with checks " + (byCheck[g].first ? "on" : "off");
    throw raise(problem, "Set DLOSS_CHECK (or ExecutorOptions::check) alike "
                         "on every rank");
  }

  auto bySchedule = groupRanks<int64_t>(
      worldSize, [&](int r) { return record(r)[ScheduleSetting]; });
  if (bySchedule.size() > 1) {
    std::string problem = "ranks run with different schedule settings:";
    for (size_t g = 0; g < bySchedule.size(); ++g)
      problem += std::string(g ? "," : "") + " " +
                 rankList(bySchedule[g].second) + " with " +
                 fused::scheduleName(
                     static_cast<fused::Schedule>(bySchedule[g].first));
    throw raise(problem, "Set DLOSS_SCHEDULE, dloss.set_schedule() or the "
                         "loss's schedule= alike on every rank");
  }

  auto byFailure = groupRanks<std::string>(worldSize, [&](int r) {
    Record rec = record(r);
    return rec[Status] == Ok
               ? std::string()
               : describeFailure(rec, name, *plan, function, uses);
  });
  std::string failures;
  std::vector<int64_t> statuses;
  for (int r = 0; r < worldSize; ++r)
    if (record(r)[Status] != Ok)
      statuses.push_back(record(r)[Status]);
  for (const auto &group : byFailure)
    if (!group.first.empty())
      failures += (failures.empty() ? "" : "; ") + rankList(group.second) +
                  " " + group.first;
  if (!failures.empty()) {
    // Only the rank whose own check raised knows why; it adds the reason.
    if (!localError.empty())
      failures +=
          " (on rank " + std::to_string(comm.rank()) + ": " + localError + ")";
    throw raise(failures, failureHint(statuses));
  }

  // Every rank computes on the same kind of device (each may use its own
  // GPU): a CPU rank among GPU ranks would fail alone in its first
  // collective, its peers waiting for it.
  auto byDeviceType = groupRanks<std::string>(worldSize, [&](int r) {
    for (size_t i = 0; i < numArguments(*function); ++i)
      if (record(r).recorded(i) &&
          function->arguments()->Get(i)->type()->kind() ==
              plan::RegisterKind::tensor)
        return deviceTypeText(record(r).device(i));
    return std::string();
  });
  if (byDeviceType.size() > 1) {
    std::string problem;
    for (size_t g = 0; g < byDeviceType.size(); ++g)
      problem +=
          std::string(g ? ", " : "") + rankList(byDeviceType[g].second) +
          " passed " +
          (byDeviceType[g].first.empty() ? std::string("no tensors")
                                         : byDeviceType[g].first + " tensors");
    throw raise("ranks compute on different kinds of device: " + problem,
                "Pass every rank's inputs on the same kind of device: CPU "
                "tensors everywhere (Gloo), or one GPU per rank (NCCL)");
  }

  // Cross-rank agreement: only the batch dimension (0) of varying arguments
  // may differ; replicated arguments hold the same value everywhere.
  RankShapes shapes(numArguments(*function));
  std::string mismatches;
  bool replicatedMismatch = false;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const plan::Argument *argument = function->arguments()->Get(i);
    if (argument->type()->kind() != plan::RegisterKind::tensor ||
        !record(0).recorded(i) || !record(0).fullShape(i))
      continue;
    bool replicated = argument->replicated();
    auto byShape = groupRanks<std::vector<int64_t>>(worldSize, [&](int r) {
      std::vector<int64_t> shape = record(r).shape(i);
      if (!replicated && !shape.empty())
        shape.erase(shape.begin());
      return shape;
    });
    if (byShape.size() > 1) {
      size_t best = majority(byShape);
      std::string common = record(byShape[best].second.front()).shapeText(i);
      for (size_t g = 0; g < byShape.size(); ++g) {
        if (g == best)
          continue;
        mismatches += (mismatches.empty() ? "" : "; ") +
                      rankList(byShape[g].second) + " passed " +
                      (replicated ? "replicated " : "") +
                      argumentName(*function, i) + " of shape " +
                      record(byShape[g].second.front()).shapeText(i) + ", " +
                      rankList(byShape[best].second) + " " + common;
      }
      replicatedMismatch |= replicated;
      continue;
    }
    for (int r = 0; r < worldSize; ++r)
      shapes[i].push_back(record(r).shape(i));
  }
  if (!mismatches.empty())
    throw raise(mismatches,
                replicatedMismatch
                    ? "A replicated argument must be the same tensor on "
                      "every rank, and other arguments may differ only in "
                      "dimension 0 (the batch)"
                    : "Ranks may differ only in dimension 0 (the batch) of "
                      "an argument");
  bool sameFold = foldable && !exchanged.payloads.empty();
  for (int r = 0; sameFold && r < worldSize; ++r)
    sameFold = record(r)[FoldMask] == foldMask;
  if (sameFold)
    folded = unfold(foldRegisters, foldRows, shapes, exchanged.payloads);
  return shapes;
}

} // namespace dloss
