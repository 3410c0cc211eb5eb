// Each rank's latest collective, kept in the rendezvous store so that a failing
// rank can say which peers never arrived or failed.
//
// Before entering a collective a rank records its number under
// dloss/seq/<rank> ("started"), and its failure when one fails ("failed");
// a rank that hits a failure reads its peers' records to name them. Store
// failures only turn the bookkeeping off: the collective itself reports a
// dead peer.
#ifndef DLOSS_RUNTIME_COMM_PEERSTATES_H
#define DLOSS_RUNTIME_COMM_PEERSTATES_H

#include "runtime/comm/Call.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dloss::comm {

/// A peer's latest collective as it recorded it in the store.
struct PeerState {
  int rank = -1;
  bool known = false;
  int64_t seq = 0;
  std::string state; // "started" or "failed"
  std::string collective;
  CallSite site;
  int64_t unixMs = 0;
  std::string detail;
};

/// This rank's record in the store and its reading of the peers'. Not
/// thread-safe.
class PeerStates {
public:
  /// After a failure that is not a timeout (a closed connection), how long a
  /// rank waits for its peers to record their own failure before naming the
  /// silent ones: a dead rank never records one.
  static constexpr std::chrono::milliseconds kReportGrace{1000};

  PeerStates(c10::intrusive_ptr<c10d::Store> store,
             const RendezvousOptions &options);
  /// A failed rank 0 that hosts the store keeps the store up while its peers
  /// read each other's states.
  ~PeerStates();
  PeerStates(const PeerStates &) = delete;
  PeerStates &operator=(const PeerStates &) = delete;

  /// Records this rank's latest collective `seq` in `state`.
  void publish(int64_t seq, const std::string &state,
               const std::string &collective, const CallSite &site,
               int64_t unixMs, const std::string &detail);
  /// Collective `seq` failed on this rank: records it, reads every peer's
  /// state (waiting up to `grace` for the peers to record a failure) and
  /// says it is done reading. Sets `storeProblem` when the store cannot be
  /// read.
  std::vector<PeerState> failed(const Call &call, const std::string &detail,
                                std::chrono::milliseconds grace,
                                std::string &storeProblem);
  /// One clause per peer for the error of `call`: which never arrived,
  /// failed, are elsewhere or reached it.
  std::string summarize(const Call &call, const std::vector<PeerState> &peers,
                        bool timedOut) const;
  /// "rank 2: failed #7 allGather (...): <detail>", for the flight record.
  static std::string describe(const PeerState &peer);

private:
  std::vector<PeerState> read(std::chrono::milliseconds grace,
                              std::string &storeProblem);

  c10::intrusive_ptr<c10d::Store> store;
  int rank;
  int worldSize;
  /// Rank 0 hosts the store (no launcher does).
  bool hostsStore;
  std::string storeAt;
  /// The number of the collective that failed; -1 while healthy.
  int64_t failedSeq = -1;
  /// False once a store operation failed: the bookkeeping stops.
  bool usable = true;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_PEERSTATES_H
