// Connecting ranks through the rendezvous store: the TCPStore, the arrival
// protocol, connection marks.
#include "runtime/comm/StoreRendezvous.h"

#include "runtime/support/Format.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace dloss::comm {

namespace {

// Between two queries of the store.
constexpr std::chrono::milliseconds kStorePoll{20};
// How long rank 0 keeps the store up after a failed rendezvous so that the
// other ranks can read the verdict.
constexpr std::chrono::milliseconds kVerdictLinger{2000};

const char *const kArrivedPrefix = "dloss/arrived/";
const char *const kArrivedCountKey = "dloss/arrived-count";
const char *const kVerdictKey = "dloss/verdict";
const char *const kVerdictAckKey = "dloss/verdict-acks";

std::string arrivedKey(int rank) {
  return kArrivedPrefix + std::to_string(rank);
}

std::vector<int> missingRanks(c10d::Store &store, int worldSize) {
  std::vector<int> missing;
  for (int r = 0; r < worldSize; ++r)
    if (!store.check({arrivedKey(r)}))
      missing.push_back(r);
  return missing;
}

// The first proposal stored wins, so every rank acts on the same verdict:
// "ok", or "missing:<ranks>" from the first rank whose deadline passed.
std::string decide(c10d::Store &store, const std::string &proposal) {
  return fromBytes(store.compareSet(kVerdictKey, {}, toBytes(proposal)));
}

// One TCP connection attempt to `address`, bounded by `limit`: whether
// something accepted it; `detail` says why not.
bool acceptsConnection(const addrinfo &address, std::chrono::milliseconds limit,
                       std::string &detail) {
  int fd = ::socket(address.ai_family,
                    address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    address.ai_protocol);
  if (fd < 0) {
    detail = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  int error = 0;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd waiting{fd, POLLOUT, 0};
      int ready = ::poll(&waiting, 1, static_cast<int>(limit.count()));
      socklen_t length = sizeof(error);
      if (ready <= 0)
        error = ready == 0 ? ETIMEDOUT : errno;
      else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0)
        error = errno;
    }
  }
  ::close(fd);
  if (error != 0)
    detail = std::string("connect: ") + std::strerror(error);
  return error == 0;
}

// Waits until the store's address accepts a TCP connection, trying every
// kStorePoll until `deadline`; the reason of the last failure, or "" once it
// does (or when the address does not resolve: TCPStore then says so itself).
// TCPStore's own client retries with a growing back-off and gave up as late
// as 4 s after a 3 s deadline (seen here with torch 2.13 and 2.14): a rank
// whose store never comes fails at its deadline instead.
std::string waitForListener(const RendezvousOptions &options,
                            Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *addresses = nullptr;
  std::string port = std::to_string(options.masterPort);
  if (::getaddrinfo(options.masterAddr.c_str(), port.c_str(), &hints,
                    &addresses) != 0 ||
      !addresses)
    return "";
  std::string detail = "nothing accepted a connection";
  for (;;) {
    for (addrinfo *a = addresses; a; a = a->ai_next) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (acceptsConnection(*a, std::max(left, std::chrono::milliseconds(1)),
                            detail)) {
        ::freeaddrinfo(addresses);
        return "";
      }
    }
    if (Clock::now() + kStorePoll >= deadline)
      break;
    std::this_thread::sleep_for(kStorePoll);
  }
  ::freeaddrinfo(addresses);
  return detail;
}

} // namespace

