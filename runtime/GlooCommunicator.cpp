// The Gloo engine: Communicator over c10d's ProcessGroupGloo and TCPStore.
// Every c10d call of the project lives in this file. Setup (store, device,
// process group) and error text go through namespace `compat`, the place to
// adapt when c10d changes; the collective calls themselves (allgather,
// allreduce, broadcast, send, recv, Work::wait) read the same in LibTorch
// 1.13 and 2.x.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO // ProcessGroupGloo.hpp is empty without it.
#endif

#include "runtime/Communicator.h"
#include "runtime/Error.h"
#include "runtime/FlightRecorder.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

namespace dloss {

namespace {

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Version-sensitive c10d calls (LibTorch 1.13 and 2.x)
//===----------------------------------------------------------------------===//

namespace compat {

// Rank 0 hosts the server. waitWorkers stays off: TCPStore's own join wait
// cannot say which ranks are missing and destroys the store when it gives up;
// the arrival protocol in rendezvous() waits for every rank instead.
c10::intrusive_ptr<c10d::Store> openTcpStore(const RendezvousOptions &options) {
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<std::uint16_t>(options.masterPort);
  storeOptions.isServer = options.rank == 0;
  storeOptions.numWorkers = static_cast<std::size_t>(options.worldSize);
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;
  return c10::make_intrusive<c10d::TCPStore>(options.masterAddr, storeOptions);
}

// The address Gloo listens on: GLOO_SOCKET_IFNAME as in torch.distributed,
// else the master address when it is local (single-host jobs, loopback
// tests), else this host's own name (multi-host jobs, where binding to rank
// 0's address would fail).
std::shared_ptr<::gloo::transport::Device>
makeDevice(const std::string &masterAddr) {
  if (const char *interface = std::getenv("GLOO_SOCKET_IFNAME"))
    if (*interface)
      return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  try {
    return c10d::ProcessGroupGloo::createDeviceForHostname(masterAddr);
  } catch (const std::exception &) {
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
}

c10::intrusive_ptr<c10d::ProcessGroupGloo>
makeProcessGroup(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                 int worldSize,
                 std::shared_ptr<::gloo::transport::Device> device,
                 std::chrono::milliseconds timeout) {
  auto groupOptions = c10d::ProcessGroupGloo::Options::create(timeout);
  groupOptions->devices.push_back(std::move(device));
  // One worker thread: calls are synchronous, so a second thread would only
  // idle, and the machines running many ranks are short of cores.
  groupOptions->threads = 1;
  // A prefix keeps Gloo's keys apart from the rendezvous keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dloss/gloo", store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, worldSize,
                                                     groupOptions);
}

// c10::Error::what() appends a C++ backtrace; users need the message only.
std::string describe(const std::exception &e) {
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

} // namespace compat

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

// Tags at or above this value are the engine's own (ringShift,
// reduceScatter); user tags stay below so a ring schedule can never steal
// the engine's messages.
constexpr int kReservedTagBase = 1 << 30;
constexpr int kRingShiftHeaderTag = kReservedTagBase;
constexpr int kRingShiftDataTag = kReservedTagBase + 1;
// reduceScatter's ring (ProcessGroupGloo 1.13 has no reduce_scatter).
constexpr int kReduceScatterTag = kReservedTagBase + 2;
// ringShift header: [ndim, dtype, sizes...]; fixed length so the receiver can
// post it before knowing anything.
constexpr int64_t kMaxDims = 64;
constexpr int64_t kHeaderLength = 2 + kMaxDims;
// Collectives: Work::wait's own limit is the deadline plus this margin, so
// that Gloo's deadline (the same timeout, inside the worker thread) fires
// first and reports more precisely; it only guards against a stuck thread.
constexpr std::chrono::milliseconds kWaitMargin{2000};
constexpr std::chrono::milliseconds kPollInterval{20};
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
// Set by a rank once its Gloo mesh is connected.
const char *const kMeshPrefix = "dloss/mesh/";
// After a failure that is not a timeout (a closed connection), how long a
// rank waits for its peers to record their own failure before naming the
// silent ones: a dead rank never records one.
constexpr std::chrono::milliseconds kPeerReportGrace{1000};
// How long a failed rank 0 keeps the store up for the peers' diagnosis.
constexpr std::chrono::milliseconds kFailureLinger{3000};
// Peers named one by one in an error; the rest are counted.
constexpr size_t kMaxPeerClauses = 8;

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

bool looksLikeTimeout(const std::string &message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

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

// The dtypes Gloo 1.13 moves and reduces natively.
bool glooHasType(at::ScalarType type) {
  switch (type) {
  case at::kFloat:
  case at::kDouble:
  case at::kHalf:
  case at::kChar:
  case at::kByte:
  case at::kInt:
  case at::kLong:
    return true;
  default:
    return false;
  }
}

// Transfers do not look at the values, so other dtypes (bool, bfloat16,
// complex) travel as bytes. The result shares storage with `contiguous`.
at::Tensor toWire(const at::Tensor &contiguous) {
  if (glooHasType(contiguous.scalar_type()))
    return contiguous;
  return contiguous.reshape({-1}).view(at::kByte);
}

at::Tensor fromWire(const at::Tensor &wire, at::ScalarType type,
                    at::IntArrayRef shape) {
  if (wire.scalar_type() == type)
    return wire.view(shape);
  return wire.view(type).view(shape);
}

c10d::ReduceOp toC10d(Reduction op) {
  switch (op) {
  case Reduction::Max:
    return c10d::ReduceOp::MAX;
  case Reduction::Min:
    return c10d::ReduceOp::MIN;
  case Reduction::Sum:
  case Reduction::Mean: // Summed, then divided by the world size.
    return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

// What a failing call reports: the method, the IR op a plan step lowers to
// it, and the caller's site (its step's op and location, when the executor
// runs one). `seq` and `flight` are set once a collective starts.
struct Call {
  Call(std::string name, std::string irOp)
      : name(std::move(name)), irOp(std::move(irOp)) {
    if (const CallSite *current = currentCallSite())
      site = *current;
  }

  std::string name;
  std::string irOp;
  CallSite site;
  int64_t seq = -1;     // the collective's number; -1 for send and recv
  uint64_t flight = 0;  // its flight recorder handle
  int64_t startUnixMs = 0;
  /// For a send or recv inside an exchange (which gives it its number):
  /// "send to rank 2 (tag 1024)", reported with the failure.
  std::string transfer;

  /// "collective #12 allGather (in @clip_grad)".
  std::string describe() const {
    std::string out = seq >= 0 ? "collective #" + std::to_string(seq) + " " +
                                     name
                               : name;
    if (!site.phase.empty())
      out += " (" + site.phase +
             (site.function.empty() ? "" : " of @" + site.function) + ")";
    else if (!site.function.empty())
      out += " (in @" + site.function + ")";
    return out;
  }
};

// A peer's latest collective as it recorded it in the store.
struct PeerState {
  int rank = -1;
  bool known = false;
  int64_t seq = 0;
  std::string state; // "started" or "failed"
  std::string collective;
  CallSite site;
  int64_t unixMs = 0;
  std::string detail;
};

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

//===----------------------------------------------------------------------===//
// GlooCommunicator
//===----------------------------------------------------------------------===//

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(RendezvousOptions options,
                   c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : options(std::move(options)), store(std::move(store)),
        group(std::move(group)) {}
  ~GlooCommunicator() override;

  int rank() const override { return options.rank; }
  int worldSize() const override { return options.worldSize; }

  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) override;
  at::Tensor allReduce(const at::Tensor &input, Reduction op) override;
  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) override;
  at::Tensor broadcast(const at::Tensor &input, int root) override;
  at::Tensor ringShift(const at::Tensor &input, int64_t shift) override;
  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override;
  std::unique_ptr<Request> send(const at::Tensor &tensor, int peer,
                                int tag) override;
  std::unique_ptr<Request> recv(at::Tensor &tensor, int peer, int tag) override;
  int64_t collectivesStarted() const override { return started; }
  void beginExchange(const std::string &name) override;
  void endExchange() override;
  void noteFailure(const std::string &message) override;

  /// A Gloo allreduce of one element: returns once every rank has finished
  /// building its process group.
  void barrier(Call &call);

  /// Runs `body`, turning any c10d or Gloo failure into a dloss::Error. After
  /// a failure the group's state is unknown (a peer may be gone, a
  /// collective half done), so every later call fails fast. A collective
  /// (begun with begin()) is marked completed or failed in the flight
  /// recorder, and its failure names the peers' states.
  template <typename Body>
  auto communicate(Call &call, Body &&body) -> decltype(body());

  /// Waits for a collective's `work`; throws what the work threw.
  void awaitCollective(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout + kWaitMargin);
  }
  /// Waits for a send or recv, whose only deadline is this one.
  void awaitTransfer(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout);
  }

private:
  Error fail(const Call &call, std::string problem, std::string hint) const {
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

  /// Numbers the collective `call`, records it in the flight recorder and
  /// publishes its number in the store. `tensor` (optional) is what this
  /// rank contributes.
  void begin(Call &call, const at::Tensor *tensor);
  /// Marks a collective completed (also one that had nothing to move).
  void complete(Call &call);
  /// Publishes this rank's state in the store; store failures only turn the
  /// bookkeeping off (the collective itself reports a dead peer).
  void publish(int64_t seq, const std::string &state,
               const std::string &collective, const CallSite &site,
               int64_t unixMs, const std::string &detail);
  /// The error of a failed collective: its number and site, the peers'
  /// states, and the path of the flight record.
  Error diagnose(Call &call, const std::string &detail);
  /// Reads every peer's state; waits up to `grace` for the peers to record
  /// a failure. Sets `storeProblem` when the store cannot be read.
  std::vector<PeerState> readPeers(std::chrono::milliseconds grace,
                                   std::string &storeProblem);
  std::string summarizePeers(const Call &call,
                             const std::vector<PeerState> &peers,
                             bool timedOut) const;

  std::string where() const {
    return "on rank " + std::to_string(options.rank) + " of " +
           std::to_string(options.worldSize);
  }

  void checkCpu(const Call &call, const at::Tensor &tensor) const;
  void checkReducible(const Call &call, const at::Tensor &tensor,
                      Reduction op) const;
  int64_t checkAxis(const Call &call, const at::Tensor &tensor,
                    int64_t axis) const;
  void checkSizes(const Call &call, const std::vector<int64_t> &sizes) const;
  void checkPeer(const Call &call, int peer, int tag) const;
  /// The summed/maxed/minned tensor; Mean is left to the caller to divide.
  at::Tensor reduce(Call &call, const at::Tensor &input, Reduction op);

  RendezvousOptions options;
  // Declared before the group so that it is destroyed after it.
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  /// Why the communicator is unusable; empty while it is healthy.
  std::string broken;
  /// Collectives started, i.e. the number of the latest one.
  int64_t started = 0;
  /// The number of the collective that failed; -1 while healthy.
  int64_t failedSeq = -1;
  /// False once a store operation failed: the bookkeeping stops.
  bool storeUsable = true;
  /// The open exchange (beginExchange), whose number its transfers carry.
  std::optional<Call> exchange;
  /// A send or recv's call: its own, or the open exchange's.
  Call transferCall(std::string transfer) const;
  FlightRecorder flight;
};

// A send or recv in flight. It refers to its communicator, which must outlive
// it (the plan executor waits on every request before returning).
class GlooRequest final : public Communicator::Request {
public:
  GlooRequest(GlooCommunicator *owner, Call call,
              c10::intrusive_ptr<c10d::Work> work, at::Tensor wire,
              at::Tensor target)
      : owner(owner), call(std::move(call)), work(std::move(work)),
        wire(std::move(wire)), target(std::move(target)) {}

