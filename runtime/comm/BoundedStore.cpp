// A store connection whose operations run on a worker of its own, each
// within a bound, failures classed by torch's exception type.
#include "runtime/comm/BoundedStore.h"

#include "runtime/comm/Call.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace dloss::comm {

namespace {

std::vector<uint8_t> toBytes(const std::string &text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string fromBytes(const std::vector<uint8_t> &bytes) {
  return std::string(bytes.begin(), bytes.end());
}

/// Why the store is lost, from the exception that said so.
std::string lostReason(const std::string &what, const std::string &failure) {
  return what + " stopped answering (" + failure +
         "): the store's host has exited, or this host is cut off from it";
}

} // namespace

struct BoundedStore::State {
  struct Job {
    std::function<void(c10d::Store &)> op;
    /// The key of a post (nobody waits for it); empty otherwise.
    std::string postedKey;
    bool done = false;
    /// The store answered that its wait ran out (StoreTimeout's text).
    std::optional<std::string> timedOut;
    /// The op failed otherwise, or the store was lost before it ran.
    bool lost = false;
  };

  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::shared_ptr<Job>> jobs;
  bool stop = false;
  bool stuck = false;
  bool connecting = true;
  bool busy = false; // running a job
  std::chrono::milliseconds deadline{0};
  /// The first failure's reason; every later operation fails with it.
  std::string lost;

  void serve(const Connect &connect, const std::string &what);
};

void BoundedStore::State::serve(const Connect &connect,
                                const std::string &what) {
  Connection connection;
  try {
    connection = connect([this] {
      std::lock_guard<std::mutex> lock(mutex);
      return stop;
    });
  } catch (const std::exception &e) {
    std::lock_guard<std::mutex> lock(mutex);
    lost = lostReason(what, describeError(e));
  }
  std::unique_lock<std::mutex> lock(mutex);
  connecting = false;
  changed.notify_all();
  std::chrono::milliseconds applied{0};
  while (true) {
    changed.wait(lock, [&] { return stop || !jobs.empty(); });
    // Queued posts are dropped: at the process's end the store's host may
    // have left already, and a send to it makes torch log a broken pipe
    // with a backtrace. (Nobody waits in run() once the store is being
    // destroyed.)
    if (stop)
      return;
    std::shared_ptr<Job> job = jobs.front();
    jobs.pop_front();
    if (!lost.empty()) {
      job->lost = true;
    } else {
      std::chrono::milliseconds timeout = connection.own && deadline != applied
                                              ? deadline
                                              : std::chrono::milliseconds(0);
      busy = true;
      lock.unlock();
      std::optional<std::string> failure;
      try {
        if (timeout.count() > 0) {
          connection.store->setTimeout(timeout);
          applied = timeout;
        }
        job->op(*connection.store);
      } catch (const c10::DistStoreError &e) {
        // A wait that ran out: the store answered, the connection is fine.
        // (A post, a set, never waits: its failure is the connection's.)
        if (job->postedKey.empty())
          job->timedOut = describeError(e);
        else
          failure = describeError(e);
      } catch (const std::exception &e) {
        // c10::DistNetworkError (broken pipe, reset, refused), another
        // c10::DistError, or an error of the store's own: the connection's
        // state is unknown.
        failure = describeError(e);
      } catch (...) {
        failure = "an exception that is not a std::exception";
      }
      lock.lock();
      busy = false;
      if (failure) {
        if (lost.empty())
          lost = lostReason(what, *failure);
        job->lost = true;
      }
    }
    job->done = true;
    changed.notify_all();
  }
}

BoundedStore::BoundedStore(Connect connect, std::chrono::milliseconds deadline,
                           std::string what, Margin margin)
    : state(std::make_shared<State>()), what(std::move(what)), margin(margin) {
  state->deadline = deadline;
  worker = std::thread([state = state, connect = std::move(connect),
                        name = this->what] { state->serve(connect, name); });
}

std::shared_ptr<BoundedStore>
BoundedStore::over(c10::intrusive_ptr<c10d::Store> store, bool clone,
                   std::chrono::milliseconds deadline, std::string what,
                   Margin margin) {
  return std::make_shared<BoundedStore>(
      [store, clone](const std::function<bool()> &) {
        if (clone) {
          try {
            return Connection{store->clone(), /*own=*/true};
          } catch (const c10::DistError &) {
            throw; // A clone that cannot connect: the host is unreachable.
          } catch (const std::exception &) {
            // A store with no clone (NotImplementedError, or a Python
            // store's missing override): the store itself.
          }
        }
        return Connection{store, /*own=*/false};
      },
      deadline, std::move(what), margin);
}

BoundedStore::~BoundedStore() {
  bool leave;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->stop = true;
    // A worker still connecting or stuck waits on a peer that may be gone,
    // until the deadline: the process does not wait for it.
    leave = state->stuck || state->connecting;
  }
  state->changed.notify_all();
  if (leave)
    worker.detach();
  else
    worker.join();
}

