// What the Gloo and NCCL engines share (EngineCommon.h), with their calls to the TCPStore.
#include "runtime/comm/EngineCommon.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

namespace dloss {
namespace engine {

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
// Each rank's latest collective ("<seq>\x1f<state>\x1f..."), written before
// it enters one and when it fails: what a failing rank reads to learn which
// peers never arrived.
const char *const kSeqPrefix = "dloss/seq/";
// Set by a rank once it has read its peers' states after a failure, so that
// rank 0 (the store's host) keeps the store up until then.
const char *const kDonePrefix = "dloss/done/";
// After a failure that is not a timeout (a closed connection), how long a
// rank waits for its peers to record their own failure before naming the
// silent ones: a dead rank never records one.
constexpr std::chrono::milliseconds kPeerReportGrace{1000};
// How long a failed rank 0 keeps the store up for the peers' diagnosis.
constexpr std::chrono::milliseconds kFailureLinger{3000};
// Peers named one by one in an error; the rest are counted.
constexpr size_t kMaxPeerClauses = 8;

std::string joinRanks(const std::vector<int> &ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::vector<uint8_t> toBytes(const std::string &text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string fromBytes(const std::vector<uint8_t> &bytes) {
  return std::string(bytes.begin(), bytes.end());
}

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

PeerState decodeState(int rank, const std::string &text) {
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

int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// " (dloss.all_gather at clip.mlir:12:16 in @clip_grad)", or the phase.
std::string siteText(const CallSite &site) {
  std::string out;
  if (!site.op.empty())
    out = site.op + (site.location.empty() ? "" : " at " + site.location);
  else if (!site.phase.empty())
    out = site.phase;
  if (!site.function.empty())
    out += (out.empty() ? "in @" : " of @") + site.function;
  return out.empty() ? "" : " (" + out + ")";
}

std::string truncated(const std::string &text, size_t limit) {
  return text.size() <= limit ? text : text.substr(0, limit) + "...";
}

std::string describeTensor(const at::Tensor &tensor) {
  std::string out = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d)
    out += (d ? ", " : "") + std::to_string(tensor.size(d));
  return out + "]";
}

std::string storeAddress(const RendezvousOptions &options) {
  return options.masterAddr + ":" + std::to_string(options.masterPort);
}

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

} // namespace

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

// c10::Error::what() appends a C++ backtrace; users need the message only.
// This reads the same in LibTorch 1.13 and 2.x.
std::string describeError(const std::exception &e) {
  std::string text;
  if (const auto *c10Error = dynamic_cast<const c10::Error *>(&e))
    text = c10Error->what_without_backtrace();
  else
    text = e.what();
  // Keep the first line: later lines are backtraces or debug dumps.
  auto newline = text.find('\n');
  if (newline != std::string::npos)
    text.resize(newline);
  // Gloo prefixes its source position ("[../gloo/transport/tcp/pair.cc:598]
  // Connection closed by peer"), which tells users nothing.
  if (!text.empty() && text.front() == '[') {
    auto close = text.find("] ");
    if (close != std::string::npos)
      text.erase(0, close + 2);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '.'))
    text.pop_back();
  if (text.size() > 400)
    text = text.substr(0, 400) + "...";
  return text.empty() ? std::string("unknown c10d error") : text;
}

//===----------------------------------------------------------------------===//
// Call
//===----------------------------------------------------------------------===//

Call::Call(std::string name, std::string irOp)
    : name(std::move(name)), irOp(std::move(irOp)) {
  if (const CallSite *current = currentCallSite())
    site = *current;
}

std::string Call::describe() const {
  std::string out =
      seq >= 0 ? "collective #" + std::to_string(seq) + " " + name : name;
  if (!site.phase.empty())
    out += " (" + site.phase +
           (site.function.empty() ? "" : " of @" + site.function) + ")";
  else if (!site.function.empty())
    out += " (in @" + site.function + ")";
  return out;
}

//===----------------------------------------------------------------------===//
// EngineBase
//===----------------------------------------------------------------------===//

EngineBase::EngineBase(RendezvousOptions options,
                       c10::intrusive_ptr<c10d::Store> store,
                       const EngineWording &wording)
    : options(std::move(options)), store(std::move(store)), wording(wording) {}

Error EngineBase::fail(const Call &call, std::string problem,
                       std::string hint) const {
  ErrorInfo info;
  info.problem = std::move(problem);
  info.hint = std::move(hint);
  info.rank = options.rank;
  // The plan step's op names what the user wrote; the engine's op is the
  // fallback for direct calls.
  info.op = call.site.op.empty() ? call.irOp : call.site.op;
  info.location = call.site.location;
  return Error(std::move(info));
}

std::string EngineBase::where() const {
  return "on rank " + std::to_string(options.rank) + " of " +
         std::to_string(options.worldSize);
}

void EngineBase::begin(Call &call, const at::Tensor *tensor, int64_t values) {
  call.seq = ++started;
  call.startUnixMs = unixMillis();
  FlightEntry entry;
  entry.seq = call.seq;
  entry.collective = call.name;
  entry.function = call.site.function;
  entry.op = call.site.op.empty() ? call.irOp : call.site.op;
  entry.location = call.site.location;
  entry.phase = call.site.phase;
  if (tensor && tensor->defined()) {
    entry.shape = describeTensor(*tensor);
    entry.dtype = c10::toString(tensor->scalar_type());
    entry.bytes =
        static_cast<int64_t>(tensor->numel() * tensor->element_size());
  } else if (values >= 0) {
    entry.shape = "[" + std::to_string(values) + "]";
    entry.dtype = "Long";
    entry.bytes = values * static_cast<int64_t>(sizeof(int64_t));
  }
  call.flight = flight.start(std::move(entry));
  // A broken communicator refuses the call; its recorded failure stays.
  if (broken.empty())
    publish(call.seq, "started", call.name, call.site, call.startUnixMs, "");
}

void EngineBase::complete(Call &call) {
  // A transfer of an exchange completes with the exchange (endExchange).
  if (!call.transfer.empty())
    return;
  flight.finish(call.flight, FlightEntry::State::Completed);
}

void EngineBase::refuseIfBroken(Call &call) {
  if (broken.empty())
    return;
  flight.finish(call.flight, FlightEntry::State::Failed,
                "not run: the communicator was already unusable");
  throw fail(call,
             call.describe() + " cannot run " + where() +
                 ": the communicator is unusable after an earlier failure (" +
                 broken + ")",
             "Handle the first error: the job has to be restarted once a "
             "collective has failed");
}

void EngineBase::breakOn(const Call &call, const Error &error) {
  broken = call.name + ": " + error.problem();
  flight.finish(call.flight, FlightEntry::State::Failed, error.problem());
}

void EngineBase::publish(int64_t seq, const std::string &state,
                         const std::string &collective, const CallSite &site,
                         int64_t unixMs, const std::string &detail) {
  if (!storeUsable)
    return;
  try {
    store->set(kSeqPrefix + std::to_string(options.rank),
               toBytes(encodeState(seq, state, collective, site, unixMs,
                                   truncated(detail, 600))));
  } catch (const std::exception &) {
    storeUsable = false;
  }
}

void EngineBase::noteFailure(const std::string &message) {
  // A failed collective has recorded its own, more precise state.
  if (!broken.empty())
    return;
  publish(started, "failed", "", CallSite{}, unixMillis(), message);
}

std::vector<PeerState> EngineBase::readPeers(std::chrono::milliseconds grace,
                                             std::string &storeProblem) {
  std::vector<PeerState> peers;
  std::string storeAt = "the rendezvous store at " + storeAddress(options);
  if (!storeUsable) {
    storeProblem = storeAt + " could not be reached earlier: rank 0, which "
                             "hosts it, has probably exited or died";
    return peers;
  }
  Clock::time_point end = Clock::now() + grace;
  try {
    while (true) {
      peers.clear();
      bool allFailed = true;
      for (int r = 0; r < options.worldSize; ++r) {
        if (r == options.rank)
          continue;
        std::string key = kSeqPrefix + std::to_string(r);
        PeerState peer;
        peer.rank = r;
        if (store->check({key}))
          peer = decodeState(r, fromBytes(store->get(key)));
        allFailed &= peer.known && peer.state == "failed";
        peers.push_back(std::move(peer));
      }
      if (allFailed || Clock::now() >= end)
        return peers;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &e) {
    storeUsable = false;
    storeProblem = storeAt + " cannot be read (" + describeError(e) +
                   "): rank 0, which hosts it, has probably exited or died";
    peers.clear();
    return peers;
  }
}

std::string EngineBase::summarizePeers(const Call &call,
                                       const std::vector<PeerState> &peers,
                                       bool timedOut) const {
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
    std::string who = "rank " + std::to_string(peer.rank);
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
                        (timedOut ? ""
                                  : " and has recorded no failure: it may "
                                    "have died"));
    } else if (peer.seq == call.seq && peer.collective == call.name) {
      if (timedOut)
        reached.push_back(peer.rank);
      else
        clauses.push_back(who + " reached it but had recorded no failure " +
                          seconds(kPeerReportGrace) +
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
    all.push_back(options.rank);
    std::sort(all.begin(), all.end());
    out += (out.empty() ? "" : "; ") +
           std::string(all.size() == 1 ? "rank " : "ranks ") + joinRanks(all) +
           " reached it";
  }
  return out;
}

Error EngineBase::diagnose(Call &call, const std::string &detail,
                           bool timedOut) {
  broken = call.describe() + " failed: " + detail;
  flight.finish(call.flight, FlightEntry::State::Failed, detail);
  std::string timeoutHint =
      std::string("Some rank did not reach this collective in time: check the "
                  "ranks named above (and the other ranks' logs) for an "
                  "earlier error or a hang, make sure every rank makes the "
                  "same collective calls in the same order") +
      wording.sameOrderDetail +
      ", or raise DLOSS_TIMEOUT_S if the ranks are only slow";
  if (call.seq < 0) {
    // A send or recv: its peer is the only rank involved.
    if (timedOut)
      return fail(call,
                  call.name + " timed out " + where() +
                      " after the deadline of " + seconds(options.timeout) +
                      " (" + detail + ")" + wording.failureSuffix,
                  timeoutHint);
    return fail(call,
                call.name + " failed " + where() + ": " + detail +
                    wording.failureSuffix,
                wording.peerHint);
  }

  failedSeq = call.seq;
  publish(call.seq, "failed", call.name, call.site, unixMillis(),
          timedOut ? "timed out after " + seconds(options.timeout) : detail);
  std::string storeProblem;
  std::vector<PeerState> peers = readPeers(
      timedOut ? std::chrono::milliseconds(0) : kPeerReportGrace, storeProblem);
  if (storeUsable) {
    try {
      store->set(kDonePrefix + std::to_string(options.rank), toBytes("1"));
    } catch (const std::exception &) {
      storeUsable = false;
    }
  }
  std::string summary = storeProblem.empty()
                            ? summarizePeers(call, peers, timedOut)
                            : "the peers' states are unknown: " + storeProblem;

  std::string problem =
      timedOut ? call.describe() + " timed out " + where() +
                     " after the deadline of " + seconds(options.timeout)
               : call.describe() + " failed " + where() + " (" + detail + ")";
  if (!summary.empty())
    problem += ": " + summary;
  if (timedOut)
    problem += " (" + detail + ")";
  problem += wording.failureSuffix;
  std::string hint = timedOut ? timeoutHint : wording.peerHint;

  // The record holds the whole message, and the message the record's path.
  std::string record;
  if (options.flightDir != "off") {
    FlightRecorder::Header header;
    header.rank = options.rank;
    header.worldSize = options.worldSize;
    header.timeoutSeconds = options.timeout.count() / 1000.0;
    header.reason = fail(call, problem, hint).what();
    for (const PeerState &peer : peers)
      header.peers.push_back(
          "rank " + std::to_string(peer.rank) + ": " +
          (peer.known ? peer.state + " #" + std::to_string(peer.seq) + " " +
                            peer.collective + siteText(peer.site) +
                            (peer.detail.empty() ? "" : ": " + peer.detail)
                      : "no collective recorded"));
    if (!storeProblem.empty())
      header.peers.push_back(storeProblem);
    try {
      record = "flight record of this rank's last collectives: " +
               flight.write(options.flightDir, header);
    } catch (const std::exception &e) {
      record = "the flight record could not be written (" +
               std::string(e.what()) + "; set DLOSS_FLIGHT_DIR)";
    }
  }
  if (!record.empty())
    problem += ". " + record;
  return fail(call, problem, hint);
}

EngineBase::~EngineBase() {
  if (options.rank != 0 || failedSeq < 0 || !storeUsable)
    return;
  // Rank 0 hosts the store: keep it up while peers that were in the failed
  // collective (or later) still read their peers' states. A peer that has
  // recorded its failure is reading (for at most kPeerReportGrace); one that
  // has not may yet fail, or may be dead, so it gets about that long too.
  Clock::time_point start = Clock::now();
  Clock::time_point end = start + kFailureLinger;
  auto silentEnd = start + kPeerReportGrace + std::chrono::milliseconds(500);
  try {
    while (Clock::now() < end) {
      bool diagnosing = false, silent = false;
      for (int r = 1; r < options.worldSize; ++r) {
        if (store->check({kDonePrefix + std::to_string(r)}))
          continue;
        std::string key = kSeqPrefix + std::to_string(r);
        if (!store->check({key}))
          continue;
        PeerState peer = decodeState(r, fromBytes(store->get(key)));
        if (!peer.known || peer.seq < failedSeq)
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

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

void EngineBase::checkDefined(const Call &call,
                              const at::Tensor &tensor) const {
  if (!tensor.defined())
    throw fail(call, call.name + " got an undefined tensor " + where(),
               "Pass a tensor");
}

void EngineBase::checkReducible(const Call &call, const at::Tensor &tensor,
                                Reduction op) const {
  at::ScalarType type = tensor.scalar_type();
  if (op == Reduction::Mean && !at::isFloatingType(type))
    throw fail(call,
               call.name + " Mean of an integer tensor (" +
                   c10::toString(type) + ") is not defined " + where(),
               "Convert the tensor to a floating type, or reduce with Sum and "
               "divide by the world size");
  if (!reduces(type))
    throw fail(call,
               call.name + " " + reductionName(op) + " of a " +
                   c10::toString(type) + " tensor is not supported by " +
                   wording.name + " " + where(),
               wording.reduceTypeHint);
}

int64_t EngineBase::checkAxis(const Call &call, const at::Tensor &tensor,
                              int64_t axis) const {
  int64_t dims = tensor.dim();
  if (dims == 0 || axis < -dims || axis >= dims)
    throw fail(call,
               call.name + " axis " + std::to_string(axis) +
                   " is out of range for a " + std::to_string(dims) +
                   "-d tensor " + where(),
               "Pass an axis in [-dims, dims) of a tensor with at least one "
               "dimension");
  return axis < 0 ? axis + dims : axis;
}

void EngineBase::checkSizes(const Call &call,
                            const std::vector<int64_t> &sizes) const {
  if (static_cast<int64_t>(sizes.size()) != options.worldSize)
    throw fail(call,
               call.name + " got " + std::to_string(sizes.size()) + " sizes " +
                   where() + ", expected one per rank (" +
                   std::to_string(options.worldSize) + ")",
               "Pass every rank's size in rank order, as exchanged with "
               "allGatherInts");
  for (size_t r = 0; r < sizes.size(); ++r)
    if (sizes[r] < 0)
      throw fail(call,
                 call.name + " got a negative size " +
                     std::to_string(sizes[r]) + " for rank " +
                     std::to_string(r) + " " + where(),
                 "Pass every rank's size in rank order, as exchanged with "
                 "allGatherInts");
}

int64_t EngineBase::checkGather(const Call &call, const at::Tensor &input,
                                int64_t axis,
                                const std::vector<int64_t> &sizes) const {
  int64_t dim = checkAxis(call, input, axis);
  checkSizes(call, sizes);
  if (sizes[options.rank] != input.size(dim))
    throw fail(call,
               "allGather sizes[" + std::to_string(options.rank) +
                   "] = " + std::to_string(sizes[options.rank]) +
                   " but this rank's tensor has " +
                   std::to_string(input.size(dim)) + " along axis " +
                   std::to_string(dim) + " " + where(),
               "Pass the sizes exchanged with allGatherInts, in rank order, "
               "for the same tensor");
  return dim;
}

int64_t EngineBase::checkScatter(const Call &call, const at::Tensor &input,
                                 int64_t axis,
                                 const std::vector<int64_t> &sizes) const {
  int64_t dim = checkAxis(call, input, axis);
  checkSizes(call, sizes);
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (total != input.size(dim))
    throw fail(call,
               "reduceScatter sizes add up to " + std::to_string(total) +
                   " but the tensor has " + std::to_string(input.size(dim)) +
                   " along axis " + std::to_string(dim) + " " + where(),
               "Pass every rank's slice size in rank order; they must add up "
               "to the reduced axis");
  return dim;
}

void EngineBase::checkRoot(const Call &call, int root) const {
  if (root < 0 || root >= options.worldSize)
    throw fail(call,
               "broadcast root " + std::to_string(root) + " is not a rank " +
                   where(),
               "Pass a root in [0, world size)");
}

void EngineBase::checkShiftDims(const Call &call,
                                const at::Tensor &input) const {
  if (input.dim() > kMaxDims)
    throw fail(call,
               "ringShift of a " + std::to_string(input.dim()) + "-d tensor " +
                   where() + " exceeds the limit of " +
                   std::to_string(kMaxDims) + " dimensions",
               "Reshape the tensor to fewer dimensions before the shift");
}

EngineBase::ShiftPeers EngineBase::shiftPeers(int64_t shift) const {
  int64_t n = options.worldSize;
  int64_t step = ((shift % n) + n) % n;
  return {step, static_cast<int>((options.rank + step) % n),
          static_cast<int>((options.rank - step + n) % n)};
}

void EngineBase::checkPeer(const Call &call, int peer, int tag) const {
  if (peer < 0 || peer >= options.worldSize || peer == options.rank)
    throw fail(call,
               call.name + " names peer rank " + std::to_string(peer) + " " +
                   where() + ", which is not another rank of the job",
               "Pass a peer in [0, world size) other than this rank; a "
               "transfer to oneself is a local copy");
  if (tag < 0 || tag >= kReservedTagBase)
    throw fail(call,
               call.name + " tag " + std::to_string(tag) + " is out of range " +
                   where(),
               wording.tagHint);
}

void EngineBase::writeShiftHeader(const at::Tensor &data, int64_t *header) {
  std::fill(header, header + kHeaderLength, int64_t{0});
  header[0] = data.dim();
  header[1] = static_cast<int64_t>(data.scalar_type());
  for (int64_t d = 0; d < data.dim(); ++d)
    header[2 + d] = data.size(d);
}

at::Tensor EngineBase::fromShiftHeader(const Call &call, const int64_t *header,
                                       int src, const at::Tensor &data) const {
  int64_t dims = header[0];
  if (dims < 0 || dims > kMaxDims || header[1] < 0 ||
      header[1] >= static_cast<int64_t>(at::ScalarType::NumOptions))
    throw fail(call,
               "ringShift received a malformed header from rank " +
                   std::to_string(src) + " " + where(),
               "Make sure every rank runs the same dloss build and the same "
               "collective calls in the same order");
  std::vector<int64_t> shape(header + 2, header + 2 + dims);
  auto type = static_cast<at::ScalarType>(header[1]);
  return at::empty(shape, data.options().dtype(type));
}

//===----------------------------------------------------------------------===//
// Connecting
//===----------------------------------------------------------------------===//

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

// Rank 0 hosts the server. waitWorkers stays off: TCPStore's own join wait
// cannot say which ranks are missing and destroys the store when it gives up;
// the arrival protocol in rendezvous() waits for every rank instead. These
// options read the same in LibTorch 1.13 and 2.x.
c10::intrusive_ptr<c10d::Store> openStore(const RendezvousOptions &options,
                                          const std::string &otherHolders) {
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<std::uint16_t>(options.masterPort);
  storeOptions.isServer = options.rank == 0;
  storeOptions.numWorkers = static_cast<std::size_t>(options.worldSize);
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(options.masterAddr,
                                               storeOptions);
  } catch (const std::exception &e) {
    std::string detail = describeError(e);
    if (options.rank == 0)
      throw rendezvousError(
          options,
          "rank 0 could not host the rendezvous store on port " +
              std::to_string(options.masterPort) + " (" + detail + ")",
          "Another process (perhaps " + otherHolders +
              ") may hold MASTER_PORT=" + std::to_string(options.masterPort) +
              ": pick a free port or stop that process");
    throw rendezvousError(
        options,
        "could not reach the rendezvous store of rank 0 at " +
            storeAddress(options) + " within the deadline of " +
            seconds(options.timeout) + ": rank 0 never joined (" + detail + ")",
        "Rank 0 hosts the store: check that it was started and that its log "
        "shows no earlier error, that every rank uses the same MASTER_ADDR "
        "and MASTER_PORT, or raise DLOSS_TIMEOUT_S if rank 0 starts late");
  }
}

void guardStore(const RendezvousOptions &options,
                const std::function<void()> &body) {
  try {
    body();
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throw rendezvousError(
        options,
        "lost the rendezvous store of rank 0 at " + storeAddress(options) +
            " during the rendezvous (" + describeError(e) + ")",
        "Rank 0 probably failed or gave up: check its log for the first "
        "error");
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
          store, missing.empty() ? "ok" : "missing:" + joinRanks(missing));
    } else {
      std::this_thread::sleep_for(kStorePoll);
    }
  }
  if (verdict == "ok")
    return;

  std::string missing = verdict.substr(verdict.find(':') + 1);
  size_t missingCount = std::count(missing.begin(), missing.end(), ',') + 1;
  if (options.rank == 0) {
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
           joinRanks(missing) + " " + never +
           " (check whether they died or failed)";
  } catch (const std::exception &) {
    return ": rank 0, which hosts the rendezvous store, is unreachable "
           "(it probably died)";
  }
}

} // namespace engine
} // namespace dloss
