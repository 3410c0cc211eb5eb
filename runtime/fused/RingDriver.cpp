// The ring driver of the fused ops: posts each step's transfers, runs the
// visit, merges and forwards the carries.
#include "runtime/fused/RingDriver.h"

#include "runtime/comm/CallSite.h"
#include "runtime/fused/Schedule.h"

namespace dloss::fused {

namespace {

// Point-to-point tags of the fused ops: 16 per step, carries in slots 0-7,
// features in 8-15. Far below the tags the communicator keeps for its own
// collectives (comm::kReservedTagBase, 2^30, ContractCommunicator.h), and
// distinct per step, so a late message can never match the wrong buffer.
// Between two ranks, the order in which the sender posts (features of step
// k, then the carry for step k+1, then the features of step k+1) is the
// order in which the receiver posts and the order of the tags: engines that
// match by order rather than by tag (NCCL) pair them the same way.
constexpr int kRingTagBase = 1000;
constexpr int kTagsPerStep = 16;
constexpr int kCarrySlot = 0;
constexpr int kFeatureSlot = 8;

int ringTag(int step, int slot) {
  return kRingTagBase + kTagsPerStep * step + slot;
}

/// Outstanding transfers, completed together.
class Pending {
public:
  void add(std::unique_ptr<Communicator::Request> request) {
    requests.push_back(std::move(request));
  }
  void wait() {
    for (auto &request : requests)
      request->wait();
    requests.clear();
  }

private:
  std::vector<std::unique_ptr<Communicator::Request>> requests;
};

void postRecvs(Communicator &comm, Tensors &buffers, int peer, int tag,
               Pending &pending) {
  for (size_t i = 0; i < buffers.size(); ++i)
    pending.add(comm.recv(buffers[i], peer, tag + static_cast<int>(i)));
}

void postSends(Communicator &comm, const Tensors &tensors, int peer, int tag,
               Pending &pending) {
  for (size_t i = 0; i < tensors.size(); ++i)
    pending.add(comm.send(tensors[i], peer, tag + static_cast<int>(i)));
}

/// Uninitialised tensors shaped like `like` but with `length` along axis 0.
Tensors emptyLike(const Tensors &like, int64_t length) {
  Tensors out;
  for (const at::Tensor &tensor : like) {
    std::vector<int64_t> shape = tensor.sizes().vec();
    shape[0] = length;
    out.push_back(at::empty(shape, tensor.options()));
  }
  return out;
}

/// Buffers of one kind (feature chunks, carries) that a pass is done with,
/// kept for its next step that needs one of the same length. A take that
/// finds none frees the spares before it allocates, so spares never add to
/// the memory a pass holds at once.
class Spares {
public:
  explicit Spares(std::function<Tensors(int64_t)> make)
      : make(std::move(make)) {}
  Tensors take(int64_t length) {
    for (auto it = spares.begin(); it != spares.end(); ++it)
      if (it->first == length) {
        Tensors buffers = std::move(it->second);
        spares.erase(it);
        return buffers;
      }
    spares.clear();
    return make(length);
  }
  void give(int64_t length, Tensors buffers) {
    spares.emplace_back(length, std::move(buffers));
  }

private:
  std::function<Tensors(int64_t)> make;
  std::vector<std::pair<int64_t, Tensors>> spares;
};

/// The op whose pass this is ("ring_softmax_ce"), for the exchange's name.
std::string passName() {
  const CallSite *site = currentCallSite();
  std::string op = site && !site->op.empty() ? site->op : "ring";
  return op.substr(op.find('.') + 1);
}

/// Every rank's chunk, in rank order, from gatherOperands: one all-gather
/// for the features no earlier pass of this call gathered (keys).
std::vector<Tensors> gatherChunks(Communicator &comm, const Tensors &features,
                                  const std::vector<int64_t> &keys,
                                  const std::vector<int64_t> &lengths) {
  const int n = static_cast<int>(lengths.size());
  Tensors gathered = gatherOperands(
      comm, features,
      std::vector<std::vector<int64_t>>(features.size(), lengths), keys);
  std::vector<Tensors> chunks(n);
  for (int q = 0; q < n; ++q)
    for (const at::Tensor &tensor : gathered)
      chunks[q].push_back(tensor.narrow(0, offsetOf(lengths, q), lengths[q]));
  return chunks;
}

/// The gather schedule (Schedule.h): every chunk at once, then each chunk's
/// carry straight to its owner. The chunks are visited, and the carries
/// merged, in the ring's order, so the two schedules compute the same
/// floating-point sums.
Tensors runGather(Communicator &comm, const RingPass &pass) {
  const int n = comm.worldSize(), r = comm.rank();
  std::vector<Tensors> chunks =
      gatherChunks(comm, pass.features, pass.keys, pass.lengths);
  const bool carries = static_cast<bool>(pass.newCarry);
  // Each chunk's part of its carry, by chunk.
  std::vector<Tensors> parts(n);
  for (int k = 0; k < n; ++k) {
    const int q = (r - k + n) % n;
    Tensors part = carries ? pass.newCarry(pass.lengths[q]) : Tensors{};
    pass.visit(Chunk{offsetOf(pass.lengths, q), chunks[q]}, part);
    parts[q] = std::move(part);
  }
  chunks.clear();
  if (!carries || n == 1)
    return carries ? parts[r] : Tensors{};
  // One exchange: every rank's part of chunk q goes to q.
  std::vector<Tensors> received(n);
  {
    ExchangeScope exchange(comm, passName() + " (gather)");
    Pending pending;
    for (int k = 1; k < n; ++k) {
      const int from = (r - k + n) % n;
      received[from] = pass.newCarry(pass.lengths[r]);
      postRecvs(comm, received[from], from, ringTag(0, kCarrySlot), pending);
    }
    for (int k = 1; k < n; ++k) {
      const int to = (r + k) % n;
      postSends(comm, parts[to], to, ringTag(0, kCarrySlot), pending);
    }
    pending.wait();
  }
  // The ring's order: the part of rank r first, then r+1's merged over it,
  // up to r-1's.
  Tensors sum = std::move(parts[r]);
  for (int k = 1; k < n; ++k) {
    Tensors &mine = received[(r + k) % n];
    pass.merge(mine, sum);
    sum = std::move(mine);
  }
  return sum;
}

/// The ring schedule (RingDriver.h).
Tensors runRingSchedule(Communicator &comm, const RingPass &pass) {
  const int n = comm.worldSize(), r = comm.rank();
  // The ring's transfers are one collective for errors and the flight
  // record, named after the op ("ring_softmax_ce").
  ExchangeScope exchange(comm, passName());
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const bool carries = static_cast<bool>(pass.newCarry);
  Spares chunkBuffers(
      [&](int64_t length) { return emptyLike(pass.features, length); });
  Spares carryBuffers(pass.newCarry);
  Tensors held = pass.features, carry;
  int64_t carryLength = 0; // the length of the carry in flight to r+1
  Pending carrySent;
  for (int k = 0; k < n; ++k) {
    const int q = (r - k + n) % n;
    // The carry r-1 sent at the end of step k-1 first, then the features.
    Tensors upstream;
    Pending carryIn;
    if (carries && k > 0) {
      upstream = carryBuffers.take(pass.lengths[q]);
      postRecvs(comm, upstream, prev, ringTag(k, kCarrySlot), carryIn);
    }
    Pending transfers;
    Tensors incoming;
    if (k + 1 < n) {
      incoming = chunkBuffers.take(pass.lengths[(q + n - 1) % n]);
      postRecvs(comm, incoming, prev, ringTag(k, kFeatureSlot), transfers);
      postSends(comm, held, next, ringTag(k, kFeatureSlot), transfers);
    }
    Tensors mine = carries ? carryBuffers.take(pass.lengths[q]) : Tensors{};
    pass.visit(Chunk{offsetOf(pass.lengths, q), held}, mine);
    if (carries) {
      carryIn.wait();
      if (k > 0) {
        pass.merge(mine, upstream);
        carryBuffers.give(pass.lengths[q], std::move(upstream));
      }
      // r+1 posted its recv for the previous send at the start of step k.
      carrySent.wait();
      if (k > 0)
        carryBuffers.give(carryLength, std::move(carry));
      if (n > 1)
        postSends(comm, mine, next, ringTag(k + 1, kCarrySlot), carrySent);
    }
    carry = std::move(mine);
    carryLength = pass.lengths[q];
    transfers.wait();
    if (k + 1 < n) {
      // The chunk just sent is free for the next step's, if it receives
      // one; the caller's own features are not ours to overwrite.
      if (k > 0 && k + 2 < n)
        chunkBuffers.give(pass.lengths[q], std::move(held));
      held = std::move(incoming);
    }
  }
  if (!carries || n == 1)
    return carry;
  Tensors home = carryBuffers.take(pass.lengths[r]);
  Pending homeIn;
  postRecvs(comm, home, prev, ringTag(n, kCarrySlot), homeIn);
  carrySent.wait();
  homeIn.wait();
  return home;
}

} // namespace

int64_t rowBytes(const at::Tensor &tensor) {
  int64_t elements = 1;
  for (int64_t d = 1; d < tensor.dim(); ++d)
    elements *= tensor.size(d);
  return elements * static_cast<int64_t>(tensor.element_size());
}

at::Tensor packRows(const Tensors &features) {
  if (features.empty())
    return at::empty({0}, at::kByte);
  int64_t bytes = 0;
  for (const at::Tensor &tensor : features)
    bytes += tensor.numel() * tensor.element_size();
  at::Tensor packed =
      at::empty({bytes}, features.front().options().dtype(at::kByte));
  writeDense(features, packed);
  return packed;
}

Tensors unpackRows(const std::vector<at::Tensor> &packed, const Tensors &like,
                   const std::vector<std::vector<int64_t>> &lengths) {
  const int n = static_cast<int>(packed.size());
  Tensors out;
  for (size_t k = 0; k < like.size(); ++k) {
    const std::vector<int64_t> &sizes = lengths[k];
    const int64_t width = rowBytes(like[k]);
    std::vector<int64_t> shape = like[k].sizes().vec();
    shape[0] = offsetOf(sizes, n);
    at::Tensor gathered = at::empty(shape, like[k].options());
    at::Tensor bytes = gathered.view({-1}).view(at::kByte);
    for (int q = 0; q < n; ++q) {
      // Feature k's bytes from rank q start after q's earlier features.
      int64_t before = 0;
      for (size_t e = 0; e < k; ++e)
        before += lengths[e][q] * rowBytes(like[e]);
      const int64_t count = sizes[q] * width;
      bytes.narrow(0, offsetOf(sizes, q) * width, count)
          .copy_(packed[q].narrow(0, before, count));
    }
    out.push_back(gathered);
  }
  return out;
}

Tensors gatherOperands(Communicator &comm, const Tensors &features,
                       const std::vector<std::vector<int64_t>> &lengths,
                       const std::vector<int64_t> &keys) {
  const int n = comm.worldSize();
  auto keyOf = [&](size_t i) { return i < keys.size() ? keys[i] : -1; };
  Tensors gathered(features.size());
  std::vector<size_t> missing;
  for (size_t i = 0; i < features.size(); ++i) {
    gathered[i] =
        gatheredOperand(keyOf(i), features[i], offsetOf(lengths[i], n));
    if (!gathered[i].defined())
      missing.push_back(i);
  }
  if (missing.size() == 1) {
    const size_t i = missing[0];
    gathered[i] = comm.allGather(features[i], 0, lengths[i]);
  } else if (!missing.empty()) {
    // Rank q sends the bytes of its rows of every missing feature, one after
    // another: a flat byte tensor whose length every rank can work out.
    Tensors mine;
    std::vector<std::vector<int64_t>> missingLengths;
    std::vector<int64_t> bytes(n, 0);
    for (size_t i : missing) {
      mine.push_back(features[i]);
      missingLengths.push_back(lengths[i]);
      for (int q = 0; q < n; ++q)
        bytes[q] += lengths[i][q] * rowBytes(features[i]);
    }
    at::Tensor packed = comm.allGather(packRows(mine), 0, bytes);
    std::vector<at::Tensor> perRank;
    for (int q = 0; q < n; ++q)
      perRank.push_back(packed.narrow(0, offsetOf(bytes, q), bytes[q]));
    Tensors out = unpackRows(perRank, mine, missingLengths);
    for (size_t k = 0; k < missing.size(); ++k)
      gathered[missing[k]] = out[k];
  }
  for (size_t i : missing)
    keepGathered(keyOf(i), gathered[i]);
  return gathered;
}

Schedule passSchedule(Communicator &comm, const Tensors &features,
                      const std::vector<std::vector<int64_t>> &lengths) {
  PassSize size;
  size.worldSize = comm.worldSize();
  for (size_t i = 0; i < features.size(); ++i)
    size.globalBytes +=
        rowBytes(features[i]) * offsetOf(lengths[i], size.worldSize);
  if (!features.empty())
    size.device = features[0].device().type();
  return chooseSchedule(currentSchedule(), size);
}

bool gathersBothSides(Communicator &comm, const at::Tensor &rows,
                      const at::Tensor &cols,
                      const std::vector<int64_t> &rowSizes,
                      const std::vector<int64_t> &colSizes, int tilesTwice,
                      int savedExchanges) {
  const int n = comm.worldSize();
  if (rows.is_cuda() || n == 1 ||
      passSchedule(comm, {rows, cols}, {rowSizes, colSizes}) !=
          Schedule::Gather)
    return false;
  // Per rank, on average: (R / N) x C products of d multiply-adds each.
  const double extraMacs = tilesTwice * static_cast<double>(total(rowSizes)) *
                           static_cast<double>(total(colSizes)) *
                           static_cast<double>(rows.size(1)) / n;
  if (currentSchedule() == Schedule::Auto &&
      !schedule::bothSidesPay(n, engineFor(rows.device().type()), extraMacs,
                              savedExchanges))
    return false;
  countPass(Schedule::Gather);
  return true;
}

Tensors runRing(Communicator &comm, const RingPass &pass) {
  Schedule schedule = passSchedule(
      comm, pass.features,
      std::vector<std::vector<int64_t>>(pass.features.size(), pass.lengths));
  countPass(schedule);
  return schedule == Schedule::Gather ? runGather(comm, pass)
                                      : runRingSchedule(comm, pass);
}

ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, int64_t shares, at::TensorOptions options,
    const std::function<at::Tensor(const Chunk &, at::Tensor &)> &tiles,
    std::vector<int64_t> keys) {
  RingPass pass;
  pass.features = std::move(features);
  pass.keys = std::move(keys);
  pass.lengths = std::move(lengths);
  pass.newCarry = [&](int64_t length) {
    return Tensors{at::empty({length, width}, options),
                   at::empty({shares}, options.dtype(at::kDouble))};
  };
  pass.visit = [&](const Chunk &chunk, Tensors &carry) {
    carry[0].zero_();
    carry[1].copy_(tiles(chunk, carry[0]));
  };
  pass.merge = [](Tensors &mine, const Tensors &upstream) {
    mine[0].add_(upstream[0]);
    mine[1].add_(upstream[1]);
  };
  Tensors home = runRing(comm, pass);
  return {home[0], home[1]};
}

ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, at::TensorOptions options,
    const std::function<void(const Chunk &, at::Tensor &, double &)> &tiles,
    std::vector<int64_t> keys) {
  return runGradientRing(
      comm, std::move(features), std::move(lengths), width, 1, options,
      [&](const Chunk &chunk, at::Tensor &dCols) {
        double share = 0;
        tiles(chunk, dCols, share);
        return at::full({1}, share, options.dtype(at::kDouble));
      },
      std::move(keys));
}

} // namespace dloss::fused
