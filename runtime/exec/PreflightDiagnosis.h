// The preflight's diagnosis: what a rank's failed record means and what to do,
// in the same words on every rank.
#ifndef DLOSS_RUNTIME_EXEC_PREFLIGHTDIAGNOSIS_H
#define DLOSS_RUNTIME_EXEC_PREFLIGHTDIAGNOSIS_H

#include "runtime/exec/PreflightIndices.h"
#include "runtime/exec/PreflightRecord.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dloss::preflight {

/// What a rank did wrong, from its record: the same text on every rank,
/// since all of them hold the same plan (checked before this is called).
/// `indexUses` are `function`'s (PreflightIndices.h).
std::string describeFailure(const Record &record, const std::string &name,
                            const PlanFile &plan,
                            const plan::Function *function,
                            const std::vector<IndexUse> &indexUses);

/// What to do about the failures, when they are all of one kind.
std::string failureHint(const std::vector<int64_t> &statuses);

/// "f32, i64, f32": the dtypes of a rank's recorded inputs.
std::string dtypesText(const Record &record);

/// "cpu", "cuda": the kind of device of a record's device code.
std::string deviceTypeText(int64_t code);

/// "0x0000...": a fingerprint or preflight format as messages show it.
std::string hex(int64_t value);

} // namespace dloss::preflight

#endif // DLOSS_RUNTIME_EXEC_PREFLIGHTDIAGNOSIS_H
