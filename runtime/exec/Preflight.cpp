// The preflight: before each call, the ranks compare plan, function, inputs and
// progress in one collective and fail alike.
#include "runtime/exec/Executor.h"

#include "runtime/exec/RankGroups.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace dloss {

using namespace exec;

namespace {

/// Identifies the preflight layout, so that runtimes of different versions
/// report the difference instead of misreading each other ("DLPF" v2).
constexpr int64_t kPreflightMagic = 0x444c504600000002;

enum PreflightStatus : int64_t {
  Ok = 0,
  UnknownFunction,
  WrongInputCount,
  UndefinedInput,
  WrongDType,
  WrongRank,
  WrongStaticDim,
  NonFinite, // check mode: NaN or infinite values in an input
};

// Header fields of a preflight record.
enum PreflightField : size_t {
  Magic = 0,
  Fingerprint,
  FunctionHash,
  Status,
  StatusArgument,
  InputCount,
  // The communicator's collectivesStarted() before this preflight: ranks
  // that made the same calls agree (-1: the engine does not count).
  CollectiveSeq,
  CheckMode,
  // Check mode: NaN and infinite values in argument StatusArgument.
  NanCount,
  InfCount,
  // The called function's name (first kNameWords * 8 bytes), so that every
  // rank can name what the others called even in another plan.
  Name0,
};
constexpr size_t kNameWords = 4;
static_assert(Name0 + kNameWords == Executor::kPreflightHeader,
              "header layout and length disagree");

constexpr size_t kSlotLength = 2 + Executor::kPreflightDims;
// Input slot fields: the dtype code, the number of dims, then the sizes.
constexpr int64_t kUndefinedDType = -1;
constexpr int64_t kForeignDType = -2; // a dtype plans cannot name (complex)

// FNV-1a: stable across processes and builds, unlike std::hash.
int64_t hashName(const std::string &name) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  int64_t out;
  std::memcpy(&out, &hash, sizeof(out));
  return out;
}

void packName(const std::string &name, int64_t *words) {
  char bytes[kNameWords * 8] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), sizeof(bytes)));
  std::memcpy(words, bytes, sizeof(bytes));
}

std::string unpackName(const int64_t *words) {
  char bytes[kNameWords * 8 + 1] = {};
  std::memcpy(bytes, words, kNameWords * 8);
  std::string name(bytes);
  return name.size() == kNameWords * 8 ? name + "..." : name;
}

std::string hex(int64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%016llx",
                static_cast<unsigned long long>(value));
  return buffer;
}

std::string typeString(const plan::TypeInfo &type) {
  if (type.kind() == plan::RegisterKind::index)
    return "index (a 0-d i64 tensor)";
  std::vector<int64_t> shape;
  if (type.shape())
    shape.assign(type.shape()->begin(), type.shape()->end());
  return dtypeName(type.dtype()) + " " + shapeText(shape);
}

/// A read-only view of one rank's preflight record.
struct Record {
  const int64_t *values;

  int64_t operator[](size_t field) const { return values[field]; }
  const int64_t *slot(size_t input) const {
    return values + Executor::kPreflightHeader + input * kSlotLength;
  }
  bool recorded(size_t input) const {
    return input < Executor::kPreflightArgs &&
           input < static_cast<size_t>(values[InputCount]);
  }
  int64_t dtype(size_t input) const { return slot(input)[0]; }
  int64_t ndim(size_t input) const { return slot(input)[1]; }
  bool fullShape(size_t input) const {
    return ndim(input) >= 0 &&
           ndim(input) <= static_cast<int64_t>(Executor::kPreflightDims);
  }
  std::vector<int64_t> shape(size_t input) const {
    int64_t n = std::min<int64_t>(ndim(input), Executor::kPreflightDims);
    return std::vector<int64_t>(slot(input) + 2, slot(input) + 2 + n);
  }
  std::string shapeText(size_t input) const {
    return dloss::shapeText(shape(input), !fullShape(input));
  }
};

