// FingerprintExchange: the all-reduce under dloss.guard's check of each op,
// MAX over two int64 by recursive doubling, on a thread of its own.
//
// Each rank contributes (hash, -hash) of its op's fingerprint; the MAX of
// both says whether every rank's hash is the same. The exchange runs over a
// side Gloo backend's sends and recvs in ceil(log2 W) rounds (one more each
// way for the ranks beyond the largest power of two), where Gloo's own
// all-reduce takes a ring's 2(W-1) steps: at a thousand ranks, ten round
// trips instead of two thousand. It runs on a thread of its own because a
// Gloo recv can only be waited for once, to the end or to its timeout, while
// the rank that checks must wake every poll interval (to record a slow op
// and to learn of a peer that gave up) and give up at the guard's deadline.
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

  /// Exchanges over `side`, a backend over the group's ranks whose sends
  /// and recvs no one else uses.
  explicit FingerprintExchange(c10::intrusive_ptr<c10d::Backend> side);
  /// Ends the thread; one still in an exchange (a peer never came) is left
  /// to end at the side backend's timeout.
  ~FingerprintExchange();
  FingerprintExchange(const FingerprintExchange &) = delete;
  FingerprintExchange &operator=(const FingerprintExchange &) = delete;

  /// Starts the exchange of `values`, after every earlier one.
  std::shared_ptr<Request> start(std::array<int64_t, 2> values);

private:
  struct State;
  static void serve(const std::shared_ptr<State> &state);
  static void exchange(c10d::Backend &side, Request &request);

  std::shared_ptr<State> state;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_FINGERPRINTEXCHANGE_H