  void wait() override {
    if (done)
      return;
    owner->communicate(call, [&] {
      if (work)
        owner->awaitTransfer(work);
      // A recv into a non-contiguous or non-Gloo-dtype tensor went through
      // a staging buffer.
      if (target.defined() && wire.defined() && !wire.is_same(target))
        target.copy_(fromWire(wire, target.scalar_type(), target.sizes()));
    });
    done = true;
  }

private:
  GlooCommunicator *owner;
  Call call;
  c10::intrusive_ptr<c10d::Work> work; // Null for empty tensors.
  at::Tensor wire;
  at::Tensor target;
  bool done = false;
};

template <typename Body>
auto GlooCommunicator::communicate(Call &call, Body &&body)
    -> decltype(body()) {
  if (!broken.empty()) {
    flight.finish(call.flight, FlightEntry::State::Failed,
                  "not run: the communicator was already unusable");
    throw fail(call,
               call.describe() + " cannot run " + where() +
                   ": the communicator is unusable after an earlier failure (" +
                   broken + ")",
               "Handle the first error: the job has to be restarted once a "
               "collective has failed");
  }
  std::string detail;
  try {
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      complete(call);
      return;
    } else {
      auto result = body();
      complete(call);
      return result;
    }
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header).
    broken = call.name + ": " + e.problem();
    flight.finish(call.flight, FlightEntry::State::Failed, e.problem());
    throw;
  } catch (const std::exception &e) {
    detail = compat::describe(e);
  } catch (...) {
    detail = "unknown exception";
  }
  if (!call.transfer.empty())
    detail = call.transfer + ": " + detail;
  broken = call.describe() + " failed: " + detail;
  throw diagnose(call, detail);
}

void GlooCommunicator::begin(Call &call, const at::Tensor *tensor) {
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
    entry.bytes = static_cast<int64_t>(tensor->numel() * tensor->element_size());
  }
  call.flight = flight.start(std::move(entry));
  // A broken communicator refuses the call; its recorded failure stays.
  if (broken.empty())
    publish(call.seq, "started", call.name, call.site, call.startUnixMs, "");
}