void BoundedStore::setDeadline(std::chrono::milliseconds deadline) {
  std::lock_guard<std::mutex> lock(state->mutex);
  state->deadline = deadline;
}

std::chrono::milliseconds
BoundedStore::boundFor(std::chrono::milliseconds wait) const {
  if (margin == Margin::None)
    return wait;
  return wait +
         std::max<std::chrono::milliseconds>(std::chrono::seconds(2), wait / 2);
}

void BoundedStore::run(std::function<void(c10d::Store &)> op,
                       std::chrono::milliseconds bound) {
  auto job = std::make_shared<State::Job>();
  job->op = std::move(op);
  std::unique_lock<std::mutex> lock(state->mutex);
  if (!state->lost.empty())
    throw StoreLost(state->lost);
  state->jobs.push_back(job);
  state->changed.notify_all();
  if (!state->changed.wait_for(lock, bound, [&] { return job->done; })) {
    state->stuck = true;
    if (state->lost.empty())
      state->lost = what + " did not answer within " + seconds(bound) +
                    ": this host may be cut off from the store's host, or "
                    "that host has exited or is frozen";
    throw StoreLost(state->lost);
  }
  if (job->lost)
    throw StoreLost(state->lost);
  if (job->timedOut)
    throw StoreTimeout(what + ": " + *job->timedOut);
}

std::chrono::milliseconds BoundedStore::deadlineBound() const {
  std::lock_guard<std::mutex> lock(state->mutex);
  return boundFor(state->deadline);
}

void BoundedStore::set(const std::string &key, const std::string &value) {
  run([key, value](c10d::Store &s) { s.set(key, toBytes(value)); },
      deadlineBound());
}

std::string BoundedStore::get(const std::string &key) {
  auto out = std::make_shared<std::string>();
  run([out, key](c10d::Store &s) { *out = fromBytes(s.get(key)); },
      deadlineBound());
  return *out;
}

bool BoundedStore::check(const std::vector<std::string> &keys) {
  auto out = std::make_shared<bool>(false);
  run([out, keys](c10d::Store &s) { *out = s.check(keys); }, deadlineBound());
  return *out;
}

void BoundedStore::wait(const std::vector<std::string> &keys,
                        std::chrono::milliseconds timeout) {
  run([keys, timeout](c10d::Store &s) { s.wait(keys, timeout); },
      boundFor(timeout));
}

std::vector<std::string>
BoundedStore::multiGet(const std::vector<std::string> &keys) {
  auto out = std::make_shared<std::vector<std::string>>();
  run(
      [out, keys](c10d::Store &s) {
        for (const std::vector<uint8_t> &value : s.multiGet(keys))
          out->push_back(fromBytes(value));
      },
      deadlineBound());
  return *out;
}

std::string BoundedStore::compareSet(const std::string &key,
                                     const std::string &expected,
                                     const std::string &desired) {
  auto out = std::make_shared<std::string>();
  run(
      [out, key, expected, desired](c10d::Store &s) {
        *out =
            fromBytes(s.compareSet(key, toBytes(expected), toBytes(desired)));
      },
      deadlineBound());
  return *out;
}

bool BoundedStore::deleteKey(const std::string &key) {
  auto out = std::make_shared<bool>(false);
  run([out, key](c10d::Store &s) { *out = s.deleteKey(key); }, deadlineBound());
  return *out;
}

void BoundedStore::post(const std::string &key, const std::string &value) {
  auto op = [key, value](c10d::Store &s) { s.set(key, toBytes(value)); };
  std::lock_guard<std::mutex> lock(state->mutex);
  if (!state->lost.empty())
    throw StoreLost(state->lost);
  for (auto &job : state->jobs)
    if (job->postedKey == key) {
      job->op = op;
      return;
    }
  auto job = std::make_shared<State::Job>();
  job->postedKey = key;
  job->op = op;
  state->jobs.push_back(std::move(job));
  state->changed.notify_all();
}

bool BoundedStore::settled() const {
  std::lock_guard<std::mutex> lock(state->mutex);
  return !state->connecting && !state->busy && !state->stuck &&
         state->lost.empty() && state->jobs.empty();
}

bool BoundedStore::connecting() const {
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->connecting;
}

std::string BoundedStore::failure() const {
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->lost;
}

} // namespace dloss::comm
