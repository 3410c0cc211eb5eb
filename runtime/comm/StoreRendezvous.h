// Connecting ranks through the rendezvous store: the c10d TCPStore (rank 0
// hosts it), the arrival protocol, connection marks.
//
// Internal to the runtime's c10d engine: the store is where the ranks meet,
// where the group's backends bootstrap (under prefixes of their own) and
// where each rank keeps its latest collective (PeerStates).
#ifndef DLOSS_RUNTIME_COMM_STORERENDEZVOUS_H
#define DLOSS_RUNTIME_COMM_STORERENDEZVOUS_H

#include "runtime/comm/Call.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/support/Error.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dloss::comm {

/// "127.0.0.1:29500".
std::string storeAddress(const RendezvousOptions &options);

/// A store value from text, and back.
std::vector<uint8_t> toBytes(const std::string &text);
std::string fromBytes(const std::vector<uint8_t> &bytes);

/// Throws when `options` cannot describe a job; `function`
/// ("connectProcessGroup") starts the message.
void checkOptions(const RendezvousOptions &options,
                  const std::string &function);

/// An error of the rendezvous, on this rank.
Error rendezvousError(const RendezvousOptions &options, std::string problem,
                      std::string hint);

/// Opens the TCPStore (rank 0 hosts it, or a launcher: agentStore) or
/// throws saying why; `otherHolders` names what else may hold the port ("an
/// earlier job"). On a launcher's store, the keys live under
/// "dloss/attempt_<restartCount>", so that two attempts never read each
/// other's.
c10::intrusive_ptr<c10d::Store> openStore(const RendezvousOptions &options,
                                          const std::string &otherHolders);

/// Runs `body` (the rendezvous and the engine's own exchanges through the
/// store), turning a lost store into an error that says so.
void guardStore(const RendezvousOptions &options,
                const std::function<void()> &body);

/// Waits until every rank has announced itself in the store, or fails on
/// every rank alike, naming the ranks that never came. `name` ("the
/// rendezvous") starts the message.
void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point deadline, const std::string &name);

/// Records in the store that this rank reached a step of the connection
/// (under `prefix` + rank).
void setMark(c10d::Store &store, const std::string &prefix, int rank,
             const std::string &value);

/// ": ranks 1, 3 <never> (check whether they died or failed)" for the peers
/// without a mark under `prefix`; empty when all have one; a clause naming
/// rank 0 when the store is gone.
std::string unmarkedPeers(c10d::Store &store, const RendezvousOptions &options,
                          const std::string &prefix, const std::string &never);

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_STORERENDEZVOUS_H