void GlooCommunicator::complete(Call &call) {
  // A transfer of an exchange completes with the exchange (endExchange).
  if (!call.transfer.empty())
    return;
  flight.finish(call.flight, FlightEntry::State::Completed);
}

void GlooCommunicator::beginExchange(const std::string &name) {
  Call call{name, ""};
  begin(call, nullptr);
  exchange = call;
}

void GlooCommunicator::endExchange() {
  if (!exchange)
    return;
  // A failed exchange stays failed in the flight record.
  if (broken.empty())
    complete(*exchange);
  exchange.reset();
}

Call GlooCommunicator::transferCall(std::string transfer) const {
  if (!exchange)
    return Call{std::move(transfer), ""};
  Call call = *exchange;
  call.transfer = std::move(transfer);
  return call;
}

void GlooCommunicator::publish(int64_t seq, const std::string &state,
                               const std::string &collective,
                               const CallSite &site, int64_t unixMs,
                               const std::string &detail) {
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

void GlooCommunicator::noteFailure(const std::string &message) {
  // A failed collective has recorded its own, more precise state.
  if (!broken.empty())
    return;
  publish(started, "failed", "", CallSite{}, unixMillis(), message);
}

std::vector<PeerState>
GlooCommunicator::readPeers(std::chrono::milliseconds grace,
                            std::string &storeProblem) {
  std::vector<PeerState> peers;
  if (!storeUsable) {
    storeProblem = "the rendezvous store at " + options.masterAddr + ":" +
                   std::to_string(options.masterPort) +
                   " could not be reached earlier: rank 0, which hosts it, "
                   "has probably exited or died";
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
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const std::exception &e) {
    storeUsable = false;
    storeProblem = "the rendezvous store at " + options.masterAddr + ":" +
                   std::to_string(options.masterPort) +
                   " cannot be read (" + compat::describe(e) +
                   "): rank 0, which hosts it, has probably exited or died";
    peers.clear();
    return peers;
  }
}

std::string GlooCommunicator::summarizePeers(const Call &call,
                                             const std::vector<PeerState> &peers,
                                             bool timedOut) const {
  std::vector<std::string> clauses;
  std::vector<int> reached;
  int64_t now = unixMillis();
  auto ago = [now](int64_t unixMs) {
    std::ostringstream out;
    out.precision(1);
    out << std::fixed << std::max<int64_t>(0, now - unixMs) / 1000.0 << " s ago";
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

Error GlooCommunicator::diagnose(Call &call, const std::string &detail) {
  bool timedOut = looksLikeTimeout(detail);
  flight.finish(call.flight, FlightEntry::State::Failed, detail);
  std::string timeoutHint =
      "Some rank did not reach this collective in time: check the ranks "
      "named above (and the other ranks' logs) for an earlier error or a "
      "hang, make sure every rank makes the same collective calls in the "
      "same order, or raise DLOSS_TIMEOUT_S if the ranks are only slow";
  std::string peerHint =
      "A peer rank probably failed or exited: check the other ranks' logs "
      "for the first error (this one is a consequence)";
  if (call.seq < 0) {
    // A send or recv: its peer is the only rank involved.
    if (timedOut)
      return fail(call,
                  call.name + " timed out " + where() +
                      " after the deadline of " + seconds(options.timeout) +
                      " (" + detail + ")",
                  timeoutHint);
    return fail(call, call.name + " failed " + where() + ": " + detail,
                peerHint);
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
  std::string hint = timedOut ? timeoutHint : peerHint;

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

GlooCommunicator::~GlooCommunicator() {
  // Closing the Gloo pairs first makes peers still blocked on this rank fail
  // now rather than at their deadline.
  group.reset();
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
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const std::exception &) {
    // Nothing to keep up any more.
  }
}

void GlooCommunicator::checkCpu(const Call &call,
                                const at::Tensor &tensor) const {
  if (!tensor.defined())
    throw fail(call, call.name + " got an undefined tensor " + where(),
               "Pass a tensor");
  if (!tensor.device().is_cpu())
    throw fail(call,
               call.name + " got a tensor on " + tensor.device().str() + " " +
                   where() + ", but the Gloo engine moves CPU tensors",
               "Move the tensor to the CPU, or use the NCCL engine for GPU "
               "tensors");
}

void GlooCommunicator::checkReducible(const Call &call,
                                      const at::Tensor &tensor,
                                      Reduction op) const {
  at::ScalarType type = tensor.scalar_type();
  if (op == Reduction::Mean && !at::isFloatingType(type))
    throw fail(call,
               call.name + " Mean of an integer tensor (" +
                   c10::toString(type) + ") is not defined " + where(),
               "Convert the tensor to a floating type, or reduce with Sum and "
               "divide by the world size");
  if (!glooHasType(type))
    throw fail(call,
               call.name + " " + reductionName(op) + " of a " +
                   c10::toString(type) + " tensor is not supported by Gloo " +
                   where(),
               "Convert to float, double, half or an integer type first");
}

int64_t GlooCommunicator::checkAxis(const Call &call, const at::Tensor &tensor,
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

void GlooCommunicator::checkSizes(const Call &call,
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

void GlooCommunicator::checkPeer(const Call &call, int peer, int tag) const {
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
               "Use tags in [0, 2^30); larger ones are reserved for the "
               "engine's own ringShift and reduceScatter");
}

at::Tensor GlooCommunicator::allGather(const at::Tensor &input, int64_t axis,
                                       const std::vector<int64_t> &sizes) {
  Call call{"allGather", "dloss.all_gather"};
  checkCpu(call, input);
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

  // Gloo gathers equal shapes: pad every piece to the largest size.
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> paddedShape = input.sizes().vec();
  paddedShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = total;
  int64_t paddedNumel = std::accumulate(paddedShape.begin(), paddedShape.end(),
                                        int64_t{1}, std::multiplies<>());
  begin(call, &input);
  // Every rank knows the sizes, so all skip together when nothing would move.
  if (paddedNumel == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }

  at::Tensor padded = at::zeros(paddedShape, input.options());
  padded.narrow(dim, 0, input.size(dim)).copy_(input);
  return communicate(call, [&] {
    std::vector<at::Tensor> inputs{toWire(padded)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(at::empty_like(inputs[0]));
    awaitCollective(group->allgather(outputs, inputs));
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < options.worldSize; ++r)
      pieces.push_back(fromWire(outputs[0][r], input.scalar_type(), paddedShape)
                           .narrow(dim, 0, sizes[r]));
    return at::cat(pieces, dim);
  });
}

at::Tensor GlooCommunicator::reduce(Call &call, const at::Tensor &input,
                                    Reduction op) {
  begin(call, &input);
  // The clone is what Gloo reduces in place: the caller's tensor stays as is.
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0) {
    complete(call);
    return result;
  }
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{result};
    c10d::AllreduceOptions reduceOptions;
    reduceOptions.reduceOp = toC10d(op);
    awaitCollective(group->allreduce(tensors, reduceOptions));
  });
  return result;
}

at::Tensor GlooCommunicator::allReduce(const at::Tensor &input, Reduction op) {
  Call call{"allReduce", "dloss.all_reduce"};
  checkCpu(call, input);
  checkReducible(call, input, op);
  at::Tensor result = reduce(call, input, op);
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor GlooCommunicator::reduceScatter(const at::Tensor &input,
                                           Reduction op, int64_t axis,
                                           const std::vector<int64_t> &sizes) {
  Call call{"reduceScatter", "dloss.reduce_scatter"};
  checkCpu(call, input);
  checkReducible(call, input, op);
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
  begin(call, &input);
  int n = options.worldSize;
  int rank = options.rank;
  if (n == 1) { // The only block is the whole input.
    complete(call);
    return input.clone(at::MemoryFormat::Contiguous);
  }
  // Block b is rank b's slice [offsets[b], offsets[b] + sizes[b]) of `dim`.
  std::vector<int64_t> offsets(n, 0);
  for (int b = 1; b < n; ++b)
    offsets[b] = offsets[b - 1] + sizes[b - 1];
  auto block = [&](int b) { return input.narrow(dim, offsets[b], sizes[b]); };
  auto shapeOf = [&](int b) {
    std::vector<int64_t> shape = input.sizes().vec();
    shape[dim] = sizes[b];
    return shape;
  };
  std::vector<int64_t> rest = input.sizes().vec();
  rest[dim] = 1;
  int64_t inner = c10::multiply_integers(rest); // elements per index of `dim`
  int64_t largest = *std::max_element(sizes.begin(), sizes.end()) * inner;

  return communicate(call, [&] {
    at::Tensor result = at::empty(shapeOf(rank), input.options());
    // A ring (as in NCCL and Horovod): in step k, rank r sends its partial
    // sum of block (r - k - 1) mod N to rank r + 1 and adds its own share to
    // block (r - k - 2) mod N, received from rank r - 1; after N - 1 steps
    // the last block received, (r - N) mod N = r, holds every rank's share.
    // Each rank sends N - 1 blocks. Besides the result it holds at most two
    // blocks: the one going out and the one coming in, which goes out in
    // the next step. Its own first block goes out straight from the input
    // when it is contiguous (along the leading axis).
    int next = (rank + 1) % n, previous = (rank - 1 + n) % n;
    std::vector<at::Tensor> spare; // buffers whose sends have completed
    auto take = [&] {
      if (spare.empty())
        return at::empty({largest}, input.options());
      at::Tensor buffer = spare.back();
      spare.pop_back();
      return buffer;
    };
    auto inBuffer = [&](const at::Tensor &buffer, int b) {
      return buffer.narrow(0, 0, sizes[b] * inner).view(shapeOf(b));
    };
    int firstBlock = (rank - 1 + n) % n;
    at::Tensor sendData = block(firstBlock), sendBuffer;
    if (!sendData.is_contiguous()) {
      sendBuffer = take();
      sendData = inBuffer(sendBuffer, firstBlock).copy_(sendData);
    }
    for (int k = 0; k < n - 1; ++k) {
      int recvBlock = (rank - k - 2 + 2 * n) % n;
      bool last = k == n - 2;
      at::Tensor recvBuffer = last ? at::Tensor() : take();
      at::Tensor recvData = last ? result : inBuffer(recvBuffer, recvBlock);
      // Every rank knows every block's size, so both ends skip empty ones.
      std::vector<at::Tensor> recvWire{toWire(recvData)};
      std::vector<at::Tensor> sendWire{toWire(sendData)};
      c10::intrusive_ptr<c10d::Work> in, out;
      // Receives are posted before sends, so no cycle of the ring waits.
      if (recvData.numel() > 0)
        in = group->recv(recvWire, previous, kReduceScatterTag);
      if (sendData.numel() > 0)
        out = group->send(sendWire, next, kReduceScatterTag);
      if (in)
        awaitTransfer(in);
      at::Tensor own = block(recvBlock);
      switch (op) {
      case Reduction::Sum:
      case Reduction::Mean:
        recvData.add_(own);
        break;
      case Reduction::Max:
        at::maximum_out(recvData, recvData, own);
        break;
      case Reduction::Min:
        at::minimum_out(recvData, recvData, own);
        break;
      }
      if (out)
        awaitTransfer(out);
      if (sendBuffer.defined())
        spare.push_back(sendBuffer);
      sendData = recvData;
      sendBuffer = recvBuffer;
    }
    if (op == Reduction::Mean)
      result.div_(n);
    return result;
  });
}

at::Tensor GlooCommunicator::broadcast(const at::Tensor &input, int root) {
  Call call{"broadcast", "dloss.broadcast"};
  checkCpu(call, input);
  if (root < 0 || root >= options.worldSize)
    throw fail(call,
               "broadcast root " + std::to_string(root) + " is not a rank " +
                   where(),
               "Pass a root in [0, world size)");
  begin(call, &input);
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0) {
    complete(call);
    return result;
  }
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{toWire(result)};
    c10d::BroadcastOptions broadcastOptions;
    broadcastOptions.rootRank = root;
    awaitCollective(group->broadcast(tensors, broadcastOptions));
  });
  return result;
}

