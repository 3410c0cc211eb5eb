// A connection to a c10d store whose every operation ends in time, with its
// failures told apart by the exception torch raised.
//
// torch's store clients wait for each reply with no limit of their own (a
// TCPStore's check, set and compare_set wait forever; a get or wait waits
// the store's timeout, often 30 minutes), so a rank cut off from the store's
// host would hang. Here each operation runs on a worker thread of the
// connection's own, and one that has not answered within its bound fails, as
// does every later one (the worker is stuck on a connection that no longer
// answers; it is left to the process's end). The worker also makes the
// connection, so that nobody waits for it: a TCPStore connection costs a name
// lookup at each end, which a resolver that drops the query stretches to 5 s.
//
// Failures, by type (never by message text):
// - StoreTimeout: torch raised c10::DistStoreError, the store's answer that
//   a wait (or a get of a key nobody set) ran out of time. The connection is
//   as good as before (TCPStore cancels the wait on the server).
// - StoreLost: anything else (c10::DistNetworkError: broken pipe, connection
//   reset or refused; another c10::DistError; no answer within the bound).
//   The first such failure is kept, and every later operation throws it
//   again without touching the connection: sending to a host that is gone
//   makes torch log a warning and a backtrace each time.
//
// Both dloss's peer records (PeerStates) and dloss.guard (as
// dloss._C.BoundedStore) use it.
#ifndef DLOSS_RUNTIME_COMM_BOUNDEDSTORE_H
#define DLOSS_RUNTIME_COMM_BOUNDEDSTORE_H

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dloss::comm {

/// The store answered that the wait ran out (c10::DistStoreError); the
/// connection is still usable.
class StoreTimeout : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The store cannot be reached: its host has exited, or this host is cut off
/// from it. what() is the first failure's reason; every later operation
/// throws it again.
class StoreLost : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class BoundedStore {
public:
  /// The connection the worker makes. `own`: nobody else uses `store`, so
  /// the worker may set its timeout to the deadline (a clone, or a store of
  /// dloss's own); else the store keeps its owner's timeout.
  struct Connection {
    c10::intrusive_ptr<c10d::Store> store;
    bool own = false;
  };
  /// Makes the connection; its argument says whether the BoundedStore is
  /// being destroyed (a connect that waits for something should give up).
  using Connect =
      std::function<Connection(const std::function<bool()> &stopping)>;

  /// How long past its own wait an operation may take to answer: none, or
  /// time for the server's answer that a wait ran out to arrive before this
  /// side gives up (max(2 s, half the wait)).
  enum class Margin { None, ServerReply };

  /// `deadline`: the store's own timeout (where the connection is `own`)
  /// and the bound of every operation but a wait, plus `margin`. `what`
  /// names the store in errors ("the store", "the rendezvous store at
  /// host:port").
  BoundedStore(Connect connect, std::chrono::milliseconds deadline,
               std::string what, Margin margin = Margin::ServerReply);
  /// A connection to `store`: where `clone`, its clone (so that the
  /// caller's connection and timeout stay theirs), falling back to `store`
  /// itself where it has no clone (a HashStore).
  static std::shared_ptr<BoundedStore>
  over(c10::intrusive_ptr<c10d::Store> store, bool clone,
       std::chrono::milliseconds deadline, std::string what,
       Margin margin = Margin::ServerReply);
  /// Stops the worker: queued posts are dropped, not sent (the store's
  /// host may be gone: sending makes torch log a broken pipe). A worker
  /// still connecting, or stuck, is left behind.
  ~BoundedStore();
  BoundedStore(const BoundedStore &) = delete;
  BoundedStore &operator=(const BoundedStore &) = delete;

  /// A new deadline for later operations (and the store's own timeout,
  /// where the connection is its own).
  void setDeadline(std::chrono::milliseconds deadline);
  /// The bound of an operation that waits `wait` on the server.
  std::chrono::milliseconds boundFor(std::chrono::milliseconds wait) const;

  void set(const std::string &key, const std::string &value);
  /// Waits for `key` up to the store's timeout.
  std::string get(const std::string &key);
  /// Whether every key in `keys` is set.
  bool check(const std::vector<std::string> &keys);
  bool check(const std::string &key) {
    return check(std::vector<std::string>{key});
  }
  /// Waits until every key is set, or throws StoreTimeout after `timeout`.
  void wait(const std::vector<std::string> &keys,
            std::chrono::milliseconds timeout);
  std::vector<std::string> multiGet(const std::vector<std::string> &keys);
  /// Sets `key` to `desired` where it holds `expected` ("": unset); returns
  /// the value it holds after.
  std::string compareSet(const std::string &key, const std::string &expected,
                         const std::string &desired);
  /// Whether `key` was set.
  bool deleteKey(const std::string &key);
  /// Queues `key` = `value` and returns; a later post of the same key
  /// replaces a queued one, and a waited-for operation runs after every
  /// queued post. Throws only when an earlier operation failed.
  void post(const std::string &key, const std::string &value);

  /// Whether the connection is made, answers, and every queued operation
  /// ran.
  bool settled() const;
  /// Whether the worker is still making the connection.
  bool connecting() const;
  /// The first failure's reason (StoreLost's text); "" while none.
  std::string failure() const;

private:
  struct State;
  /// Runs `op` on the worker, within `bound`; rethrows its failure.
  void run(std::function<void(c10d::Store &)> op,
           std::chrono::milliseconds bound);
  /// The bound of an operation that waits at most the deadline.
  std::chrono::milliseconds deadlineBound() const;

  std::shared_ptr<State> state;
  std::string what;
  Margin margin;
  std::thread worker;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_BOUNDEDSTORE_H