std::vector<uint8_t> toBytes(const std::string &text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string fromBytes(const std::vector<uint8_t> &bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string storeAddress(const RendezvousOptions &options) {
  return options.masterAddr + ":" + std::to_string(options.masterPort);
}

void checkOptions(const RendezvousOptions &options,
                  const std::string &function) {
  std::string problem;
  if (options.worldSize < 1)
    problem =
        "world size " + std::to_string(options.worldSize) + " is not positive";
  else if (options.rank < 0 || options.rank >= options.worldSize)
    problem = "rank " + std::to_string(options.rank) +
              " is out of range for world size " +
              std::to_string(options.worldSize);
  else if (options.masterPort < 1 || options.masterPort > 65535)
    problem = "master port " + std::to_string(options.masterPort) +
              " is not a TCP port";
  else if (options.timeout.count() <= 0)
    problem = "the timeout (" + std::to_string(options.timeout.count()) +
              " ms) is not positive";
  else if (options.masterAddr.empty())
    problem = "the master address is empty";
  if (!problem.empty())
    throw Error(function + ": " + problem,
                "Pass RANK in [0, WORLD_SIZE), a MASTER_PORT in [1, 65535], "
                "a non-empty MASTER_ADDR and a positive DLOSS_TIMEOUT_S");
}

Error rendezvousError(const RendezvousOptions &options, std::string problem,
                      std::string hint) {
  ErrorInfo info;
  info.problem = std::move(problem);
  info.hint = std::move(hint);
  info.rank = options.rank;
  return Error(std::move(info));
}

// A peer that dies mid-transfer must fail this rank's call with an error that
// names it, not kill the rank: torch 2.x's Gloo pairs and TCPStore write to
// sockets that may raise SIGPIPE (seen here: a rank killed by signal 13 when
// its peer exited). Every process that connects through dloss therefore
// ignores SIGPIPE, as Python does from startup, unless the program installed
// a handler of its own.
static void ignoreBrokenPipes() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
}

// Rank 0 hosts the server unless a launcher does (agentStore). waitWorkers
// stays off: TCPStore's own join wait cannot say which ranks are missing and
// destroys the store when it gives up; the arrival protocol in rendezvous()
// waits for every rank instead.
c10::intrusive_ptr<c10d::Store> openStore(const RendezvousOptions &options,
                                          const std::string &otherHolders) {
  ignoreBrokenPipes();
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<std::uint16_t>(options.masterPort);
  storeOptions.isServer = options.rank == 0 && !options.agentStore;
  storeOptions.numWorkers = static_cast<std::size_t>(options.worldSize);
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // A client connects once the store listens, within the deadline.
    std::string unreachable =
        storeOptions.isServer
            ? ""
            : waitForListener(options, Clock::now() + options.timeout);
    if (!unreachable.empty())
      throw std::runtime_error(unreachable);
    store =
        c10::make_intrusive<c10d::TCPStore>(options.masterAddr, storeOptions);
  } catch (const std::exception &e) {
    std::string detail = describeError(e);
    if (storeOptions.isServer)
      throw rendezvousError(
          options,
          "rank 0 could not host the rendezvous store on port " +
              std::to_string(options.masterPort) + " (" + detail + ")",
          "Another process (perhaps " + otherHolders +
              ") may hold MASTER_PORT=" + std::to_string(options.masterPort) +
              ": pick a free port or stop that process; if a launcher hosts "
              "the store there, it must set TORCHELASTIC_USE_AGENT_STORE=True");
    if (options.agentStore)
      throw rendezvousError(
          options,
          "could not reach the launcher's rendezvous store at " +
              storeAddress(options) + " within the deadline of " +
              seconds(options.timeout) + " (" + detail + ")",
          "TORCHELASTIC_USE_AGENT_STORE=True says the launcher hosts the "
          "store at MASTER_ADDR:MASTER_PORT: check that the launcher is "
          "running and that every rank got the same MASTER_ADDR and "
          "MASTER_PORT, or unset the variable so that rank 0 hosts it");
    throw rendezvousError(
        options,
        "could not reach the rendezvous store of rank 0 at " +
            storeAddress(options) + " within the deadline of " +
            seconds(options.timeout) + ": rank 0 never joined (" + detail + ")",
        "Rank 0 hosts the store: check that it was started and that its log "
        "shows no earlier error, that every rank uses the same MASTER_ADDR "
        "and MASTER_PORT, or raise DLOSS_TIMEOUT_S if rank 0 starts late");
  }
  if (!options.agentStore)
    return store;
  // The launcher's store outlives this attempt and is shared with whatever
  // else the ranks open on it: dloss's keys go under a prefix of their own.
  return c10::make_intrusive<c10d::PrefixStore>(
      "dloss/attempt_" + std::to_string(options.restartCount), store);
}