at::Tensor GlooCommunicator::ringShift(const at::Tensor &input, int64_t shift) {
  Call call{"ringShift", "dloss.ring_shift"};
  checkCpu(call, input);
  int64_t n = options.worldSize;
  int64_t step = ((shift % n) + n) % n;
  if (input.dim() > kMaxDims)
    throw fail(call,
               "ringShift of a " + std::to_string(input.dim()) + "-d tensor " +
                   where() + " exceeds the limit of " +
                   std::to_string(kMaxDims) + " dimensions",
               "Reshape the tensor to fewer dimensions before the shift");
  begin(call, &input);
  if (step == 0) {
    complete(call);
    return input.clone(); // Every rank keeps its own tensor.
  }
  int dst = static_cast<int>((options.rank + step) % n);
  int src = static_cast<int>((options.rank - step + n) % n);

  at::Tensor data = input.contiguous();
  at::Tensor sendHeader = at::zeros({kHeaderLength}, at::kLong);
  auto *header = sendHeader.data_ptr<int64_t>();
  header[0] = data.dim();
  header[1] = static_cast<int64_t>(data.scalar_type());
  for (int64_t d = 0; d < data.dim(); ++d)
    header[2 + d] = data.size(d);
  at::Tensor recvHeader = at::empty({kHeaderLength}, at::kLong);

  return communicate(call, [&] {
    // Every rank posts its receive before waiting on its send, so no cycle
    // of the ring waits on another (any shift, N = 2 included).
    std::vector<at::Tensor> recvHeaders{recvHeader};
    std::vector<at::Tensor> sendHeaders{sendHeader};
    auto headerIn = group->recv(recvHeaders, src, kRingShiftHeaderTag);
    auto headerOut = group->send(sendHeaders, dst, kRingShiftHeaderTag);
    awaitTransfer(headerIn);

    const auto *in = recvHeader.data_ptr<int64_t>();
    int64_t dims = in[0];
    if (dims < 0 || dims > kMaxDims || in[1] < 0 ||
        in[1] >= static_cast<int64_t>(at::ScalarType::NumOptions))
      throw fail(call,
                 "ringShift received a malformed header from rank " +
                     std::to_string(src) + " " + where(),
                 "Make sure every rank runs the same dloss build and the same "
                 "collective calls in the same order");
    std::vector<int64_t> shape(in + 2, in + 2 + dims);
    auto type = static_cast<at::ScalarType>(in[1]);
    at::Tensor received = at::empty(shape, data.options().dtype(type));

    // Both ends know both sizes now; empty tensors send nothing.
    std::vector<at::Tensor> recvData{toWire(received)};
    std::vector<at::Tensor> sendData{toWire(data)};
    c10::intrusive_ptr<c10d::Work> dataIn, dataOut;
    if (received.numel() > 0)
      dataIn = group->recv(recvData, src, kRingShiftDataTag);
    if (data.numel() > 0)
      dataOut = group->send(sendData, dst, kRingShiftDataTag);
    if (dataIn)
      awaitTransfer(dataIn);
    awaitTransfer(headerOut);
    if (dataOut)
      awaitTransfer(dataOut);
    return received;
  });
}

