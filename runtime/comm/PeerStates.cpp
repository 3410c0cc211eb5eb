// Each rank's latest collective and exit in the rendezvous store: recording
// them, reading the peers', naming them (root cause first) in an error.
#include "runtime/comm/PeerStates.h"

#include "runtime/comm/BoundedStore.h"
#include "runtime/comm/StoreRendezvous.h"
#include "runtime/support/Format.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <functional>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <cerrno>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dloss::comm {

namespace {

// Between two queries of the store.
constexpr std::chrono::milliseconds kStorePoll{20};
// Each rank's latest collective ("<seq>\x1f<state>\x1f..."), written before
// it enters one and when it fails: what a failing rank reads to learn which
// peers never arrived.
const char *const kSeqPrefix = "dloss/seq/";
// Set by a rank once it has read its peers' states after a failure, so that
// rank 0 (the store's host) keeps the store up until then.
const char *const kDonePrefix = "dloss/done/";
// Why a rank's process exited ("<seq>\x1f<unixMs>\x1f<afterFailure>\x1f
// <raised>\x1f<reason>\x1f"), written on its way out.
const char *const kLeftPrefix = "dloss/left/";
// Set once a rank has made its communicator for the group: a store's host
// waits for the exit record of every rank that did.
const char *const kJoinedPrefix = "dloss/joined/";
// Set by every failure record and every exit after an exception: a rank
// waiting in a collective reads the records only once it exists.
const char *const kAlarmKey = "dloss/alarm";
// Where the last rank's mirror of the records listens ("<host> <port>"), in the
// group's store.
const char *const kMirrorKey = "dloss/mirror";
// How long a failed rank 0 keeps the store up for the peers' diagnosis.
constexpr std::chrono::milliseconds kFailureLinger{3000};
// How long a store's host, on its way out, waits for the peers' exit
// records: ranks that end together write theirs within a second; one that
// works on for longer finds the host gone (torch then logs a broken pipe).
constexpr std::chrono::milliseconds kExitLinger{3000};
// Peers named one by one in an error; the rest are counted.
constexpr size_t kMaxPeerClauses = 8;

constexpr char kFieldSeparator = '\x1f';

/// The address of this host's interface that routes to `host`:`port` (the
/// store's), which the other ranks reach this host by; the host name where
/// none is found.
std::string localAddressTowards(const std::string &host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *found = nullptr;
  std::string out;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) ==
      0) {
    for (addrinfo *a = found; a && out.empty(); a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype, 0);
      if (fd < 0)
        continue;
      sockaddr_storage local{};
      socklen_t length = sizeof(local);
      char text[INET6_ADDRSTRLEN] = {0};
      // A datagram socket's connect() sends nothing: it only picks the
      // route, and with it the local address.
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr *>(&local), &length) == 0 &&
          getnameinfo(reinterpret_cast<sockaddr *>(&local), length, text,
                      sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0)
        out = text;
      close(fd);
    }
    freeaddrinfo(found);
  }
  if (out.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    out = name;
  }
  return out;
}

std::string encodeState(int64_t seq, const std::string &state,
                        const std::string &collective, const CallSite &site,
                        int64_t unixMs, const std::string &detail) {
  std::string out;
  for (const std::string &field :
       {std::to_string(seq), state, collective, site.function, site.op,
        site.location, site.phase, std::to_string(unixMs), detail}) {
    out += field;
    out += kFieldSeparator;
  }
  return out;
}

