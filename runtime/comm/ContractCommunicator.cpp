// The communicator contract above every engine: argument checks, numbering,
// flight record, failure diagnosis.
#include "runtime/comm/ContractCommunicator.h"

#include "runtime/support/Format.h"

#include <algorithm>
#include <numeric>

namespace dloss::comm {

ContractCommunicator::ContractCommunicator(RendezvousOptions options,
                                           std::unique_ptr<PeerStates> peers,
                                           const EngineWording &wording)
    : options(std::move(options)), peers(std::move(peers)), wording(wording) {}

// Out of line: PeerStates' destructor (rank 0 keeping the store up after a
// failure) runs after the engine's teardown.
ContractCommunicator::~ContractCommunicator() = default;

//===----------------------------------------------------------------------===//
// The contract: check, number, record, then the engine's transfer
//===----------------------------------------------------------------------===//

at::Tensor ContractCommunicator::allGather(const at::Tensor &input,
                                           int64_t axis,
                                           const std::vector<int64_t> &sizes) {
  Call call{"allGather", "dloss.all_gather"};
  checkTensor(call, input);
  int64_t dim = checkGather(call, input, axis, sizes);
  bool ride = dim == 0 && !deferred.empty();
  for (const Deferred &pending : deferred)
    ride = ride && pending.input.device() == input.device();
  if (!ride) {
    begin(call, &input);
    return transferAllGather(call, input, dim, sizes);
  }
  // The deferred reductions ride along: rank q sends its rows' bytes, then
  // its deferred inputs' bytes (the same count on every rank).
  const int n = worldSize();
  int64_t rowLength = 1;
  for (int64_t d = 1; d < input.dim(); ++d)
    rowLength *= input.size(d);
  const int64_t rowBytes = rowLength * input.element_size();
  at::Tensor tail = deferredBytes(input.device());
  const int64_t extra = tail.numel();
  std::vector<int64_t> bytes(n);
  for (int q = 0; q < n; ++q)
    bytes[q] = sizes[q] * rowBytes + extra;
  at::Tensor mine =
      at::cat({input.contiguous().view({-1}).view(at::kByte), tail});
  call.irOp = "dloss.all_gather + deferred dloss.all_reduce";
  begin(call, &mine);
  at::Tensor packed = transferAllGather(call, mine, 0, bytes);
  std::vector<int64_t> shape = input.sizes().vec();
  int64_t rows = 0;
  for (int64_t size : sizes)
    rows += size;
  shape[0] = rows;
  at::Tensor out = at::empty(shape, input.options());
  at::Tensor outBytes = out.view({-1}).view(at::kByte);
  std::vector<at::Tensor> tails;
  int64_t from = 0, to = 0;
  for (int q = 0; q < n; ++q) {
    const int64_t count = sizes[q] * rowBytes;
    outBytes.narrow(0, to, count).copy_(packed.narrow(0, from, count));
    tails.push_back(packed.narrow(0, from + count, extra));
    from += bytes[q];
    to += count;
  }
  completeDeferred(tails);
  return out;
}

void ContractCommunicator::deferReduction(
    const at::Tensor &input, Reduction op,
    std::function<void(at::Tensor)> done) {
  Call call{"allReduce", "dloss.all_reduce"};
  checkTensor(call, input);
  checkReducible(call, input, op);
  // Only what every rank holds alike by construction rides: a 0-d floating
  // value (a different dtype on one rank is caught by the preflight).
  if (worldSize() == 1 || input.dim() != 0 ||
      !at::isFloatingType(input.scalar_type())) {
    done(allReduce(input, op));
    return;
  }
  deferred.push_back({input.clone(), op, std::move(done)});
}

void ContractCommunicator::flushReductions() {
  if (deferred.empty())
    return;
  Call call{"allReduce", "dloss.all_reduce (deferred)"};
  at::Tensor tail = deferredBytes(deferred.front().input.device());
  begin(call, &tail);
  const int n = worldSize();
  at::Tensor packed =
      transferAllGather(call, tail, 0, std::vector<int64_t>(n, tail.numel()));
  std::vector<at::Tensor> tails;
  for (int q = 0; q < n; ++q)
    tails.push_back(packed.narrow(0, q * tail.numel(), tail.numel()));
  completeDeferred(tails);
}

void ContractCommunicator::dropReductions() { deferred.clear(); }

at::Tensor
ContractCommunicator::deferredBytes(const c10::Device &device) const {
  std::vector<at::Tensor> parts;
  for (const Deferred &pending : deferred)
    parts.push_back(pending.input.to(device).view({-1}).view(at::kByte));
  return at::cat(parts);
}

void ContractCommunicator::completeDeferred(
    const std::vector<at::Tensor> &tails) {
  std::vector<Deferred> pending = std::move(deferred);
  deferred.clear();
  int64_t offset = 0;
  for (Deferred &entry : pending) {
    const int64_t size = entry.input.nbytes();
    at::Tensor result;
    for (const at::Tensor &tail : tails) {
      at::Tensor value = tail.narrow(0, offset, size)
                             .clone()
                             .view(entry.input.scalar_type())
                             .view(at::IntArrayRef());
      if (!result.defined())
        result = value;
      else if (entry.op == Reduction::Max)
        result = at::maximum(result, value);
      else if (entry.op == Reduction::Min)
        result = at::minimum(result, value);
      else
        result = result + value;
    }
    if (entry.op == Reduction::Mean)
      result = result / static_cast<double>(tails.size());
    offset += size;
    entry.done(result);
  }
}

at::Tensor ContractCommunicator::nothingToMove(Call &call,
                                               const at::Tensor &input) {
  // Every rank holds the same (empty) shape, so every rank skips alike.
  return runAndComplete(
      call, [&] { return input.clone(at::MemoryFormat::Contiguous); });
}

at::Tensor ContractCommunicator::allReduce(const at::Tensor &input,
                                           Reduction op) {
  Call call{"allReduce", "dloss.all_reduce"};
  checkTensor(call, input);
  checkReducible(call, input, op);
  // The deferred reductions ride along where they reduce alike: their
  // values after this rank's elements, one transfer. Every rank decides
  // alike: the same deferred reductions, inputs of the same dtype.
  bool ride = !deferred.empty() && input.numel() > 0;
  for (const Deferred &pending : deferred)
    ride = ride && pending.op == op &&
           pending.input.scalar_type() == input.scalar_type() &&
           pending.input.device() == input.device();
  if (!ride) {
    begin(call, &input);
    if (input.numel() == 0)
      return nothingToMove(call, input);
    return transferAllReduce(call, input, op);
  }
  std::vector<at::Tensor> parts{input.reshape({-1})};
  for (const Deferred &pending : deferred)
    parts.push_back(pending.input.reshape({-1}));
  at::Tensor mine = at::cat(parts);
  call.irOp = "dloss.all_reduce + deferred dloss.all_reduce";
  begin(call, &mine);
  at::Tensor reduced = transferAllReduce(call, mine, op);
  std::vector<Deferred> pending = std::move(deferred);
  deferred.clear();
  for (size_t k = 0; k < pending.size(); ++k)
    pending[k].done(reduced.narrow(0, input.numel() + k, 1)
                        .clone()
                        .view(at::IntArrayRef()));
  return reduced.narrow(0, 0, input.numel()).view(input.sizes());
}

at::Tensor
ContractCommunicator::reduceScatter(const at::Tensor &input, Reduction op,
                                    int64_t axis,
                                    const std::vector<int64_t> &sizes) {
  Call call{"reduceScatter", "dloss.reduce_scatter"};
  checkTensor(call, input);
  checkReducible(call, input, op);
  int64_t dim = checkScatter(call, input, axis, sizes);
  begin(call, &input);
  return transferReduceScatter(call, input, op, dim, sizes);
}

at::Tensor ContractCommunicator::broadcast(const at::Tensor &input, int root) {
  Call call{"broadcast", "dloss.broadcast"};
  checkTensor(call, input);
  checkRoot(call, root);
  begin(call, &input);
  if (input.numel() == 0)
    return nothingToMove(call, input);
  return transferBroadcast(call, input, root);
}

at::Tensor ContractCommunicator::ringShift(const at::Tensor &input,
                                           int64_t shift) {
  Call call{"ringShift", "dloss.ring_shift"};
  checkTensor(call, input);
  checkShiftDims(call, input);
  ShiftPeers ring = shiftPeers(shift);
  begin(call, &input);
  return transferRingShift(call, input, ring);
}

std::vector<int64_t>
ContractCommunicator::allGatherInts(const std::vector<int64_t> &values) {
  return allGatherIntsFolding(values, {}, -1).values;
}

Communicator::FoldedInts ContractCommunicator::allGatherIntsFolding(
    const std::vector<int64_t> &values, const std::vector<at::Tensor> &payload,
    int64_t proposal) {
  Call call{"allGatherInts", ""};
  int64_t length = static_cast<int64_t>(values.size());
  begin(call, nullptr, length);
  // Ranks in different calls (one in a loss's preflight, another in
  // dloss.all_gather's shape exchange) would send messages of different
  // lengths, which Gloo's transport answers by aborting the process. So
  // every rank first sends one frame of the same size whatever its call:
  // its length, its payload's byte count and its proposal, then its values
  // when they fit (the preflight's do), then the payload's room. Such ranks
  // then fail with an error instead, and an exchange whose values fit every
  // rank's frame is over in one round trip; longer ones follow in a second
  // transfer, once every rank knows every length. The room is the same on
  // every rank: it changes only here, from what every rank received.
  const int n = options.worldSize;
  const int64_t room = capacity / 8, words = kIntsFrame + room;
  int64_t payloadBytes = 0;
  for (const at::Tensor &part : payload)
    payloadBytes += part.numel() * part.element_size();
  const bool fits = length <= kIntsFrame - kIntsFrameHeader;
  const bool folds = !payload.empty() && payloadBytes <= room * 8;
  // The header and values zeroed, then the payload written in place, the
  // rest of the room zeroed: no byte of this process's memory goes out
  // unwritten.
  at::Tensor frame = at::empty({words}, at::kLong);
  int64_t *head = frame.data_ptr<int64_t>();
  std::fill(head, head + kIntsFrame, int64_t{0});
  head[0] = length;
  head[1] = folds ? payloadBytes : -1;
  head[2] = proposal;
  if (fits)
    std::copy(values.begin(), values.end(), head + kIntsFrameHeader);
  at::Tensor roomBytes = frame.narrow(0, kIntsFrame, room).view(at::kByte);
  const int64_t written = folds ? payloadBytes : 0;
  if (folds)
    writeDense(payload, roomBytes);
  roomBytes.narrow(0, written, room * 8 - written).zero_();
  Call first = call;
  first.transfer = "the frame of lengths and values";
  at::Tensor frames = transferAllGatherInts(first, frame);
  const int64_t *all = frames.data_ptr<int64_t>();
  auto at = [&](int r, int64_t k) { return all[r * words + k]; };
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r)
    counts[r] = at(r, 0);
  if (std::any_of(counts.begin(), counts.end(),
                  [&](int64_t n) { return n != length; })) {
    std::string list;
    for (size_t r = 0; r < counts.size(); ++r)
      list += (r ? ", rank " : "rank ") + std::to_string(r) + ": " +
              std::to_string(counts[r]);
    std::string problem = call.describe() + " " + where() +
                          " found the ranks in different calls: they "
                          "exchange different numbers of values (" +
                          list + ")";
    broken = problem;
    flight.finish(call.flight, FlightEntry::State::Failed, problem);
    throw fail(call, problem,
               "Make every rank make the same dloss calls in the same "
               "order: one rank is in another loss, collective or check "
               "than its peers (an earlier call skipped or added on some "
               "ranks, or a call under a rank-dependent condition)");
  }
  FoldedInts out;
  bool allFit = true;
  for (int r = 0; r < n; ++r)
    allFit = allFit && at(r, 1) >= 0 && at(r, 1) <= room * 8;
  if (allFit)
    for (int r = 0; r < n; ++r)
      out.payloads.push_back(frames.narrow(0, r * words + kIntsFrame, room)
                                 .view(at::kByte)
                                 .narrow(0, 0, at(r, 1)));
  // The next frames' room: the largest proposal, in whole int64 words,
  // none above the limit; a rank that proposes nothing keeps it.
  bool proposed = true;
  int64_t largest = 0;
  for (int r = 0; r < n; ++r) {
    proposed = proposed && at(r, 2) >= 0;
    largest = std::max(largest, at(r, 2));
  }
  if (proposed)
    capacity = largest > kFoldLimit ? 0 : (largest + 7) / 8 * 8;
  if (!fits) {
    at::Tensor mine = at::empty({length}, at::kLong);
    std::copy(values.begin(), values.end(), mine.data_ptr<int64_t>());
    at::Tensor gathered = transferAllGatherInts(call, mine);
    out.values.assign(gathered.data_ptr<int64_t>(),
                      gathered.data_ptr<int64_t>() + gathered.numel());
    return out;
  }
  out.values.reserve(static_cast<size_t>(length) * n);
  for (int r = 0; r < n; ++r) {
    const int64_t *start = all + r * words + kIntsFrameHeader;
    out.values.insert(out.values.end(), start, start + length);
  }
  complete(call);
  return out;
}

