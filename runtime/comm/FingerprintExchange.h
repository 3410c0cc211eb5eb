// FingerprintExchange: the all-reduce under dloss.guard's check of each op,
// MAX over two int64, by the algorithm that suits the world size.
//
// Each rank contributes (hash, -hash) of its op's fingerprint; the MAX of
// both says whether every rank's hash is the same. It runs on a side Gloo
// backend over the group's ranks:
// - up to kRingWorld ranks, as that backend's own all-reduce (a ring of
//   2(W-1) steps on Gloo's worker thread);
// - beyond, by recursive doubling over its sends and recvs: ceil(log2 W)
//   rounds (one more each way for the ranks beyond the largest power of
//   two), where the ring's latency grows with W (at 1,024 ranks, ten rounds
//   instead of two thousand steps). It runs on a thread of its own,
//   because a Gloo recv can be waited for only once, to its end or to its
//   timeout, while the checking rank must wake every poll interval (to
//   record a slow op and learn of a peer that gave up) and give up at the
//   guard's deadline.
// The crossover is measured (bench/guard_bench.py, 2-core machine, one
// thread per rank): at 32 ranks a ring step cost 0.14 ms and a doubling
// round 3.6 ms (Gloo's sends and recvs cost far more per message than its
// ring's steps), so the ring wins up to about 100 ranks.
// DLOSS_GUARD_EXCHANGE=ring or doubling forces one (for tests and
// benchmarks).
#ifndef DLOSS_RUNTIME_COMM_FINGERPRINTEXCHANGE_H
#define DLOSS_RUNTIME_COMM_FINGERPRINTEXCHANGE_H

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

namespace dloss::comm {

class FingerprintExchange {
public:
  /// One rank's contribution, and the MAX over every rank's once `ended`.
  struct Request {
    std::array<int64_t, 2> values{};
    std::mutex mutex;
    std::condition_variable changed;
    bool ended = false;
    /// Why the exchange failed (a peer's connection closed, Gloo's
    /// timeout); empty when it succeeded.
    std::string failure;

    /// Waits until the exchange ends or `until`; whether it ended.
    bool waitUntil(std::chrono::steady_clock::time_point until);
  };

  /// The largest world that uses the ring.
  static constexpr int kRingWorld = 64;

  /// Exchanges over `side`, a backend over the group's ranks that no one
  /// else uses.
  explicit FingerprintExchange(c10::intrusive_ptr<c10d::Backend> side);
  /// Ends the thread; one still in an exchange (a peer never came) is left
  /// to end at the side backend's timeout.
  ~FingerprintExchange();
  FingerprintExchange(const FingerprintExchange &) = delete;
  FingerprintExchange &operator=(const FingerprintExchange &) = delete;

  /// Starts the exchange of `values`, after every earlier one.
  std::shared_ptr<Request> start(std::array<int64_t, 2> values);

  /// Whether this exchange uses recursive doubling.
  bool doubling() const;

private:
  struct State;
  static void serve(const std::shared_ptr<State> &state);
  static void exchange(c10d::Backend &side, Request &request);

  std::shared_ptr<State> state;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_FINGERPRINTEXCHANGE_H
