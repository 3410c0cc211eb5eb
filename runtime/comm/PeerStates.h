// Each rank's latest collective, kept in the rendezvous store so that a failing
// rank can say which peers never arrived or failed.
//
// Before entering a collective a rank records its number under
// dloss/seq/<rank> ("started"), and its failure when one fails ("failed");
// a process that exits records why under dloss/left/<rank> (dloss/group.py
// hooks Python's exit). A failure, and an exit by an exception, also set
// dloss/alarm, which a rank waiting in a collective checks now and then, so
// that it stops waiting for a peer that will never come. On its way out,
// a store's host waits (a few seconds at most) for the peers' exit records,
// each peer's last write, so that no peer sends to a host that has left. A
// rank that hits a failure reads its peers' records to name them, leading
// with the root cause: the first rank that left or failed on its own. Store
// failures only turn the bookkeeping off (keeping the first one's reason for
// the report): the collective itself reports a dead peer.
//
// The records are kept twice, so that they outlive the exit of the store's
// host (rank 0 for env:// groups, mp.spawn and Lightning's launcher, which
// may end at once, by os._exit or a kill): in the group's store, and in a
// mirror that the last rank hosts (a TCPStore of dloss's own, whose address
// it leaves in the group's store). The records are lost only when both
// rank 0 and the last rank leave before a peer reads them. Every record
// goes to both; a read goes to the group's store until it stops answering,
// then to the mirror. A peer that reaches its failure after rank 0 left
// still reads why everyone left. Every store operation ends within dloss's
// deadline (BoundedStore.h): the group's store waits the user's timeout,
// often 30 minutes, and a TCPStore's check waits for its reply with no
// timeout at all, so a rank cut off from the store's host would otherwise
// hang. No rank waits on its way into a collective: the connections are
// made, and the record of entering a collective is written, by the store's
// worker thread.
#ifndef DLOSS_RUNTIME_COMM_PEERSTATES_H
#define DLOSS_RUNTIME_COMM_PEERSTATES_H

#include "runtime/comm/Call.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/RendezvousOptions.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dloss::comm {

class BoundedStore;

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
  /// Its exit record (dloss/left/<rank>), when it recorded one.
  bool exited = false;
  Communicator::PeerExit exit;
  /// The collectives it had started when it exited.
  int64_t exitSeq = 0;
};

/// The first rank(s) that left or failed on their own, and what to do.
struct RootCause {
  std::vector<int> ranks; // Empty: unknown.
  std::string text;       // "rank 1 exited after raising ..."
  /// What to do; empty for ranks that went silent (the engine's hint
  /// stands).
  std::string hint;
  /// Whether the ranks recorded nothing: the summary still gives their
  /// latest collectives.
  bool silent = false;
};

/// This rank's record in the store and its reading of the peers'. Not
/// thread-safe.
class PeerStates {
public:
  /// After a failure that is not a timeout (a closed connection), how long a
  /// rank waits for its peers to record their own failure before naming the
  /// silent ones: a dead rank never records one.
  static constexpr std::chrono::milliseconds kReportGrace{1000};

  /// `ownStore`: dloss made `store` for this group (connectProcessGroup),
  /// and uses it as it is; else it makes a connection of its own.
  PeerStates(c10::intrusive_ptr<c10d::Store> store,
             const RendezvousOptions &options, bool ownStore);
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
  /// failed, exited, are elsewhere or reached it; the ranks in `named` (the
  /// root cause, said already) are left out.
  std::string summarize(const Call &call, const std::vector<PeerState> &peers,
                        bool timedOut,
                        const std::vector<int> &named = {}) const;
  /// "rank 2: failed #7 allGather (...): <detail>", for the flight record.
  static std::string describe(const PeerState &peer);