std::unique_ptr<Communicator::Request>
ContractCommunicator::send(const at::Tensor &tensor, int peer, int tag) {
  Call call = transferCall("send to rank " + std::to_string(peer) + " (tag " +
                           std::to_string(tag) + ")");
  checkTensor(call, tensor);
  checkPeer(call, peer, tag);
  return transferSend(call, tensor, peer, tag);
}

std::unique_ptr<Communicator::Request>
ContractCommunicator::recv(at::Tensor &tensor, int peer, int tag) {
  Call call = transferCall("recv from rank " + std::to_string(peer) + " (tag " +
                           std::to_string(tag) + ")");
  checkTensor(call, tensor);
  checkPeer(call, peer, tag);
  return transferRecv(call, tensor, peer, tag);
}

void ContractCommunicator::beginExchange(const std::string &name) {
  Call call{name, ""};
  begin(call, nullptr);
  exchange = call;
}

void ContractCommunicator::endExchange() {
  if (!exchange)
    return;
  // A failed exchange stays failed in the flight record.
  if (broken.empty())
    complete(*exchange);
  exchange.reset();
}

Call ContractCommunicator::transferCall(std::string transfer) const {
  if (!exchange)
    return Call{std::move(transfer), ""};
  Call call = *exchange;
  call.transfer = std::move(transfer);
  return call;
}