std::string dtypeText(int64_t code) {
  if (code == kForeignDType)
    return "a dtype plans do not support";
  if (code < static_cast<int64_t>(plan::DType::MIN) ||
      code > static_cast<int64_t>(plan::DType::MAX))
    return "an unknown dtype";
  return dtypeName(static_cast<plan::DType>(code));
}

/// This rank's record, and its local validation of `inputs` against
/// `function` (nullptr: the plan has no such function). Never throws on bad
/// input: a rank must reach the preflight collective whatever it was given.
std::vector<int64_t> localRecord(const PlanFile &plan, const std::string &name,
                                 const plan::Function *function,
                                 const std::vector<at::Tensor> &inputs,
                                 bool check, int64_t collectiveSeq) {
  std::vector<int64_t> record(Executor::kPreflightLength, -1);
  record[Magic] = kPreflightMagic;
  record[Fingerprint] = bitcastSigned(plan.fingerprint());
  record[FunctionHash] = hashName(name);
  record[Status] = Ok;
  record[StatusArgument] = -1;
  record[InputCount] = static_cast<int64_t>(inputs.size());
  record[CollectiveSeq] = collectiveSeq;
  record[CheckMode] = check ? 1 : 0;
  record[NanCount] = 0;
  record[InfCount] = 0;
  packName(name, &record[Name0]);
  for (size_t i = 0; i < inputs.size() && i < Executor::kPreflightArgs; ++i) {
    int64_t *slot =
        record.data() + Executor::kPreflightHeader + i * kSlotLength;
    const at::Tensor &input = inputs[i];
    if (!input.defined()) {
      slot[0] = kUndefinedDType;
      slot[1] = 0;
      continue;
    }
    std::optional<plan::DType> dtype = toPlanDType(input.scalar_type());
    slot[0] = dtype ? static_cast<int64_t>(*dtype) : kForeignDType;
    slot[1] = input.dim();
    for (int64_t d = 0;
         d < input.dim() && d < static_cast<int64_t>(Executor::kPreflightDims);
         ++d)
      slot[2 + d] = input.size(d);
  }

  auto reject = [&record](PreflightStatus status, int64_t argument) {
    record[Status] = status;
    record[StatusArgument] = argument;
    return record;
  };
  if (!function)
    return reject(UnknownFunction, -1);
  if (inputs.size() != numArguments(*function))
    return reject(WrongInputCount, -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &input = inputs[i];
    const plan::TypeInfo &type = *function->arguments()->Get(i)->type();
    if (!input.defined())
      return reject(UndefinedInput, i);
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
  if (check) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor &input = inputs[i];
      if (!at::isFloatingType(input.scalar_type()) || input.numel() == 0)
        continue;
      int64_t nans = at::isnan(input).sum().item<int64_t>();
      int64_t infs = at::isinf(input).sum().item<int64_t>();
      if (nans || infs) {
        record[NanCount] = nans;
        record[InfCount] = infs;
        return reject(NonFinite, i);
      }
    }
  }
  return record;
}