std::vector<int64_t>
GlooCommunicator::allGatherInts(const std::vector<int64_t> &values) {
  Call call{"allGatherInts", ""};
  at::Tensor local =
      at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), local.data_ptr<int64_t>());
  begin(call, &local);
  if (values.empty()) {
    complete(call);
    return {};
  }
  return communicate(call, [&] {
    std::vector<at::Tensor> inputs{local};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(at::empty_like(local));
    awaitCollective(group->allgather(outputs, inputs));
    std::vector<int64_t> gathered;
    gathered.reserve(values.size() * options.worldSize);
    for (const at::Tensor &piece : outputs[0])
      gathered.insert(gathered.end(), piece.data_ptr<int64_t>(),
                      piece.data_ptr<int64_t>() + piece.numel());
    return gathered;
  });
}

std::unique_ptr<Communicator::Request>
GlooCommunicator::send(const at::Tensor &tensor, int peer, int tag) {
  Call call = transferCall("send to rank " + std::to_string(peer) + " (tag " +
                           std::to_string(tag) + ")");
  checkCpu(call, tensor);
  checkPeer(call, peer, tag);
  // The request keeps `wire` alive until Gloo has read it.
  at::Tensor wire = toWire(tensor.contiguous());
  if (wire.numel() == 0)
    return std::make_unique<GlooRequest>(
        this, call, c10::intrusive_ptr<c10d::Work>(), wire, at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->send(tensors, peer, tag);
  });
  return std::make_unique<GlooRequest>(this, call, std::move(work), wire,
                                       at::Tensor());
}