void guardStore(const RendezvousOptions &options,
                const std::function<void()> &body) {
  try {
    body();
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    std::string host = options.agentStore ? "the launcher" : "rank 0";
    throw rendezvousError(
        options,
        "lost the rendezvous store of " + host + " at " +
            storeAddress(options) + " during the rendezvous (" +
            describeError(e) + ")",
        options.agentStore
            ? "The launcher probably stopped: check its log"
            : "Rank 0 probably failed or gave up: check its log for the "
              "first error");
  }
}

void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point deadline, const std::string &name) {
  int n = options.worldSize;
  store.set(arrivedKey(options.rank), toBytes("1"));
  store.add(kArrivedCountKey, 1);

  std::string verdict;
  while (verdict.empty()) {
    if (store.add(kArrivedCountKey, 0) >= n) {
      verdict = decide(store, "ok");
    } else if (store.check({kVerdictKey})) {
      verdict = fromBytes(store.get(kVerdictKey));
    } else if (Clock::now() >= deadline) {
      std::vector<int> missing = missingRanks(store, n);
      verdict = decide(
          store, missing.empty() ? "ok" : "missing:" + joinInts(missing, ", "));
    } else {
      std::this_thread::sleep_for(kStorePoll);
    }
  }
  if (verdict == "ok")
    return;

  std::string missing = verdict.substr(verdict.find(':') + 1);
  size_t missingCount = std::count(missing.begin(), missing.end(), ',') + 1;
  if (options.rank == 0 && !options.agentStore) {
    // The store dies with rank 0: keep it up until the ranks that did arrive
    // have read the verdict, or briefly.
    int64_t expectedAcks = n - static_cast<int64_t>(missingCount) - 1;
    auto lingerEnd = Clock::now() + kVerdictLinger;
    while (store.add(kVerdictAckKey, 0) < expectedAcks &&
           Clock::now() < lingerEnd)
      std::this_thread::sleep_for(kStorePoll);
  } else {
    store.add(kVerdictAckKey, 1);
  }
  throw rendezvousError(
      options,
      "the " + name + " of " + std::to_string(n) + " ranks at " +
          storeAddress(options) + " did not complete within the deadline of " +
          seconds(options.timeout) + ": " +
          (missingCount == 1 ? "rank " + missing + " never joined"
                             : "ranks " + missing + " never joined"),
      "Start every rank from 0 to " + std::to_string(n - 1) +
          " with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE; if the "
          "missing ranks were started, check their logs for an error before "
          "the rendezvous, or raise DLOSS_TIMEOUT_S if they start late");
}

void setMark(c10d::Store &store, const std::string &prefix, int rank,
             const std::string &value) {
  store.set(prefix + std::to_string(rank), toBytes(value));
}

std::string unmarkedPeers(c10d::Store &store, const RendezvousOptions &options,
                          const std::string &prefix, const std::string &never) {
  try {
    std::vector<int> missing;
    for (int r = 0; r < options.worldSize; ++r)
      if (r != options.rank && !store.check({prefix + std::to_string(r)}))
        missing.push_back(r);
    if (missing.empty())
      return "";
    return std::string(missing.size() == 1 ? ": rank " : ": ranks ") +
           joinInts(missing, ", ") + " " + never +
           " (check whether they died or failed)";
  } catch (const std::exception &) {
    return options.agentStore
               ? std::string(": the launcher's rendezvous store is "
                             "unreachable (the launcher probably stopped)")
               : std::string(": rank 0, which hosts the rendezvous store, is "
                             "unreachable (it probably died)");
  }
}

} // namespace dloss::comm