//===----------------------------------------------------------------------===//
// Numbering, flight record, failures
//===----------------------------------------------------------------------===//

Error ContractCommunicator::fail(const Call &call, std::string problem,
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

std::string ContractCommunicator::where() const {
  return "on rank " + std::to_string(options.rank) + " of " +
         std::to_string(options.worldSize);
}

void ContractCommunicator::begin(Call &call, const at::Tensor *tensor,
                                 int64_t values) {
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
    entry.shape = shapeText(tensor->sizes());
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
  if (broken.empty() && peers)
    peers->publish(call.seq, "started", call.name, call.site, call.startUnixMs,
                   "");
}

void ContractCommunicator::complete(Call &call) {
  // A transfer of an exchange completes with the exchange (endExchange).
  if (!call.transfer.empty())
    return;
  flight.finish(call.flight, FlightEntry::State::Completed);
}

void ContractCommunicator::refuseIfBroken(Call &call) {
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

void ContractCommunicator::breakOn(const Call &call, const Error &error) {
  broken = call.name + ": " + error.problem();
  flight.finish(call.flight, FlightEntry::State::Failed, error.problem());
}

void ContractCommunicator::noteFailure(const std::string &message) {
  // A failed collective has recorded its own, more precise state.
  if (!broken.empty() || !peers)
    return;
  peers->publish(started, "failed", "", CallSite{}, unixMillis(), message);
}

void ContractCommunicator::recordExit(const std::string &reason, bool raised) {
  if (peers)
    peers->recordExit(started, reason, raised, !broken.empty());
}

void ContractCommunicator::keepStoreForPeers() {
  if (peers)
    peers->keepStoreForPeers(started);
}

std::vector<Communicator::PeerExit> ContractCommunicator::peerExits() {
  return peers ? peers->exits() : std::vector<PeerExit>{};
}

std::string ContractCommunicator::rootCause() {
  return peers ? peers->rootCause(nullptr, peers->current(), false).text : "";
}

bool ContractCommunicator::recordsMirrored() {
  return peers && peers->mirrorUpToDate();
}

std::string ContractCommunicator::abandonReason(const Call &call) {
  return peers && call.seq >= 0 ? peers->doomed(call) : "";
}

Error ContractCommunicator::diagnose(Call &call, const std::string &detail,
                                     bool timedOut) {
  broken = call.describe() + " failed: " + detail;
  flight.finish(call.flight, FlightEntry::State::Failed, detail);
  std::string timeoutHint =
      std::string("Some rank did not reach this collective in time: check the "
                  "ranks named above (and the other ranks' logs) for an "
                  "earlier error or a hang, make sure every rank makes the "
                  "same collective calls in the same order") +
      wording.sameOrderDetail +
      " (DLOSS_GUARD=30 checks every collective on the group, the user's and "
      "DDP's too, and names the one some ranks skip), or raise "
      "DLOSS_TIMEOUT_S if the ranks are only slow";
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

  std::string storeProblem;
  std::vector<PeerState> peerStates;
  std::string summary;
  RootCause cause;
  if (peers) {
    peerStates = peers->failed(
        call, timedOut ? "timed out after " + seconds(options.timeout) : detail,
        timedOut ? std::chrono::milliseconds(0) : PeerStates::kReportGrace,
        storeProblem);
    if (storeProblem.empty())
      cause = peers->rootCause(&call, peerStates, timedOut);
    summary =
        storeProblem.empty()
            ? peers->summarize(call, peerStates, timedOut,
                               cause.silent ? std::vector<int>{} : cause.ranks)
            : "the peers' states are unknown: " + storeProblem;
  }

  // The root cause leads: it is the same on every rank, while the rest
  // (this rank's collective, the others' states) is the cascade.
  std::string problem = cause.ranks.empty()
                            ? ""
                            : cause.text +
                                  " (the first rank that left or failed); "
                                  "because of it, ";
  problem += timedOut
                 ? call.describe() + " timed out " + where() +
                       " after the deadline of " + seconds(options.timeout)
                 : call.describe() + " failed " + where() + " (" + detail + ")";
  if (!summary.empty())
    problem += ": " + summary;
  if (peers && !peers->lostStoreClause().empty())
    problem += "; " + peers->lostStoreClause();
  if (timedOut)
    problem += " (" + detail + ")";
  problem += wording.failureSuffix;
  std::string hint = !cause.hint.empty() ? cause.hint
                     : timedOut          ? timeoutHint
                                         : wording.peerHint;

  // The record holds the whole message, and the message the record's path.
  std::string record;
  if (options.flightDir != "off") {
    FlightRecorder::Header header;
    header.rank = options.rank;
    header.worldSize = options.worldSize;
    header.timeoutSeconds = options.timeout.count() / 1000.0;
    header.reason = fail(call, problem, hint).what();
    for (const PeerState &peer : peerStates)
      header.peers.push_back(PeerStates::describe(peer));
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

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

void ContractCommunicator::checkTensor(const Call &call,
                                       const at::Tensor &tensor) const {
  if (!tensor.defined())
    throw fail(call, call.name + " got an undefined tensor " + where(),
               "Pass a tensor");
  checkDevice(call, tensor);
}

void ContractCommunicator::checkReducible(const Call &call,
                                          const at::Tensor &tensor,
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

int64_t ContractCommunicator::checkAxis(const Call &call,
                                        const at::Tensor &tensor,
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

void ContractCommunicator::checkSizes(const Call &call,
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

int64_t
ContractCommunicator::checkGather(const Call &call, const at::Tensor &input,
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

int64_t
ContractCommunicator::checkScatter(const Call &call, const at::Tensor &input,
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

void ContractCommunicator::checkRoot(const Call &call, int root) const {
  if (root < 0 || root >= options.worldSize)
    throw fail(call,
               "broadcast root " + std::to_string(root) + " is not a rank " +
                   where(),
               "Pass a root in [0, world size)");
}

void ContractCommunicator::checkShiftDims(const Call &call,
                                          const at::Tensor &input) const {
  if (input.dim() > kMaxDims)
    throw fail(call,
               "ringShift of a " + std::to_string(input.dim()) + "-d tensor " +
                   where() + " exceeds the limit of " +
                   std::to_string(kMaxDims) + " dimensions",
               "Reshape the tensor to fewer dimensions before the shift");
}

ContractCommunicator::ShiftPeers
ContractCommunicator::shiftPeers(int64_t shift) const {
  int64_t n = options.worldSize;
  int64_t step = ((shift % n) + n) % n;
  return {step, static_cast<int>((options.rank + step) % n),
          static_cast<int>((options.rank - step + n) % n)};
}

void ContractCommunicator::checkPeer(const Call &call, int peer,
                                     int tag) const {
  if (options.worldSize == 1)
    throw fail(call,
               call.name + " names peer rank " + std::to_string(peer) + " " +
                   where() +
                   ", but a single-process run (world size 1) has no other "
                   "rank",
               "Point-to-point transfers need at least 2 ranks; use "
               "ringShift, which is the identity in a world of 1");
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
               "engines' own transfers (ringShift, reduceScatter)");
}

void ContractCommunicator::writeShiftHeader(const at::Tensor &data,
                                            int64_t *header) {
  std::fill(header, header + kHeaderLength, int64_t{0});
  header[0] = data.dim();
  header[1] = static_cast<int64_t>(data.scalar_type());
  for (int64_t d = 0; d < data.dim(); ++d)
    header[2 + d] = data.size(d);
}

at::Tensor ContractCommunicator::fromShiftHeader(const Call &call,
                                                 const int64_t *header, int src,
                                                 const at::Tensor &data) const {
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

} // namespace dloss::comm

namespace dloss {

void writeDense(const std::vector<at::Tensor> &parts, const at::Tensor &bytes) {
  int64_t offset = 0;
  for (const at::Tensor &part : parts) {
    const int64_t size = part.numel() * part.element_size();
    at::Tensor into = bytes.narrow(0, offset, size);
    // Written in place where the offset suits the element type; otherwise
    // (a float32 part of odd length before an int64 one) through a dense
    // copy's bytes. copy_ also expands a broadcast part (stride 0), which no
    // byte view of it could.
    if (into.storage_offset() % part.element_size() == 0) {
      into.view(part.scalar_type()).view(part.sizes()).copy_(part);
    } else {
      at::Tensor dense = at::empty(part.sizes(), part.options());
      dense.copy_(part);
      into.copy_(dense.view({-1}).view(at::kByte));
    }
    offset += size;
  }
}

} // namespace dloss
