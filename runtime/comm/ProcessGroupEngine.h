// A Communicator over a c10d ProcessGroup that already exists: the group
// connectGloo builds, or the one a training script has (torch.distributed's).
#ifndef DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H
#define DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H

#include "runtime/comm/Communicator.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace dloss {

/// The communicator of `group`: its rank and size, its backend (Gloo moves
/// CPU tensors, NCCL CUDA ones), and no rendezvous or port of its own. The
/// contract (argument checks, numbering, flight record, deadlines of
/// `options.timeout`) is every engine's; `store` (the group's own, or null)
/// is where each rank records its latest collective, so that a failure can
/// name the peers that never arrived. `options`' rank and world size are
/// taken from the group; its masterAddr/masterPort only name the store in
/// messages (masterPort 0: "the process group's store"). `checkConnection` makes every rank wait for the
/// others once (a one-element allreduce) before returning.
///
/// A collective that outlives its deadline leaves the group busy until the
/// group's own timeout (c10d has no cancellation): the communicator refuses
/// every later call, and the process may wait for the group's timeout when
/// it exits.
std::unique_ptr<Communicator>
makeProcessGroupCommunicator(RendezvousOptions options,
                             c10::intrusive_ptr<c10d::Store> store,
                             c10::intrusive_ptr<c10d::ProcessGroup> group,
                             bool checkConnection = false);

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_PROCESSGROUPENGINE_H