  /// Records that this process is exiting after `seq` collectives, and why;
  /// `afterFailure`: its communicator had failed already.
  void recordExit(int64_t seq, const std::string &reason, bool raised,
                  bool afterFailure);
  /// While a rank waits in `call`: why it should stop waiting (a peer
  /// failed in a collective, or exited before reaching this one), or "".
  /// One store query unless some rank has recorded a failure or an exit.
  std::string doomed(const Call &call);
  /// The first rank that left or failed on its own among `peers`; with a
  /// `call` that failed for a closed connection, else the ranks that went
  /// silent (dead without a word). The one rule every report uses.
  RootCause rootCause(const Call *call, const std::vector<PeerState> &peers,
                      bool timedOut) const;
  /// When the group's store stopped answering and the records were read
  /// from the mirror: a clause saying so (where, since when), else "".
  std::string lostStoreClause() const;
  /// Whether the mirror holds this rank's records: connected, nothing queued.
  bool mirrorUpToDate();
  /// Every rank's exit record, earliest first (empty when the store cannot
  /// be read).
  std::vector<Communicator::PeerExit> exits();
  /// The peers' states as recorded now (no grace); empty on a store
  /// failure.
  std::vector<PeerState> current();
  /// A rank that hosts a store (rank 0 the group's, the last rank the
  /// mirror) keeps it up, for kFailureLinger at most, while peers that are
  /// failing (or will, waiting for a collective this rank, which has
  /// started `started`, never joins) still read it; after a plain exit
  /// (recordExit), also until the peers that are done with their
  /// collectives have written their exit records, for kExitLinger at most,
  /// so that none writes to a host that has left. Once.
  void keepStoreForPeers(int64_t started);

private:
  // The records' store operations: both copies for a write, the first that
  // answers for a read; each throws only when no copy answers. A put waits
  // for its write, a post queues it.
  void put(const std::string &key, const std::string &value);
  void post(const std::string &key, const std::string &value);
  void write(const std::string &key, const std::string &value, bool wait);
  /// Reads: from `from` where given (the store this rank hosts), else from
  /// the first copy that answers.
  bool has(const std::string &key, BoundedStore *from = nullptr);
  std::string fetch(const std::string &key, BoundedStore *from = nullptr);
  /// The mirror: the last rank hosts it and leaves its address in the
  /// group's store; the others connect once it is there. Both in the
  /// mirror's worker, so that no rank waits for it.
  std::shared_ptr<BoundedStore> makeMirror();
  template <typename Fn> auto firstAnswer(Fn &&fn);
  /// Marks the group's store as no longer answering.
  void loseStore();
  /// Why the group's store stopped answering.
  std::string primaryFailure() const;
  /// Turns the bookkeeping off, keeping the first failure's reason.
  void disable(const std::exception &e);
  bool usable() const { return unusable.empty(); }
  bool hostsMirror() const { return mirrored && rank == worldSize - 1; }

  std::vector<PeerState> read(std::chrono::milliseconds grace,
                              std::string &storeProblem);
  /// Sets kAlarmKey: some rank failed in a collective or exited.
  void raiseAlarm();
  /// Peer `r`'s records (from `from`, as has()); throws on a store
  /// failure.
  PeerState readPeer(int r, BoundedStore *from = nullptr);

  /// The group's store (with dloss's deadline) and the mirror (null where
  /// there is none or it failed); `primaryLost` once the group's store
  /// stopped answering.
  std::shared_ptr<BoundedStore> store;
  std::shared_ptr<BoundedStore> mirror;
  bool primaryLost = false;
  /// Whether a read was answered by the mirror.
  bool readMirror = false;
  int64_t primaryLostUnixMs = 0;
  /// Whether this run keeps a mirror (rank 0 hosts the group's store, and
  /// there is a second rank and an address to reach the store by).
  bool mirrored = false;
  std::string masterAddr;
  int masterPort = 0;
  std::chrono::milliseconds deadline;
  int rank;
  int worldSize;
  /// Rank 0 hosts the store (no launcher does).
  bool hostsStore;
  std::string storeAt;
  /// The number of the collective that failed; -1 while healthy.
  int64_t failedSeq = -1;
  /// The first store failure's reason, after which the bookkeeping stops;
  /// empty while none.
  std::string unusable;
  /// Whether this rank has recorded a plain exit (no exception, no failed
  /// collective).
  bool plainExit = false;
  /// Whether keepStoreForPeers has run.
  bool keptStore = false;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_PEERSTATES_H
