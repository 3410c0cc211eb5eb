// Each rank's latest collective and exit in the rendezvous store: recording
// them, reading the peers', naming them (root cause first) in an error.
#include "runtime/comm/PeerStates.h"

#include "runtime/comm/StoreRendezvous.h"
#include "runtime/support/Format.h"

#include <algorithm>
#include <sstream>
#include <thread>

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
// Set by every failure and exit record: a rank waiting in a collective
// reads the records only once it exists.
const char *const kAlarmKey = "dloss/alarm";
// How long a failed rank 0 keeps the store up for the peers' diagnosis.
constexpr std::chrono::milliseconds kFailureLinger{3000};
// Peers named one by one in an error; the rest are counted.
constexpr size_t kMaxPeerClauses = 8;

constexpr char kFieldSeparator = '\x1f';

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

PeerStates::PeerStates(c10::intrusive_ptr<c10d::Store> store,
                       const RendezvousOptions &options)
    : store(std::move(store)), rank(options.rank), worldSize(options.worldSize),
      hostsStore(options.rank == 0 && !options.agentStore),
      // A group made elsewhere (torch.distributed's) may not say where its
      // store is: masterPort 0.
      storeAt(options.masterPort > 0
                  ? "the rendezvous store at " + storeAddress(options)
                  : std::string("the process group's store")) {}

void PeerStates::publish(int64_t seq, const std::string &state,
                         const std::string &collective, const CallSite &site,
                         int64_t unixMs, const std::string &detail) {
  if (!usable)
    return;
  try {
    store->set(kSeqPrefix + std::to_string(rank),
               toBytes(encodeState(seq, state, collective, site, unixMs,
                                   truncated(detail, 600))));
  } catch (const std::exception &) {
    usable = false;
  }
  if (state == "failed" && !collective.empty())
    raiseAlarm();
}

void PeerStates::raiseAlarm() {
  if (!usable)
    return;
  try {
    store->set(kAlarmKey, toBytes("1"));
  } catch (const std::exception &) {
    usable = false;
  }
}

PeerState PeerStates::readPeer(int r) {
  PeerState peer;
  peer.rank = r;
  std::string key = kSeqPrefix + std::to_string(r);
  if (store->check({key}))
    peer = decodeState(r, fromBytes(store->get(key)));
  std::string left = kLeftPrefix + std::to_string(r);
  if (store->check({left})) {
    std::vector<std::string> fields = splitFields(fromBytes(store->get(left)));
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
  if (!usable) {
    storeProblem = storeAt + " could not be reached earlier: rank 0, which "
                             "hosts it, has probably exited or died";
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
    usable = false;
    storeProblem = storeAt + " cannot be read (" + describeError(e) +
                   "): rank 0, which hosts it, has probably exited or died";
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
  if (usable) {
    try {
      store->set(kDonePrefix + std::to_string(rank), toBytes("1"));
    } catch (const std::exception &) {
      usable = false;
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
  if (!usable)
    return;
  std::string record;
  for (const std::string &field :
       {std::to_string(seq), std::to_string(unixMillis()),
        std::string(afterFailure ? "1" : "0"), std::string(raised ? "1" : "0"),
        truncated(reason, 600)}) {
    record += field;
    record += kFieldSeparator;
  }
  try {
    store->set(kLeftPrefix + std::to_string(rank), toBytes(record));
  } catch (const std::exception &) {
    usable = false;
  }
  raiseAlarm();
}

std::vector<PeerState> PeerStates::current() {
  std::vector<PeerState> peers;
  if (!usable)
    return peers;
  try {
    for (int r = 0; r < worldSize; ++r)
      if (r != rank)
        peers.push_back(readPeer(r));
  } catch (const std::exception &) {
    usable = false;
    peers.clear();
  }
  return peers;
}

std::string PeerStates::doomed(const Call &call) {
  if (!usable)
    return "";
  try {
    if (!store->check({kAlarmKey}))
      return "";
  } catch (const std::exception &) {
    usable = false;
    return "";
  }
  for (const PeerState &peer : current()) {
    std::string who = "rank " + std::to_string(peer.rank);
    if (peer.known && peer.state == "failed" && !peer.collective.empty())
      return "stopped waiting: " + who + " failed in collective #" +
             std::to_string(peer.seq) + " " + peer.collective;
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
  if (!usable)
    return out;
  try {
    for (int r = 0; r < worldSize; ++r) {
      PeerState peer = readPeer(r);
      if (peer.exited)
        out.push_back(peer.exit);
    }
  } catch (const std::exception &) {
    usable = false;
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
  if (!hostsStore || !usable || keptStore)
    return;
  keptStore = true;
  // Rank 0 hosts the store: keep it up while peers that were in the failed
  // collective (or, after a healthy rank 0 left, in one it never joined)
  // still read their peers' states. A peer that has recorded its failure is
  // reading (for at most kReportGrace); one that has not may yet fail (its
  // wait checks the alarm), or may be dead, so it gets about that long too.
  int64_t due = failedSeq >= 0 ? failedSeq : started + 1;
  Clock::time_point start = Clock::now();
  Clock::time_point end = start + kFailureLinger;
  auto silentEnd = start + kReportGrace + std::chrono::milliseconds(500);
  try {
    while (Clock::now() < end) {
      bool diagnosing = false, silent = false;
      for (int r = 0; r < worldSize; ++r) {
        if (r == rank || store->check({kDonePrefix + std::to_string(r)}))
          continue;
        PeerState peer = readPeer(r);
        if (peer.exited || !peer.known || peer.seq < due)
          continue;
        diagnosing |= peer.state == "failed";
        silent |= peer.state != "failed";
      }
      if (!diagnosing && (!silent || Clock::now() >= silentEnd))
        return;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &) {
    // Nothing to keep up any more.
  }
}

} // namespace dloss::comm
