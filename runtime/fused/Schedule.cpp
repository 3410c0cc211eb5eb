// The schedule settings (process default, per-call scope) and the cost model
// that chooses between the ring and the gather.
#include "runtime/fused/Schedule.h"

#include "runtime/support/Error.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace dloss::fused {

namespace {

// The process default, read from DLOSS_SCHEDULE on first use. -1: not read.
std::atomic<int64_t> processDefault{-1};
std::mutex environmentRead;

thread_local bool haveCallSetting = false;
thread_local Schedule callSetting = Schedule::Auto;
// What the call keeps (gatheredOperand, keptSimilarity); empty outside a
// scope.
thread_local ScheduleScope::Kept callKept;

std::atomic<int64_t> ringPasses{0}, gatherPasses{0}, keptReads{0};

} // namespace

const char *scheduleName(Schedule schedule) {
  switch (schedule) {
  case Schedule::Auto:
    return "auto";
  case Schedule::Ring:
    return "ring";
  case Schedule::Gather:
    return "gather";
  }
  return "?";
}

Schedule parseSchedule(const std::string &text, const std::string &source) {
  for (Schedule schedule : {Schedule::Auto, Schedule::Ring, Schedule::Gather})
    if (text == scheduleName(schedule))
      return schedule;
  throw Error(source + "='" + text +
                  "' is not a schedule: expected auto, ring or gather",
              "Use \"auto\" (the cost model chooses per call from the batch "
              "sizes), \"ring\" or \"gather\"");
}

std::optional<Schedule> parseOptionalSchedule(const std::string &text,
                                              const std::string &source) {
  if (text.empty())
    return std::nullopt;
  return parseSchedule(text, source);
}

Schedule defaultSchedule() {
  int64_t value = processDefault.load();
  if (value >= 0)
    return static_cast<Schedule>(value);
  std::lock_guard<std::mutex> lock(environmentRead);
  value = processDefault.load();
  if (value >= 0)
    return static_cast<Schedule>(value);
  Schedule schedule = Schedule::Auto;
  const char *text = std::getenv("DLOSS_SCHEDULE");
  if (text && *text)
    schedule = parseSchedule(text, "environment variable DLOSS_SCHEDULE");
  processDefault.store(static_cast<int64_t>(schedule));
  return schedule;
}

void setDefaultSchedule(Schedule schedule) {
  processDefault.store(static_cast<int64_t>(schedule));
}

Schedule currentSchedule() {
  return haveCallSetting ? callSetting : defaultSchedule();
}

ScheduleScope::ScheduleScope(Schedule schedule)
    : hadPrevious(haveCallSetting), previous(callSetting),
      previousKept(std::move(callKept)) {
  haveCallSetting = true;
  callSetting = schedule;
  callKept = Kept();
}

ScheduleScope::~ScheduleScope() {
  haveCallSetting = hadPrevious;
  callSetting = previous;
  callKept = std::move(previousKept);
}

at::Tensor gatheredOperand(int64_t key, const at::Tensor &like,
                           int64_t globalRows) {
  if (!haveCallSetting || key < 0)
    return {};
  if (!gatherWanted(key))
    callKept.wanted.push_back(key);
  auto found = callKept.gathered.find(key);
  if (found == callKept.gathered.end())
    return {};
  const at::Tensor &gathered = found->second;
  bool same = gathered.scalar_type() == like.scalar_type() &&
              gathered.device() == like.device() &&
              gathered.dim() == like.dim() && gathered.size(0) == globalRows;
  for (int64_t d = 1; same && d < like.dim(); ++d)
    same = gathered.size(d) == like.size(d);
  return same ? gathered : at::Tensor();
}

void keepGathered(int64_t key, at::Tensor gathered) {
  if (haveCallSetting && key >= 0)
    callKept.gathered[key] = std::move(gathered);
}

bool gatherWanted(int64_t key) {
  const std::vector<int64_t> &wanted = callKept.wanted;
  return std::find(wanted.begin(), wanted.end(), key) != wanted.end();
}

void forgetGathered(int64_t key) {
  callKept.gathered.erase(key);
  auto &kept = callKept.similarities;
  for (auto it = kept.begin(); it != kept.end();)
    it = it->first.first == key || it->first.second == key ? kept.erase(it)
                                                           : std::next(it);
}

at::Tensor keepSimilarity(int64_t rowsKey, int64_t colsKey, int64_t rows,
                          int64_t cols, const at::TensorOptions &options) {
  const int64_t bytes = rows * cols *
                        static_cast<int64_t>(c10::elementSize(
                            c10::typeMetaToScalarType(options.dtype())));
  if (!haveCallSetting || rowsKey < 0 || colsKey < 0 ||
      options.device().type() != c10::DeviceType::CPU ||
      bytes > kKeptSimilarityBytes)
    return {};
  at::Tensor similarity = at::empty({rows, cols}, options);
  callKept.similarities[{rowsKey, colsKey}] = similarity;
  return similarity;
}

at::Tensor keptSimilarity(int64_t rowsKey, int64_t colsKey, int64_t rows,
                          int64_t cols, const at::TensorOptions &options) {
  if (!haveCallSetting)
    return {};
  auto found = callKept.similarities.find({rowsKey, colsKey});
  if (found == callKept.similarities.end())
    return {};
  const at::Tensor &similarity = found->second;
  bool same =
      similarity.size(0) == rows && similarity.size(1) == cols &&
      similarity.scalar_type() == c10::typeMetaToScalarType(options.dtype()) &&
      similarity.device() == options.device();
  if (!same)
    return {};
  keptReads++;
  return similarity;
}

PassCounts passCounts() {
  return {ringPasses.load(), gatherPasses.load(), keptReads.load()};
}

void countPass(Schedule schedule) {
  (schedule == Schedule::Gather ? gatherPasses : ringPasses)++;
}

schedule::Engine engineFor(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? schedule::Engine::Nccl
                                         : schedule::Engine::Gloo;
}

int64_t gatherCrossoverBytes(int worldSize, c10::DeviceType device) {
  return schedule::gatherCrossoverBytes(worldSize, engineFor(device));
}

Schedule chooseSchedule(Schedule setting, const PassSize &size) {
  if (setting != Schedule::Auto)
    return setting;
  if (size.worldSize <= 1)
    return Schedule::Ring;
  return size.globalBytes <= gatherCrossoverBytes(size.worldSize, size.device)
             ? Schedule::Gather
             : Schedule::Ring;
}

} // namespace dloss::fused
