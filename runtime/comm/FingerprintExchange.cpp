// FingerprintExchange (FingerprintExchange.h): a MAX over two int64, by
// Gloo's ring or by recursive doubling on a thread of its own.
#include "runtime/comm/FingerprintExchange.h"

#include <ATen/ATen.h>

#include "runtime/support/Error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

namespace dloss::comm {

struct FingerprintExchange::State {
  c10::intrusive_ptr<c10d::Backend> side;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::shared_ptr<Request>> queue;
  bool stop = false;
  bool doubling = false;
};

namespace {

/// Whether `world` ranks exchange by recursive doubling: past the ring's
/// size, or as DLOSS_GUARD_EXCHANGE says.
bool useDoubling(int world) {
  const char *forced = std::getenv("DLOSS_GUARD_EXCHANGE");
  if (!forced || !*forced)
    return world > FingerprintExchange::kRingWorld;
  if (std::strcmp(forced, "ring") == 0)
    return false;
  if (std::strcmp(forced, "doubling") == 0)
    return true;
  throw Error("DLOSS_GUARD_EXCHANGE is '" + std::string(forced) +
                  "', not 'ring' or 'doubling'",
              "Unset it (dloss.guard then picks by the world size), or set "
              "it to ring or doubling");
}

} // namespace

bool FingerprintExchange::Request::waitUntil(
    std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex);
  return changed.wait_until(lock, until, [&] { return ended; });
}

FingerprintExchange::FingerprintExchange(c10::intrusive_ptr<c10d::Backend> side)
    : state(std::make_shared<State>()) {
  state->side = std::move(side);
  state->doubling = useDoubling(state->side->getSize());
  if (state->doubling)
    std::thread([state = state] { serve(state); }).detach();
}

bool FingerprintExchange::doubling() const { return state->doubling; }

FingerprintExchange::~FingerprintExchange() {
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->stop = true;
  }
  state->changed.notify_all();
}

std::shared_ptr<FingerprintExchange::Request>
FingerprintExchange::start(std::array<int64_t, 2> values) {
  auto request = std::make_shared<Request>();
  request->values = values;
  if (!state->doubling) {
    at::Tensor both = at::empty({2}, at::kLong);
    std::memcpy(both.data_ptr<int64_t>(), values.data(), sizeof(values));
    std::vector<at::Tensor> tensors{both};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    auto end = [request, both](const std::string &failure) {
      {
        std::lock_guard<std::mutex> lock(request->mutex);
        request->failure = failure;
        std::memcpy(request->values.data(), both.data_ptr<int64_t>(),
                    sizeof(request->values));
        request->ended = true;
      }
      request->changed.notify_all();
    };
    try {
      state->side->allreduce(tensors, opts)
          ->getFuture()
          ->addCallback([end](c10::ivalue::Future &future) {
            end(future.hasError() ? "the side all-reduce failed: " +
                                        future.tryRetrieveErrorMessage()
                                  : "");
          });
    } catch (const std::exception &e) {
      end(e.what()); // a peer's side connection is closed
    }
    return request;
  }
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->queue.push_back(request);
  }
  state->changed.notify_all();
  return request;
}

void FingerprintExchange::serve(const std::shared_ptr<State> &state) {
  // The thread is detached and owns `state`: a destructor that waited for
  // an exchange stuck on a peer that never came would wait for Gloo's
  // timeout.
  for (;;) {
    std::shared_ptr<Request> request;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->changed.wait(lock,
                          [&] { return state->stop || !state->queue.empty(); });
      if (state->stop)
        return;
      request = std::move(state->queue.front());
      state->queue.pop_front();
    }
    std::string failure;
    try {
      exchange(*state->side, *request);
    } catch (const std::exception &e) {
      failure = e.what();
      if (failure.empty())
        failure = "the side exchange failed";
    }
    {
      std::lock_guard<std::mutex> lock(request->mutex);
      request->failure = std::move(failure);
      request->ended = true;
    }
    request->changed.notify_all();
  }
}

void FingerprintExchange::exchange(c10d::Backend &side, Request &request) {
  const int rank = side.getRank();
  const int world = side.getSize();
  at::Tensor mine = at::empty({2}, at::kLong);
  at::Tensor theirs = at::empty({2}, at::kLong);
  int64_t *value = mine.data_ptr<int64_t>();
  const int64_t *other = theirs.data_ptr<int64_t>();
  value[0] = request.values[0];
  value[1] = request.values[1];
  auto combine = [&] {
    value[0] = std::max(value[0], other[0]);
    value[1] = std::max(value[1], other[1]);
  };
  std::vector<at::Tensor> send{mine};
  std::vector<at::Tensor> recv{theirs};
  // Tags: 0 folds the ranks beyond the largest power of two into their
  // neighbours, 1 + k is round k, and 63 hands the result back.
  constexpr int kFold = 0, kResult = 63;
  int pow2 = 1;
  while (pow2 * 2 <= world)
    pow2 *= 2;
  const int extra = world - pow2;
  int virtualRank;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      side.send(send, rank + 1, kFold)->wait();
      side.recv(recv, rank + 1, kResult)->wait();
      value[0] = other[0];
      value[1] = other[1];
      request.values = {value[0], value[1]};
      return;
    }
    side.recv(recv, rank - 1, kFold)->wait();
    combine();
    virtualRank = rank / 2;
  } else {
    virtualRank = rank - extra;
  }
  int round = 0;
  for (int mask = 1; mask < pow2; mask <<= 1, ++round) {
    int virtualPeer = virtualRank ^ mask;
    int peer = virtualPeer < extra ? virtualPeer * 2 + 1 : virtualPeer + extra;
    auto received = side.recv(recv, peer, 1 + round);
    auto sent = side.send(send, peer, 1 + round);
    received->wait();
    sent->wait();
    combine();
  }
  if (rank < 2 * extra)
    side.send(send, rank - 1, kResult)->wait();
  request.values = {value[0], value[1]};
}

} // namespace dloss::comm
