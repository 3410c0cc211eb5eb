// A Communicator over a c10d ProcessGroup that already exists: the group
// connectProcessGroup builds, or the one a training script has
// (torch.distributed's).
#ifndef DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H
#define DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H

#include "runtime/comm/Communicator.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace dloss {

/// The communicator of `group`: its rank and size, its backends (Gloo moves
/// CPU tensors, NCCL CUDA ones: the engine is chosen by each tensor's
/// device), and no rendezvous or port of its own. The contract (argument
/// checks, numbering, flight record, deadlines of `options.timeout`) is every
/// engine's; `store` (the group's own, or null) is where each rank records
/// its latest collective, so that a failure can name the peers that never
/// arrived. `options`' rank and world size are taken from the group; its
/// masterAddr/masterPort only name the store in messages (masterPort 0: "the
/// process group's store").
///
/// `ownGroup`: the group was built for this communicator
/// (connectProcessGroup). Every rank then waits for the others once (a
/// one-element allreduce) before this returns, and the communicator shuts
/// the group's NCCL backend down when it goes. A user's group is left as it
/// is.
///
/// Deadlines: a CUDA collective or transfer that outlives its deadline
/// aborts the group (ProcessGroup::abort ends NCCL's kernels that wait for a
/// dead peer). A Gloo one has no cancellation in c10d: it leaves the group
/// busy until the group's own timeout. Either way the communicator refuses
/// every later call.
std::unique_ptr<Communicator>
makeProcessGroupCommunicator(RendezvousOptions options,
                             c10::intrusive_ptr<c10d::Store> store,
                             c10::intrusive_ptr<c10d::ProcessGroup> group,
                             bool ownGroup = false);

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H
