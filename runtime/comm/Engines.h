// The engines' factories: the communicators the runtime builds, over a c10d
// group (the user's or one of its own) or a single process, each engine a
// ContractCommunicator (ContractCommunicator.h). They are implemented in
// ConnectProcessGroup.cpp, ProcessGroupCommunicator.cpp and
// SingleProcessCommunicator.cpp.
#ifndef DLOSS_RUNTIME_COMM_ENGINES_H
#define DLOSS_RUNTIME_COMM_ENGINES_H

#include "runtime/comm/Communicator.h"
#include "runtime/comm/RendezvousOptions.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace dloss {

/// The c10d group of a job that has none yet (dloss-run, the C++ JIT), as
/// init_process_group() builds it: over a c10d TCPStore (rank 0 hosts it,
/// or the launcher), Gloo moves CPU tensors and, where torch has NCCL and
/// this process sees a GPU, c10d's ProcessGroupNCCL moves CUDA tensors on
/// each tensor's device (set the current device to LOCAL_RANK's first). The
/// communicator runs on it through the c10d engine
/// (makeProcessGroupCommunicator).
/// Returns once every rank has joined, or raises dloss::Error at the
/// deadline naming the ranks that never arrived.
///
/// Every collective is numbered; before entering one, a rank of a group of
/// two or more records its number in the store (key dloss/seq/<rank>). In a
/// group of one every collective is the identity, and nothing goes through
/// the group or the store. When a collective fails (its
/// deadline passed, a peer closed its connection), the error names the
/// collective, its number, the call site, and each peer's state read from
/// the store: which ranks never arrived (their number is behind), which
/// failed and why. The rank's last 64 collectives are written as JSON to
/// RendezvousOptions::flightDir and the error gives the path. A CUDA
/// collective past its deadline aborts the group's NCCL communicators.
std::unique_ptr<Communicator>
connectProcessGroup(const RendezvousOptions &options);

/// The communicator of a single process (world size 1): every collective is
/// the identity. Used for single-device reference runs.
std::unique_ptr<Communicator> makeSingleProcessCommunicator();

/// The c10d engine: the communicator of a c10d ProcessGroup that already
/// exists (the group connectProcessGroup builds, or torch.distributed's of a
/// training script): its rank and size, its backends (Gloo moves
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
std::unique_ptr<Communicator> makeProcessGroupCommunicator(
    RendezvousOptions options, c10::intrusive_ptr<c10d::Store> store,
    c10::intrusive_ptr<c10d::ProcessGroup> group, bool ownGroup = false);

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_ENGINES_H