std::unique_ptr<Communicator::Request>
GlooCommunicator::recv(at::Tensor &tensor, int peer, int tag) {
  Call call = transferCall("recv from rank " + std::to_string(peer) +
                           " (tag " + std::to_string(tag) + ")");
  checkCpu(call, tensor);
  checkPeer(call, peer, tag);
  // Receive in place when Gloo can; otherwise stage and copy in wait().
  at::Tensor wire;
  if (tensor.is_contiguous() && glooHasType(tensor.scalar_type()))
    wire = tensor;
  else
    wire = toWire(at::empty(tensor.sizes(), tensor.options()));
  if (wire.numel() == 0)
    return std::make_unique<GlooRequest>(this, call,
                                         c10::intrusive_ptr<c10d::Work>(),
                                         at::Tensor(), at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->recv(tensors, peer, tag);
  });
  return std::make_unique<GlooRequest>(this, call, std::move(work), wire,
                                       tensor);
}

void GlooCommunicator::barrier(Call &call) {
  at::Tensor token = at::ones({1}, at::kInt);
  begin(call, &token);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{token};
    awaitCollective(group->allreduce(tensors));
  });
}

//===----------------------------------------------------------------------===//
// Rendezvous
//===----------------------------------------------------------------------===//

Error rendezvousError(const RendezvousOptions &options, std::string problem,
                      std::string hint) {
  ErrorInfo info;
  info.problem = std::move(problem);
  info.hint = std::move(hint);
  info.rank = options.rank;
  return Error(std::move(info));
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

// Waits until every rank has announced itself in the store, or fails on
// every rank alike, naming the ranks that never came.
void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point deadline) {
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
      std::this_thread::sleep_for(kPollInterval);
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
      std::this_thread::sleep_for(kPollInterval);
  } else {
    store.add(kVerdictAckKey, 1);
  }
  throw rendezvousError(
      options,
      "the rendezvous of " + std::to_string(n) + " ranks at " +
          storeAddress(options) + " did not complete within the deadline of " +
          seconds(options.timeout) + ": " +
          (missingCount == 1 ? "rank " + missing + " never joined"
                             : "ranks " + missing + " never joined"),
      "Start every rank from 0 to " + std::to_string(n - 1) +
          " with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE; if the "
          "missing ranks were started, check their logs for an error before "
          "the rendezvous, or raise DLOSS_TIMEOUT_S if they start late");
}