std::vector<std::string> splitFields(const std::string &text) {
  std::vector<std::string> fields;
  std::string field;
  for (char c : text) {
    if (c == kFieldSeparator) {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  return fields;
}

PeerState decodeState(int rank, const std::string &text) {
  std::vector<std::string> fields = splitFields(text);
  PeerState peer;
  peer.rank = rank;
  if (fields.size() < 9)
    return peer;
  peer.known = true;
  peer.seq = std::strtoll(fields[0].c_str(), nullptr, 10);
  peer.state = fields[1];
  peer.collective = fields[2];
  peer.site = CallSite{fields[3], fields[4], fields[5], fields[6]};
  peer.unixMs = std::strtoll(fields[7].c_str(), nullptr, 10);
  peer.detail = fields[8];
  return peer;
}

std::string truncated(const std::string &text, size_t limit) {
  return text.size() <= limit ? text : text.substr(0, limit) + "...";
}

} // namespace

PeerStates::PeerStates(c10::intrusive_ptr<c10d::Store> groupStore,
                       const RendezvousOptions &options, bool ownStore)
    : mirrored(options.worldSize > 1 && !options.agentStore &&
               options.masterPort > 0 && !options.masterAddr.empty()),
      masterAddr(options.masterAddr), masterPort(options.masterPort),
      deadline(options.timeout), rank(options.rank),
      worldSize(options.worldSize),
      hostsStore(options.rank == 0 && !options.agentStore),
      // A group made elsewhere (torch.distributed's) may not say where its
      // store is: masterPort 0.
      storeAt(options.masterPort > 0
                  ? "the rendezvous store at " + storeAddress(options)
                  : std::string("the process group's store")) {
  // A store of dloss's own is used as it is (the group uses it too: its
  // timeout stays). The user's gets a connection of dloss's own with
  // dloss's deadline, so that the group's connection and timeout stay the
  // user's (the group's own where it has no clone: a HashStore). No margin:
  // the records are read only once check() found them, so no operation
  // waits on the server, and a rank cut off from the store's host fails
  // within the deadline.
  store = ownStore ? std::make_shared<BoundedStore>(
                         [groupStore](const std::function<bool()> &) {
                           return BoundedStore::Connection{groupStore, false};
                         },
                         deadline, storeAt, BoundedStore::Margin::None)
                   : BoundedStore::over(groupStore, /*clone=*/true, deadline,
                                        storeAt, BoundedStore::Margin::None);
  if (mirrored)
    mirror = makeMirror();
  try {
    post(kJoinedPrefix + std::to_string(rank), "1");
  } catch (const std::exception &e) {
    disable(e);
  }
}

std::shared_ptr<BoundedStore> PeerStates::makeMirror() {
  std::string what =
      "the records' mirror on rank " + std::to_string(worldSize - 1);
  std::shared_ptr<BoundedStore> primary = store;
  std::chrono::milliseconds limit = deadline;
  if (hostsMirror())
    return std::make_shared<BoundedStore>(
        [primary, limit, host = masterAddr,
         port = masterPort](const std::function<bool()> &) {
          c10::intrusive_ptr<c10d::Store> server;
          std::string address = "none";
          try {
            c10d::TCPStoreOptions options;
            options.port = 0;
            options.isServer = true;
            options.waitWorkers = false;
            options.timeout = limit;
            std::string local = localAddressTowards(host, port);
            auto tcp = c10::make_intrusive<c10d::TCPStore>(local, options);
            address = local + " " + std::to_string(tcp->getPort());
            server = tcp;
          } catch (const std::exception &) {
            // The peers learn that there is none, and stop looking.
          }
          primary->set(kMirrorKey, address);
          if (!server)
            throw std::runtime_error("no mirror could be made");
          return BoundedStore::Connection{server, /*own=*/true};
        },
        deadline, what, BoundedStore::Margin::None);
  return std::make_shared<BoundedStore>(
      [primary, limit](const std::function<bool()> &stopping) {
        // The last rank leaves the mirror's address once it listens.
        auto end = Clock::now() + limit;
        while (!primary->check(kMirrorKey)) {
          if (stopping() || Clock::now() >= end)
            throw std::runtime_error("the mirror's address never came");
          std::this_thread::sleep_for(kStorePoll);
        }
        std::string address = primary->get(kMirrorKey);
        size_t space = address.rfind(' ');
        if (space == std::string::npos)
          throw std::runtime_error("the last rank made no mirror");
        c10d::TCPStoreOptions options;
        options.port = static_cast<std::uint16_t>(
            std::strtol(address.c_str() + space + 1, nullptr, 10));
        options.timeout = limit;
        return BoundedStore::Connection{c10::make_intrusive<c10d::TCPStore>(
                                            address.substr(0, space), options),
                                        /*own=*/true};
      },
      deadline, what, BoundedStore::Margin::None);
}

bool PeerStates::mirrorUpToDate() { return mirror && mirror->settled(); }

void PeerStates::loseStore() {
  if (!primaryLost)
    primaryLostUnixMs = unixMillis();
  primaryLost = true;
}

std::string PeerStates::lostStoreClause() const {
  if (!primaryLost)
    return "";
  std::ostringstream ago;
  ago.precision(1);
  ago << std::fixed
      << std::max<int64_t>(0, unixMillis() - primaryLostUnixMs) / 1000.0;
  std::string mirrorText =
      readMirror ? "the peers' records above were read from their mirror on "
                   "rank " +
                       std::to_string(worldSize - 1)
                 : "and no mirror of the records answered";
  return storeAt + " stopped answering this rank " + ago.str() + " s ago (" +
         mirrorText +
         "): this host may be cut off from the store's host and the ranks "
         "there";
}

std::string PeerStates::primaryFailure() const {
  std::string reason = store->failure();
  return reason.empty() ? storeAt + " stopped answering" : reason;
}

template <typename Fn> auto PeerStates::firstAnswer(Fn &&fn) {
  if (!primaryLost) {
    try {
      return fn(*store);
    } catch (const std::exception &) {
      if (!mirror)
        throw;
      loseStore();
    }
  }
  if (!mirror || mirror->connecting())
    throw StoreLost(primaryFailure() +
                    (mirror ? "; and its mirror is still connecting" : ""));
  try {
    auto answer = fn(*mirror);
    readMirror = true;
    return answer;
  } catch (const std::exception &e) {
    throw StoreLost(primaryFailure() + "; and " + describeError(e));
  }
}

void PeerStates::put(const std::string &key, const std::string &value) {
  write(key, value, /*wait=*/true);
}

void PeerStates::post(const std::string &key, const std::string &value) {
  write(key, value, /*wait=*/false);
}

void PeerStates::write(const std::string &key, const std::string &value,
                       bool wait) {
  bool stored = false;
  if (!primaryLost) {
    try {
      wait ? store->set(key, value) : store->post(key, value);
      stored = true;
    } catch (const std::exception &) {
      if (!mirror)
        throw;
      loseStore();
    }
  }
  if (!mirror) {
    if (!stored)
      throw StoreLost(primaryFailure());
    return;
  }
  // A mirror still connecting gets the write queued: its host may be gone
  // already, and the connection would wait for it until the deadline.
  bool waitMirror = wait && (!stored || !mirror->connecting());
  try {
    waitMirror ? mirror->set(key, value) : mirror->post(key, value);
  } catch (const std::exception &e) {
    mirror.reset();
    mirrored = false;
    if (!stored)
      throw StoreLost((primaryLost ? primaryFailure() + "; and " : "") +
                      describeError(e));
  }
}

bool PeerStates::has(const std::string &key, BoundedStore *from) {
  if (from)
    return from->check(key);
  return firstAnswer([&](BoundedStore &s) { return s.check(key); });
}

std::string PeerStates::fetch(const std::string &key, BoundedStore *from) {
  if (from)
    return from->get(key);
  return firstAnswer([&](BoundedStore &s) { return s.get(key); });
}

void PeerStates::disable(const std::exception &e) {
  if (unusable.empty())
    unusable = describeError(e);
}

void PeerStates::publish(int64_t seq, const std::string &state,
                         const std::string &collective, const CallSite &site,
                         int64_t unixMs, const std::string &detail) {
  if (!usable())
    return;
  // Entering a collective is posted, not waited for: it is the hot path,
  // and every later read or failure record queues behind it.
  std::string key = kSeqPrefix + std::to_string(rank);
  std::string record =
      encodeState(seq, state, collective, site, unixMs, truncated(detail, 600));
  try {
    if (state == "started")
      post(key, record);
    else
      put(key, record);
  } catch (const std::exception &e) {
    disable(e);
  }
  if (state == "failed" && !collective.empty())
    raiseAlarm();
}

void PeerStates::raiseAlarm() {
  if (!usable())
    return;
  try {
    put(kAlarmKey, "1");
  } catch (const std::exception &e) {
    disable(e);
  }
}

PeerState PeerStates::readPeer(int r, BoundedStore *from) {
  PeerState peer;
  peer.rank = r;
  std::string key = kSeqPrefix + std::to_string(r);
  if (has(key, from))
    peer = decodeState(r, fetch(key, from));
  std::string left = kLeftPrefix + std::to_string(r);
  if (has(left, from)) {
    std::vector<std::string> fields = splitFields(fetch(left, from));
    if (fields.size() >= 5) {
      peer.exited = true;
      peer.exit.rank = r;
      peer.exit.unixMs = std::strtoll(fields[1].c_str(), nullptr, 10);
      peer.exit.afterFailure = fields[2] == "1";
      peer.exit.reason = fields[4];
      // The collectives it had started: whether it left before one.
      peer.exitSeq = std::strtoll(fields[0].c_str(), nullptr, 10);
    }
  }
  return peer;
}

std::vector<PeerState> PeerStates::read(std::chrono::milliseconds grace,
                                        std::string &storeProblem) {
  std::vector<PeerState> peers;
  if (!usable()) {
    storeProblem = "an earlier store operation failed: " + unusable;
    return peers;
  }
  Clock::time_point end = Clock::now() + grace;
  try {
    while (true) {
      peers.clear();
      bool allFailed = true;
      for (int r = 0; r < worldSize; ++r) {
        if (r == rank)
          continue;
        PeerState peer = readPeer(r);
        // A rank that exited records nothing more.
        allFailed &= peer.exited || (peer.known && peer.state == "failed");
        peers.push_back(std::move(peer));
      }
      if (allFailed || Clock::now() >= end)
        return peers;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &e) {
    disable(e);
    storeProblem = unusable;
    peers.clear();
    return peers;
  }
}

std::vector<PeerState> PeerStates::failed(const Call &call,
                                          const std::string &detail,
                                          std::chrono::milliseconds grace,
                                          std::string &storeProblem) {
  failedSeq = call.seq;
  publish(call.seq, "failed", call.name, call.site, unixMillis(), detail);
  std::vector<PeerState> peers = read(grace, storeProblem);
  if (usable()) {
    try {
      put(kDonePrefix + std::to_string(rank), "1");
    } catch (const std::exception &e) {
      disable(e);
    }
  }
  return peers;
}

std::string PeerStates::summarize(const Call &call,
                                  const std::vector<PeerState> &peers,
                                  bool timedOut,
                                  const std::vector<int> &named) const {
  std::vector<std::string> clauses;
  std::vector<int> reached;
  int64_t now = unixMillis();
  auto ago = [now](int64_t unixMs) {
    std::ostringstream out;
    out.precision(1);
    out << std::fixed << std::max<int64_t>(0, now - unixMs) / 1000.0
        << " s ago";
    return out.str();
  };
  for (const PeerState &peer : peers) {
    if (std::find(named.begin(), named.end(), peer.rank) != named.end())
      continue;
    std::string who = "rank " + std::to_string(peer.rank);
    // Its collective failure says more than the exit that followed it.
    if (peer.exited && !peer.exit.afterFailure) {
      clauses.push_back(who + " " + peer.exit.reason);
      continue;
    }
    if (!peer.known) {
      clauses.push_back(who + " has recorded no collective");
      continue;
    }
    std::string latest = "#" + std::to_string(peer.seq) + " " +
                         peer.collective + siteText(peer.site);
    if (peer.state == "failed") {
      if (peer.collective.empty())
        clauses.push_back(who + " failed outside a collective after #" +
                          std::to_string(peer.seq) + ": " +
                          truncated(peer.detail, 300));
      else
        clauses.push_back(who + " failed in collective " + latest + ": " +
                          truncated(peer.detail, 300));
      continue;
    }
    if (peer.seq < call.seq) {
      clauses.push_back(who + " never arrived (its latest collective is " +
                        latest + ", entered " + ago(peer.unixMs) + ")" +
                        (timedOut ? " and has neither failed nor exited: it is "
                                    "still working, or waits in a collective "
                                    "that this rank never made (a "
                                    "torch.distributed call run on some ranks "
                                    "only, which dloss.guard names)"
                                  : " and has recorded no failure: it may "
                                    "have died"));
    } else if (peer.seq == call.seq && peer.collective == call.name) {
      if (timedOut)
        reached.push_back(peer.rank);
      else
        clauses.push_back(who + " reached it but had recorded no failure " +
                          seconds(kReportGrace) +
                          " later (it died, or it still waits on another "
                          "rank)");
    } else if (peer.seq == call.seq) {
      clauses.push_back(who + " is in collective " + latest +
                        " instead: the ranks' collective calls differ");
    } else {
      clauses.push_back(who + " has moved on to collective " + latest);
    }
  }
  std::string out;
  for (size_t i = 0; i < clauses.size() && i < kMaxPeerClauses; ++i)
    out += (i ? "; " : "") + clauses[i];
  if (clauses.size() > kMaxPeerClauses)
    out += "; and " + std::to_string(clauses.size() - kMaxPeerClauses) +
           " more ranks (see the flight record)";
  if (!reached.empty()) {
    std::vector<int> all = reached;
    all.push_back(rank);
    std::sort(all.begin(), all.end());
    out += (out.empty() ? "" : "; ") + rankList(all, ", ") + " reached it";
  }
  return out;
}

std::string PeerStates::describe(const PeerState &peer) {
  return "rank " + std::to_string(peer.rank) + ": " +
         (peer.known ? peer.state + " #" + std::to_string(peer.seq) + " " +
                           peer.collective + siteText(peer.site) +
                           (peer.detail.empty() ? "" : ": " + peer.detail)
                     : "no collective recorded") +
         (peer.exited ? "; then " + peer.exit.reason : "");
}

void PeerStates::recordExit(int64_t seq, const std::string &reason, bool raised,
                            bool afterFailure) {
  if (!usable())
    return;
  std::string record;
  for (const std::string &field :
       {std::to_string(seq), std::to_string(unixMillis()),
        std::string(afterFailure ? "1" : "0"), std::string(raised ? "1" : "0"),
        truncated(reason, 600)}) {
    record += field;
    record += kFieldSeparator;
  }
  // Peers waiting in a collective need the alarm only for an exit that is
  // a root cause: a plain end is not one (a peer still waiting for this
  // rank fails when its connection closes, and reads this record then), and
  // an exit after a failed collective follows an alarm raised already.
  if (raised && !afterFailure)
    raiseAlarm();
  // The exit record is this rank's last write: the store hosts wait for it
  // (keepStoreForPeers), so that nothing is sent to a host that has left.
  plainExit = !raised && !afterFailure;
  try {
    put(kLeftPrefix + std::to_string(rank), record);
  } catch (const std::exception &e) {
    disable(e);
  }
}

std::vector<PeerState> PeerStates::current() {
  std::vector<PeerState> peers;
  if (!usable())
    return peers;
  try {
    for (int r = 0; r < worldSize; ++r)
      if (r != rank)
        peers.push_back(readPeer(r));
  } catch (const std::exception &e) {
    disable(e);
    peers.clear();
  }
  return peers;
}

std::string PeerStates::doomed(const Call &call) {
  if (!usable())
    return "";
  try {
    if (!has(kAlarmKey))
      return "";
  } catch (const std::exception &e) {
    disable(e);
    return "";
  }
  for (const PeerState &peer : current()) {
    std::string who = "rank " + std::to_string(peer.rank);
    if (peer.known && peer.state == "failed" && !peer.collective.empty()) {
      std::string reason = "stopped waiting: " + who +
                           " failed in collective #" +
                           std::to_string(peer.seq) + " " + peer.collective;
      // A peer whose deadline passed in this very collective, entered about
      // when this rank entered it: this rank's has as good as passed too,
      // and the call fails as a timeout (diagnose names the ranks that never
      // came, not the peer that gave up first). Its record says "timed out
      // after ..." (ContractCommunicator::diagnose).
      if (peer.seq == call.seq && peer.detail.rfind("timed out", 0) == 0)
        reason += " (" + peer.detail + ")";
      return reason;
    }
    // A rank that exited after entering this collective had finished it.
    if (peer.exited && peer.exitSeq < call.seq)
      return "stopped waiting: " + who + " exited before reaching it";
  }
  return "";
}

RootCause PeerStates::rootCause(const Call *call,
                                const std::vector<PeerState> &peers,
                                bool timedOut) const {
  RootCause cause;
  // A rank that left or failed on its own: the earliest by its clock.
  const PeerState *first = nullptr;
  int64_t firstMs = 0;
  auto consider = [&](const PeerState &peer, int64_t unixMs) {
    if (!first || unixMs < firstMs) {
      first = &peer;
      firstMs = unixMs;
    }
  };
  for (const PeerState &peer : peers) {
    if (peer.exited && !peer.exit.afterFailure)
      consider(peer, peer.exit.unixMs);
    else if (peer.known && peer.state == "failed" && peer.collective.empty())
      consider(peer, peer.unixMs);
  }
  if (first) {
    std::string who = "rank " + std::to_string(first->rank);
    cause.ranks.push_back(first->rank);
    bool outside = !(first->exited && !first->exit.afterFailure);
    cause.text = outside ? who + " failed outside a collective after #" +
                               std::to_string(first->seq) + ": " +
                               truncated(first->detail, 300)
                         : who + " " + first->exit.reason;
    cause.hint = "Fix the error on " + who +
                 " first (its own output has the whole traceback): the "
                 "other ranks failed because of it";
    return cause;
  }
  // Without a record: the ranks due in the failed collective that recorded
  // neither a failure nor an exit while their peers did (a collective that
  // timed out leaves ranks that are alive elsewhere: the summary names
  // them).
  if (!call || timedOut)
    return cause;
  for (const PeerState &peer : peers) {
    bool recorded = peer.exited || (peer.known && peer.state == "failed");
    if (!recorded && (!peer.known || peer.seq <= call->seq))
      cause.ranks.push_back(peer.rank);
  }
  if (cause.ranks.empty())
    return cause;
  cause.silent = true;
  cause.text = rankList(cause.ranks, ", ") +
               " left without a word, recording no error or exit (killed, "
               "crashed, or ended by os._exit)";
  return cause;
}

std::vector<Communicator::PeerExit> PeerStates::exits() {
  std::vector<Communicator::PeerExit> out;
  if (!usable())
    return out;
  try {
    for (int r = 0; r < worldSize; ++r) {
      PeerState peer = readPeer(r);
      if (peer.exited)
        out.push_back(peer.exit);
    }
  } catch (const std::exception &e) {
    disable(e);
    out.clear();
  }
  std::stable_sort(
      out.begin(), out.end(),
      [](const Communicator::PeerExit &a, const Communicator::PeerExit &b) {
        return a.unixMs < b.unixMs;
      });
  return out;
}

PeerStates::~PeerStates() {
  if (failedSeq >= 0)
    keepStoreForPeers(failedSeq - 1);
}

void PeerStates::keepStoreForPeers(int64_t started) {
  // Rank 0 hosts the group's store; the last rank hosts the mirror, which
  // peers read once rank 0 left.
  bool hosts = hostsStore || (hostsMirror() && mirror);
  if (!hosts || !usable() || keptStore)
    return;
  keptStore = true;
  // The store this rank hosts, read directly: the other one's host may have
  // left already, and a send to it makes torch log a broken pipe.
  BoundedStore *own = hostsStore ? store.get() : mirror.get();
  // Keep the store up while peers that were in the failed collective (or,
  // after a healthy rank 0 left, in one it never joined) still read their
  // peers' states. A peer that has recorded its failure is reading (for at
  // most kReportGrace); one that has not may yet fail (its wait checks the
  // alarm), or may be dead, so it gets about that long too. After a plain
  // exit, also until every peer that uses this group's records and has no
  // collective left to run with this rank has written its exit record (its
  // last write), for kExitLinger at most. Not after a failure: there the
  // host's exit, closing its connections, is what frees peers stuck in a
  // collective with it.
  int64_t due = failedSeq >= 0 ? failedSeq : started + 1;
  Clock::time_point start = Clock::now();
  Clock::time_point end = start + std::max(kFailureLinger, kExitLinger);
  Clock::time_point failureEnd = start + kFailureLinger;
  Clock::time_point silentEnd =
      start + kReportGrace + std::chrono::milliseconds(500);
  Clock::time_point exitEnd = start + kExitLinger;
  std::vector<std::string> allLeft;
  for (int r = 0; r < worldSize; ++r)
    if (r != rank)
      allLeft.push_back(kLeftPrefix + std::to_string(r));
  try {
    while (Clock::now() < end) {
      // Every peer has left: nobody reads or writes any more.
      if (own->check(allLeft))
        return;
      Clock::time_point now = Clock::now();
      bool diagnosing = false, silent = false, exiting = false;
      for (int r = 0; r < worldSize; ++r) {
        std::string who = std::to_string(r);
        if (r == rank || has(kLeftPrefix + who, own))
          continue;
        PeerState peer = readPeer(r, own);
        // A rank that made no communicator for this group writes nothing; one
        // in a collective this rank never joins fails rather than exits (the
        // rule below keeps the store up for it).
        exiting |= plainExit && (!peer.known || peer.seq <= started) &&
                   has(kJoinedPrefix + who, own);
        if (has(kDonePrefix + who, own) || now >= failureEnd || !peer.known ||
            peer.seq < due)
          continue;
        diagnosing |= peer.state == "failed";
        silent |= peer.state != "failed";
      }
      if (!diagnosing && (!silent || now >= silentEnd) &&
          (!exiting || now >= exitEnd))
        return;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &) {
    // Nothing to keep up any more.
  }
}

} // namespace dloss::comm
