// A collective refused by a layer between dloss and the group's backend.
//
// dloss.guard checks in Python, called from the group's backend
// (GuardedBackend.h): when it refuses one of dloss's collectives, its error
// crosses c10d as a bare exception, which would read as a failed collective
// (the communicator would then wait for its peers' records and name them). It
// leaves its error here first, on the calling thread; the communicator raises
// that error as it is.
#ifndef DLOSS_RUNTIME_COMM_REFUSAL_H
#define DLOSS_RUNTIME_COMM_REFUSAL_H

#include "runtime/support/Error.h"

#include <optional>

namespace dloss::comm {

/// Records this thread's refusal of the collective it is starting.
void refuseCollective(ErrorInfo refusal);

/// This thread's refusal, once; nullopt when there is none.
std::optional<ErrorInfo> takeRefusal();

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_REFUSAL_H