void checkOptions(const RendezvousOptions &options) {
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
    throw Error("connectGloo: " + problem,
                "Pass RANK in [0, WORLD_SIZE), a MASTER_PORT in [1, 65535], "
                "a non-empty MASTER_ADDR and a positive DLOSS_TIMEOUT_S");
}

} // namespace

std::unique_ptr<Communicator> connectGloo(const RendezvousOptions &options) {
  checkOptions(options);
  Clock::time_point deadline = Clock::now() + options.timeout;

  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = compat::openTcpStore(options);
  } catch (const std::exception &e) {
    std::string detail = compat::describe(e);
    if (options.rank == 0)
      throw rendezvousError(
          options,
          "rank 0 could not host the rendezvous store on port " +
              std::to_string(options.masterPort) + " (" + detail + ")",
          "Another process (perhaps an earlier job) may hold MASTER_PORT=" +
              std::to_string(options.masterPort) +
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

  try {
    rendezvous(*store, options, deadline);
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throw rendezvousError(
        options,
        "lost the rendezvous store of rank 0 at " + storeAddress(options) +
            " during the rendezvous (" + compat::describe(e) + ")",
        "Rank 0 probably failed or gave up: check its log for the first "
        "error");
  }

  // Each rank records when its part of the mesh is up, so that a rank whose
  // mesh does not come up can name the peers that never got there (a rank
  // that died right after the rendezvous blocks everyone's mesh).
  auto meshKey = [](int rank) { return kMeshPrefix + std::to_string(rank); };
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  try {
    group = compat::makeProcessGroup(store, options.rank, options.worldSize,
                                     compat::makeDevice(options.masterAddr),
                                     options.timeout);
    store->set(meshKey(options.rank), toBytes("connected"));
  } catch (const std::exception &e) {
    std::string peers;
    try {
      std::vector<int> missing;
      for (int r = 0; r < options.worldSize; ++r)
        if (r != options.rank && !store->check({meshKey(r)}))
          missing.push_back(r);
      if (!missing.empty())
        peers = std::string(missing.size() == 1 ? ": rank " : ": ranks ") +
                joinRanks(missing) +
                " never connected (check whether they died or failed)";
    } catch (const std::exception &) {
      peers = ": rank 0, which hosts the rendezvous store, is unreachable "
              "(it probably died)";
    }
    throw rendezvousError(
        options,
        "could not connect the Gloo mesh after the rendezvous within the "
        "deadline of " +
            seconds(options.timeout) + " (" + compat::describe(e) + ")" +
            peers,
        "A peer rank probably failed while connecting: check the other "
        "ranks' logs; on hosts with several network interfaces set "
        "GLOO_SOCKET_IFNAME to the one the ranks share");
  }

  auto communicator =
      std::make_unique<GlooCommunicator>(options, store, std::move(group));
  Call check{"the connection check after the rendezvous", ""};
  communicator->barrier(check);
  return communicator;
}

} // namespace dloss