/// What a rank did wrong, from its record: the same text on every rank,
/// since all of them hold the same plan (checked before this is called).
std::string describeFailure(const Record &record, const std::string &name,
                            const PlanFile &plan,
                            const plan::Function *function) {
  int64_t status = record[Status];
  if (status == UnknownFunction) {
    std::string known;
    for (const std::string &candidate : plan.functionNames())
      known += (known.empty() ? "@" : ", @") + candidate;
    return "called @" + name + ", which the plan does not have (it has " +
           (known.empty() ? std::string("no functions") : known) + ")";
  }
  if (status == WrongInputCount) {
    std::string names;
    for (size_t i = 0; i < numArguments(*function); ++i)
      names += (i ? ", " : "") + inputName(*function, i);
    return "passed " + std::to_string(record[InputCount]) + " inputs to @" +
           name + ", which takes " + std::to_string(numArguments(*function)) +
           " (" + names + ")";
  }
  size_t i = static_cast<size_t>(record[StatusArgument]);
  std::string argument = argumentName(*function, i);
  const plan::TypeInfo &type = *function->arguments()->Get(i)->type();
  // Inputs past the record's capacity were validated locally only.
  std::string actual = "a tensor of another type";
  if (record.recorded(i))
    actual = dtypeText(record.dtype(i)) + " " + record.shapeText(i);
  switch (status) {
  case UndefinedInput:
    return "passed no tensor for " + argument +
           " (undefined, or it could not be loaded: that rank's own message "
           "says why)";
  case WrongDType:
    return "passed " + argument + " as " + actual + ", expected " +
           typeString(type);
  case WrongRank:
    return "passed " + argument + " with " + std::to_string(record.ndim(i)) +
           " dims " + record.shapeText(i) + ", expected " + typeString(type);
  case WrongStaticDim:
    return "passed " + argument + " of shape " + record.shapeText(i) +
           ", expected " + typeString(type);
  case NonFinite: {
    std::string counts;
    if (record[NanCount])
      counts = std::to_string(record[NanCount]) + " NaN";
    if (record[InfCount])
      counts += (counts.empty() ? "" : " and ") +
                std::to_string(record[InfCount]) + " infinite";
    return "passed " + argument + " with " + counts +
           (record[NanCount] + record[InfCount] == 1 ? " value" : " values");
  }
  default:
    return "reported the unknown preflight status " + std::to_string(status);
  }
}

} // namespace

Executor::RankShapes
Executor::preflight(const std::string &name, const BoundFunction *bound,
                    const std::vector<at::Tensor> &inputs) {
  const plan::Function *function = bound ? bound->function : nullptr;
  std::vector<int64_t> mine = localRecord(
      *plan, name, function, inputs, opts.check, comm.collectivesStarted());
  std::vector<int64_t> all = comm.allGatherInts(mine);
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
      problem += " " + rankList(group.second) + " preflight format " +
                 hex(group.first) + ";";
    problem.pop_back();
    throw raiseAnonymous(problem, "Install the same dloss on every rank");
  }

  auto byPlan =
      groupRanks<std::pair<int64_t, std::string>>(worldSize, [&](int r) {
        return std::make_pair(record(r)[Fingerprint],
                              unpackName(&record(r).values[Name0]));
      });
  if (groupRanks<int64_t>(worldSize, [&](int r) {
        return record(r)[Fingerprint];
      }).size() > 1) {
    std::string problem = "ranks ran different plans:";
    for (size_t g = 0; g < byPlan.size(); ++g)
      problem += std::string(g ? "," : "") + " " + rankList(byPlan[g].second) +
                 " called @" + byPlan[g].first.second +
                 " of plan fingerprint " + hex(byPlan[g].first.first);
    throw raiseAnonymous(
        problem, "Every rank must call the same compiled losses in the same "
                 "order: if the ranks hold several, they call them in a "
                 "different order (or one rank skipped a call); otherwise "
                 "compile the loss once and load the same .plan file on "
                 "every rank");
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

  auto byFailure = groupRanks<std::string>(worldSize, [&](int r) {
    Record rec = record(r);
    return rec[Status] == Ok ? std::string()
                             : describeFailure(rec, name, *plan, function);
  });
  std::string failures;
  bool onlyNonFinite = true;
  for (int r = 0; r < worldSize; ++r)
    if (record(r)[Status] != Ok && record(r)[Status] != NonFinite)
      onlyNonFinite = false;
  for (const auto &group : byFailure)
    if (!group.first.empty())
      failures += (failures.empty() ? "" : "; ") + rankList(group.second) +
                  " " + group.first;
  if (!failures.empty())
    throw raise(failures,
                onlyNonFinite
                    ? "Check mode (DLOSS_CHECK=1) rejects NaN and infinite "
                      "inputs: find where those ranks' values stop being "
                      "finite (a bad sample, an overflow or a division by "
                      "zero upstream), or turn check mode off"
                    : "Pass every rank inputs of the function's argument "
                      "types (? marks a size that may vary)");

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
  return shapes;
}

} // namespace dloss
