// CPU ring-tiled kernels of the fused ops: all_gather + matmul + loss without
// ever building the B_local x B_global similarity matrix.
//
// Ring schedule (ring_softmax_ce, ring_sigmoid_pairs and their _grad ops).
// Rank r keeps its rows; the column chunks travel round the ring. At step
// k = 0..N-1 it holds the chunk owned by q = (r - k) mod N.
//   * Features (the chunk's cols, targets and, for the backward, its lse and
//     cotangents) never change. At the start of step k the rank posts the
//     recv of the next chunk from r-1 and the send of the held one to r+1,
//     computes the held chunk's tiles meanwhile, and waits at the end of the
//     step: two chunk buffers, the transfer hidden behind the tiles.
//   * A carry (the forward's column statistics, the backward's column
//     gradient) accumulates as the chunk travels. The rank computes its own
//     contribution, merges the carry r-1 sent after processing the same chunk
//     at step k-1, and passes the sum to r+1. After step N-1 the held chunk
//     belongs to r+1 and its carry is complete: one more hop takes it home,
//     and r receives its own from r-1.
//   * Row state (online log-sum-exp, row gradients) never moves.
// Every wait on a rank at step k depends only on peers' progress at earlier
// steps or at the start of step k (a carry send is waited on one step after
// it is posted), so the waits form no cycle. With N == 1 nothing is sent.
//
// Tiles. A chunk is processed in blocks of Br rows x Bc columns: one
// at::mm_out into a preallocated tile sized to half the L2 cache, then the
// element-wise math in place on it. Extra memory is O((n_r + 2 m_max) d +
// Br Bc): the two chunk buffers, the carries and a few tiles, never n_r x M.
//
// dloss.sharded_softmax (PartialFC) needs no ring: each rank reduces its class
// shard in tiles, and two all-reduces (the maxima, then [sums; target dots])
// combine the shards; its backward needs no communication.
//
// Compute type: f64 inputs in f64, every other float type in f32 (results
// are converted back). Targets of any integer type are read as int64.
//
// CUDA tensors (a runtime built with DLOSS_HAVE_CUDA) take the same ring
// driver with a device visit: runtime/cuda/FusedTiles.h's launchers run each
// tile (cuBLAS GEMMs on the bf16/fp16/f32 inputs as they are, fp32
// accumulation, fused epilogues; f64 is computed in f32 there), on LibTorch's
// current stream; the statistics, carries and results are ATen CUDA tensors.
#include "runtime/FusedKernels.h"

#include "runtime/Error.h"

#ifdef DLOSS_HAVE_CUDA
#include "runtime/cuda/FusedTiles.h"
#endif
#ifdef DLOSS_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>

namespace dloss {

namespace {

using Tensors = std::vector<at::Tensor>;

constexpr double kInf = std::numeric_limits<double>::infinity();

//===----------------------------------------------------------------------===//
// Tile shape
//===----------------------------------------------------------------------===//

int64_t l2CacheBytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes > 0)
    return bytes;
#endif
  // Some libcs (musl, containers without the auxv entries) report 0.
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index2/size");
  std::string text;
  if (file >> text) {
    char *end = nullptr;
    long long size = std::strtoll(text.c_str(), &end, 10);
    int64_t unit = *end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : 1;
    if (size > 0)
      return size * unit;
  }
  return 1 << 20;
}

TileShape parseTile(const std::string &text) {
  size_t x = text.find('x');
  auto positive = [](const std::string &part, int64_t &out) {
    if (part.empty() ||
        part.find_first_not_of("0123456789") != std::string::npos ||
        part.size() > 9)
      return false;
    out = std::stoll(part);
    return out > 0;
  };
  TileShape tile{0, 0};
  if (x == std::string::npos || !positive(text.substr(0, x), tile.rows) ||
      !positive(text.substr(x + 1), tile.cols))
    throw Error("environment variable DLOSS_TILE='" + text +
                    "' is malformed: expected ROWSxCOLS with positive sizes",
                "Set DLOSS_TILE=128x512 (rows x columns of a similarity "
                "tile), or unset it to size tiles from the L2 cache");
  return tile;
}

/// The tile for a `rows` x `cols` problem: never larger than the problem.
TileShape clippedTile(int64_t rows, int64_t cols, at::ScalarType type) {
  TileShape tile = fusedTileShape(c10::elementSize(type));
  return {std::min(tile.rows, std::max<int64_t>(rows, 1)),
          std::min(tile.cols, std::max<int64_t>(cols, 1))};
}

//===----------------------------------------------------------------------===//
// Operands
//===----------------------------------------------------------------------===//

std::string shapeText(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

int64_t total(const std::vector<int64_t> &sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

int64_t largest(const std::vector<int64_t> &sizes) {
  return *std::max_element(sizes.begin(), sizes.end());
}

int64_t offsetOf(const std::vector<int64_t> &sizes, int rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

/// The operands of one fused step, checked and converted to the compute type;
/// errors name the op, the rank and the operand.
class FusedArgs {
public:
  /// `colsName` names operand 1 (cols, or the class weights).
  FusedArgs(KernelContext &ctx, const char *op, const char *colsName = "cols")
      : ctx(ctx), op(op), colsName(colsName), rank(ctx.communicator().rank()) {
    const at::Tensor &rows = floats(0, "rows"), &cols = floats(1, colsName);
    bool isDouble =
        rows.scalar_type() == at::kDouble || cols.scalar_type() == at::kDouble;
    compute = isDouble ? at::kDouble : at::kFloat;
    matrixType = compute;
    onDevice = rows.is_cuda() || cols.is_cuda();
    if (!onDevice)
      return;
#ifndef DLOSS_HAVE_CUDA
    fail(std::string(rows.is_cuda() ? "rows" : colsName) +
             " is a CUDA tensor, but this dloss runtime was built without "
             "CUDA",
         "Rebuild dloss where nvcc and cuBLAS are found (/usr/local/cuda, "
         "-DDLOSS_ENABLE_CUDA=ON) against a CUDA LibTorch, or pass CPU "
         "tensors");
#endif
    // The GPU tiles take bf16, f16 and f32 as they are (one type for both
    // operands), accumulate in f32, and compute f64 in f32.
    device = rows.is_cuda() ? rows.device() : cols.device();
    compute = at::kFloat;
    at::ScalarType type = rows.scalar_type();
    matrixType = type == cols.scalar_type() &&
                         (type == at::kBFloat16 || type == at::kHalf)
                     ? type
                     : at::kFloat;
  }

  [[noreturn]] void fail(const std::string &problem,
                         const std::string &hint) const {
    throw Error(problem, hint).withRank(rank).withOp(op);
  }

  /// Operand `i`, a [size, width] float matrix; `width` -1 takes any.
  at::Tensor matrix(size_t i, const char *name, int64_t width = -1) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 2 || (width >= 0 && value.size(1) != width))
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected a matrix" +
               (width >= 0 ? " with " + std::to_string(width) + " columns"
                           : std::string()),
           "The plan does not match its inputs' shapes; recompile it");
    return converted(value, matrixType);
  }

  /// Operand `i`, a float vector of `length` elements.
  at::Tensor vector(size_t i, const char *name, int64_t length) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 1 || value.size(0) != length)
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected [" + std::to_string(length) + "]",
           "The plan does not match its inputs' shapes; recompile it");
    return converted(value, compute);
  }

  /// Operand `i`, a 0-d float.
  double scalar(size_t i, const char *name) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 0)
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected a 0-d tensor",
           "The plan does not match its inputs' shapes; recompile it");
    return value.item<double>();
  }

  /// Operand `i`, `length` integer targets, each in [0, bound) (`bound`
  /// global `what`), as int64. Checked before any transfer: every rank with a
  /// bad target raises here, and peers that have none fail at their deadline.
  at::Tensor targets(size_t i, const char *name, int64_t length, int64_t bound,
                     const char *what) const {
    const at::Tensor &value = ctx.tensor(i);
    if (!at::isIntegralType(value.scalar_type(), /*includeBool=*/false) ||
        value.dim() != 1 || value.size(0) != length)
      fail(std::string(name) + " is a " + c10::toString(value.scalar_type()) +
               " tensor of shape " + shapeText(value.sizes()) +
               ", expected integers of shape [" + std::to_string(length) + "]",
           "The plan does not match its inputs' shapes; recompile it");
    auto outOfRange = [&](int64_t k, int64_t target) {
      fail(std::string(name) + "[" + std::to_string(k) +
               "] = " + std::to_string(target) + " is out of range [0, " +
               std::to_string(bound) + "): there are " + std::to_string(bound) +
               " " + what + " on all ranks",
           "Targets are global indices into the gathered batch (or the "
           "classes of every shard); check the labels passed on this rank");
    };
    if (onDevice) {
      at::Tensor result = value.to(device, at::kLong).contiguous();
      at::Tensor bad = (result < 0).logical_or_(result >= bound);
      if (bad.any().item<bool>()) {
        int64_t k = bad.nonzero()[0][0].item<int64_t>();
        outOfRange(k, result[k].item<int64_t>());
      }
      return result;
    }
    at::Tensor result = value.to(at::kLong).contiguous();
    const int64_t *data = result.data_ptr<int64_t>();
    for (int64_t k = 0; k < length; ++k)
      if (data[k] < 0 || data[k] >= bound)
        outOfRange(k, data[k]);
    return result;
  }

  /// The element type of operand `i`, for its results.
  at::ScalarType type(size_t i) const { return ctx.tensor(i).scalar_type(); }

  at::TensorOptions options() const {
    return at::TensorOptions(compute).device(device);
  }

  KernelContext &ctx;
  const char *op;
  const char *colsName;
  int rank;
  at::ScalarType compute = at::kFloat;
  /// The type rows and cols are converted to: `compute`, except on the GPU.
  at::ScalarType matrixType = at::kFloat;
  /// Whether the operands are CUDA tensors (then every tensor the op makes
  /// lives on `device`).
  bool onDevice = false;
  at::Device device = at::kCPU;

private:
  const at::Tensor &floats(size_t i, const char *name) const {
    const at::Tensor &value = ctx.tensor(i);
    if (!at::isFloatingType(value.scalar_type()))
      fail(std::string(name) + " is a " + c10::toString(value.scalar_type()) +
               " tensor, expected floats",
           "The plan does not match its inputs' types; recompile it");
    return value;
  }

  at::Tensor converted(const at::Tensor &value, at::ScalarType type) const {
    if (onDevice)
      return value.to(device, type).contiguous();
    return value.to(type).contiguous();
  }
};

/// What every similarity kernel starts with: S = rows x cols^T, L = scale S.
struct Similarity {
  at::Tensor rows; ///< [n, d], this rank's (or the gathered) rows.
  at::Tensor cols; ///< [m, d], this rank's columns (or class weights).
  double scale = 1;
};

Similarity similarityOperands(const FusedArgs &args) {
  at::Tensor rows = args.matrix(0, "rows");
  return {rows, args.matrix(1, args.colsName, rows.size(1)),
          args.scalar(2, "scale")};
}

//===----------------------------------------------------------------------===//
// Tiles
//===----------------------------------------------------------------------===//

/// A tile's place: rows [row, row + rows) x columns [col, col + cols).
struct Block {
  int64_t row, rows, col, cols;
};

/// Calls fn(block) for every tile of a `rows` x `cols` matrix.
template <typename Fn>
void forEachBlock(int64_t rows, int64_t cols, TileShape tile, Fn &&fn) {
  for (int64_t col = 0; col < cols; col += tile.cols)
    for (int64_t row = 0; row < rows; row += tile.rows)
      fn(Block{row, std::min(tile.rows, rows - row), col,
               std::min(tile.cols, cols - col)});
}

/// Tile buffers, allocated once per call and reused by every tile.
class TileScratch {
public:
  TileScratch(TileShape shape, int count, at::TensorOptions options) {
    for (int i = 0; i < count; ++i)
      buffers.push_back(at::empty({shape.rows * shape.cols}, options));
  }
  /// Buffer `which` as a contiguous [block.rows, block.cols] matrix.
  at::Tensor operator()(int which, const Block &block) const {
    return buffers[which]
        .narrow(0, 0, block.rows * block.cols)
        .view({block.rows, block.cols});
  }

private:
  Tensors buffers;
};

/// S = rows[block] x cols[block]^T, written into `out`.
at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out) {
  at::mm_out(out, sim.rows.narrow(0, block.row, block.rows),
             cols.narrow(0, block.col, block.cols).t());
  return out;
}

/// Single elements of a contiguous f32 or f64 tensor.
class Elements {
public:
  explicit Elements(const at::Tensor &tensor)
      : isDouble(tensor.scalar_type() == at::kDouble), data(tensor.data_ptr()) {
  }
  double get(int64_t k) const {
    return isDouble ? static_cast<const double *>(data)[k]
                    : static_cast<const float *>(data)[k];
  }
  void set(int64_t k, double value) const {
    if (isDouble)
      static_cast<double *>(data)[k] = value;
    else
      static_cast<float *>(data)[k] = static_cast<float>(value);
  }
  void add(int64_t k, double value) const { set(k, get(k) + value); }

private:
  bool isDouble;
  void *data;
};

/// Calls fn(k, c) for every k in [begin, begin + count) whose target lies in
/// [low, low + width), with c = targets[k] - low.
template <typename Fn>
void forTargetsIn(const at::Tensor &targets, int64_t begin, int64_t count,
                  int64_t low, int64_t width, Fn &&fn) {
  const int64_t *data = targets.data_ptr<int64_t>();
  for (int64_t k = begin; k < begin + count; ++k) {
    int64_t c = data[k] - low;
    if (c >= 0 && c < width)
      fn(k, c);
  }
}

/// The tile elements of this rank's rows' targets: fn(k, element index) for
/// each row k of the block whose target column (global; the tile's columns
/// start at global column `colBase`) is in the block.
template <typename Fn>
void forRowTargets(const at::Tensor &targets, const Block &block,
                   int64_t colBase, Fn &&fn) {
  forTargetsIn(
      targets, block.row, block.rows, colBase + block.col, block.cols,
      [&](int64_t i, int64_t c) { fn(i, (i - block.row) * block.cols + c); });
}

/// The same for columns whose target row (global; the tile's rows start at
/// global row `rowBase`) is in the block.
template <typename Fn>
void forColTargets(const at::Tensor &targets, const Block &block,
                   int64_t rowBase, Fn &&fn) {
  forTargetsIn(
      targets, block.col, block.cols, rowBase + block.row, block.rows,
      [&](int64_t j, int64_t c) { fn(j, c * block.cols + (j - block.col)); });
}

/// `x` with infinities replaced by 0: a shift that keeps exp(-inf - shift) =
/// 0 instead of exp(-inf + inf) = NaN.
at::Tensor finiteShift(const at::Tensor &x) {
  return x.masked_fill(x.isinf(), 0);
}

/// Online log-sum-exp: folds the statistics (max2, sum2) into (max1, sum1),
/// in place; sum is the sum of exp(x - max), an empty set has (-inf, 0).
void mergeLse(at::Tensor max1, at::Tensor sum1, const at::Tensor &max2,
              const at::Tensor &sum2) {
  at::Tensor top = at::maximum(max1, max2);
  at::Tensor shift = finiteShift(top);
  sum1.mul_((max1 - shift).exp_()).add_(sum2 * (max2 - shift).exp_());
  max1.copy_(top);
}

/// Folds a tile into running statistics along `dim` (1: one per tile row, 0:
/// one per tile column). `work` is a scratch tile of the same shape.
void foldTile(const at::Tensor &tile, int64_t dim, at::Tensor max,
              at::Tensor sum, at::Tensor work) {
  at::Tensor blockMax = at::amax(tile, {dim});
  at::Tensor shift = finiteShift(blockMax).unsqueeze(dim);
  at::sub_out(work, tile, shift).exp_();
  mergeLse(std::move(max), std::move(sum), blockMax, work.sum(dim));
}

at::Tensor lseOf(const at::Tensor &max, const at::Tensor &sum) {
  return max + sum.log();
}

/// Backpropagates a tile's gradient G = dLoss/dL through L = scale S:
/// dRows[block] += scale G cols[block], dCols[block] += scale G^T
/// rows[block]; returns sum(G * S), the tile's part of dLoss/dscale.
double backpropTile(const at::Tensor &grad, const at::Tensor &sim,
                    const Block &block, const Similarity &operands,
                    const at::Tensor &cols, at::Tensor &dRows,
                    at::Tensor &dCols) {
  dRows.narrow(0, block.row, block.rows)
      .addmm_(grad, cols.narrow(0, block.col, block.cols), 1, operands.scale);
  dCols.narrow(0, block.col, block.cols)
      .addmm_(grad.t(), operands.rows.narrow(0, block.row, block.rows), 1,
              operands.scale);
  return at::dot(grad.view({-1}), sim.view({-1})).item<double>();
}

//===----------------------------------------------------------------------===//
// The ring driver
//===----------------------------------------------------------------------===//

// Point-to-point tags of the fused ops: 16 per step, carries in slots 0-7,
// features in 8-15. Far below GlooCommunicator's reserved tags (2^30), and
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

/// The chunk a rank holds at one step.
struct Chunk {
  /// Global index of the chunk's first column.
  int64_t offset;
  const Tensors &features;
  int64_t length() const { return features[0].size(0); }
};

/// What one pass round the ring moves and computes.
struct RingPass {
  /// This rank's chunk: contiguous tensors whose axis 0 is its length.
  Tensors features;
  /// Every rank's chunk length, in rank order.
  std::vector<int64_t> lengths;
  /// An uninitialised carry for a chunk of `length`; null: nothing carried.
  std::function<Tensors(int64_t length)> newCarry;
  /// Computes this rank's tiles of the chunk; returns its part of the
  /// chunk's carry (nothing when nothing is carried).
  std::function<Tensors(const Chunk &)> visit;
  /// Adds the carry from upstream into this rank's part, in place.
  std::function<void(Tensors &mine, const Tensors &upstream)> merge;
};

/// Runs `pass` on every rank's chunk; returns this rank's own chunk's
/// complete carry.
Tensors runRing(Communicator &comm, const RingPass &pass) {
  const int n = comm.worldSize(), r = comm.rank();
  // The ring's transfers are one collective for errors and the flight
  // record, named after the op ("ring_softmax_ce").
  const CallSite *site = currentCallSite();
  std::string op = site && !site->op.empty() ? site->op : "ring";
  ExchangeScope exchange(comm, op.substr(op.find('.') + 1));
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const bool carries = static_cast<bool>(pass.newCarry);
  Tensors held = pass.features, carry;
  Pending carrySent;
  for (int k = 0; k < n; ++k) {
    const int q = (r - k + n) % n;
    // The carry r-1 sent at the end of step k-1 first, then the features.
    Tensors upstream;
    Pending carryIn;
    if (carries && k > 0) {
      upstream = pass.newCarry(pass.lengths[q]);
      postRecvs(comm, upstream, prev, ringTag(k, kCarrySlot), carryIn);
    }
    Pending transfers;
    Tensors incoming;
    if (k + 1 < n) {
      incoming = emptyLike(pass.features, pass.lengths[(q + n - 1) % n]);
      postRecvs(comm, incoming, prev, ringTag(k, kFeatureSlot), transfers);
      postSends(comm, held, next, ringTag(k, kFeatureSlot), transfers);
    }
    carry = pass.visit(Chunk{offsetOf(pass.lengths, q), held});
    if (carries) {
      carryIn.wait();
      if (k > 0)
        pass.merge(carry, upstream);
      // r+1 posted its recv for the previous send at the start of step k.
      carrySent.wait();
      if (n > 1)
        postSends(comm, carry, next, ringTag(k + 1, kCarrySlot), carrySent);
    }
    transfers.wait();
    if (k + 1 < n)
      held = std::move(incoming);
  }
  if (!carries || n == 1)
    return carry;
  Tensors home = pass.newCarry(pass.lengths[r]);
  Pending homeIn;
  postRecvs(comm, home, prev, ringTag(n, kCarrySlot), homeIn);
  carrySent.wait();
  homeIn.wait();
  return home;
}

/// The backward's ring: the carry is each chunk's column gradient [length,
/// width] and its owner's share of a 0-d parameter's gradient ([1] f64),
/// summed on their way home; tiles(chunk, dCols) adds this rank's part of the
/// column gradient and returns its part of the share. Returns the gradient of
/// this rank's own columns and its share.
struct ColumnGradient {
  at::Tensor dCols, share;
};

ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, at::TensorOptions options,
    const std::function<at::Tensor(const Chunk &, at::Tensor &)> &tiles) {
  RingPass pass;
  pass.features = std::move(features);
  pass.lengths = std::move(lengths);
  pass.newCarry = [&](int64_t length) {
    return Tensors{at::empty({length, width}, options),
                   at::empty({1}, options.dtype(at::kDouble))};
  };
  pass.visit = [&](const Chunk &chunk) {
    at::Tensor dCols = at::zeros({chunk.length(), width}, options);
    at::Tensor share = tiles(chunk, dCols);
    return Tensors{dCols, share};
  };
  pass.merge = [](Tensors &mine, const Tensors &upstream) {
    mine[0].add_(upstream[0]);
    mine[1].add_(upstream[1]);
  };
  Tensors home = runRing(comm, pass);
  return {home[0], home[1]};
}

/// The CPU form: tiles(chunk, dCols, share) adds to a double share.
ColumnGradient runGradientRing(
    Communicator &comm, Tensors features, std::vector<int64_t> lengths,
    int64_t width, at::TensorOptions options,
    const std::function<void(const Chunk &, at::Tensor &, double &)> &tiles) {
  return runGradientRing(comm, std::move(features), std::move(lengths), width,
                         options, [&](const Chunk &chunk, at::Tensor &dCols) {
                           double share = 0;
                           tiles(chunk, dCols, share);
                           return at::full({1}, share,
                                           options.dtype(at::kDouble));
                         });
}

/// Sets a backward op's results: the gradients of rows and cols (of the
/// types of operands 0 and 1), then those of its 0-d operands 2, 3, ...
/// (this rank's partial gradients, on the operands' device).
void setGradients(KernelContext &ctx, const FusedArgs &args,
                  const at::Tensor &dRows, const at::Tensor &dCols,
                  std::initializer_list<double> scalars) {
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  size_t i = 2;
  for (double value : scalars) {
    ctx.setResult(i, at::scalar_tensor(value, at::TensorOptions(args.type(i)))
                         .to(args.device));
    ++i;
  }
}

/// Running log-sum-exp statistics per row (max, sum of exp(x - max); empty:
/// (-inf, 0)) and the value each row picks at its target.
struct RowStatistics {
  at::Tensor max, sum, picked;
};

RowStatistics rowStatistics(int64_t n, const FusedArgs &args) {
  return {at::full({n}, -kInf, args.options()), at::zeros({n}, args.options()),
          at::zeros({n}, args.options())};
}

#ifdef DLOSS_HAVE_CUDA
// The GPU versions of the six ops (below, after the CPU ones).
void ringSoftmaxCEDevice(KernelContext &ctx, const FusedArgs &args);
void ringSoftmaxCEGradDevice(KernelContext &ctx, const FusedArgs &args);
void ringSigmoidPairsDevice(KernelContext &ctx, const FusedArgs &args);
void ringSigmoidPairsGradDevice(KernelContext &ctx, const FusedArgs &args);
void shardedSoftmaxDevice(KernelContext &ctx, const FusedArgs &args);
void shardedSoftmaxGradDevice(KernelContext &ctx, const FusedArgs &args);

/// Runs a GPU op; the tile launchers' CUDA and cuBLAS failures
/// (std::runtime_error) become dloss::Errors naming the op and rank.
void onDevice(KernelContext &ctx, const FusedArgs &args,
              void (*op)(KernelContext &, const FusedArgs &));
#define DLOSS_DEVICE_DISPATCH(fn)                                              \
  if (args.onDevice)                                                           \
    return onDevice(ctx, args, fn);
#else
#define DLOSS_DEVICE_DISPATCH(fn)
#endif

//===----------------------------------------------------------------------===//
// dloss.ring_softmax_ce and its backward
//===----------------------------------------------------------------------===//

/// Operands 0-4 of both softmax ops, with every rank's sizes, and the
/// backward's 5-8: the saved statistics and the cotangents.
struct SoftmaxOperands {
  Similarity sim;
  std::vector<int64_t> rowSizes, colSizes;
  int64_t rowOffset = 0;
  at::Tensor rowTargets, colTargets;
  at::Tensor rowLse, colLse, ctRow, ctCol; ///< the backward's
};

SoftmaxOperands softmaxOperands(const FusedArgs &args, bool backward = false) {
  SoftmaxOperands ops;
  ops.sim = similarityOperands(args);
  ops.rowSizes = args.ctx.rankSizes(0, 0);
  ops.colSizes = args.ctx.rankSizes(1, 0);
  ops.rowOffset = offsetOf(ops.rowSizes, args.rank);
  ops.rowTargets = args.targets(3, "row_targets", ops.sim.rows.size(0),
                                total(ops.colSizes), "columns");
  ops.colTargets = args.targets(4, "col_targets", ops.sim.cols.size(0),
                                total(ops.rowSizes), "rows");
  if (backward) {
    const int64_t n = ops.sim.rows.size(0), m = ops.sim.cols.size(0);
    ops.rowLse = args.vector(5, "row_lse", n);
    ops.colLse = args.vector(6, "col_lse", m);
    ops.ctRow = args.vector(7, "ct_row", n);
    ops.ctCol = args.vector(8, "ct_col", m);
  }
  return ops;
}

/// The CLIP forward's ring and results, for the CPU and GPU ops:
/// tiles(chunk, rows, stats) folds this rank's tiles of a chunk into the row
/// statistics and the chunk's column statistics `stats` [3, length] (running
/// max, sum of exp, target logit).
template <typename Tiles>
void runSoftmaxCE(KernelContext &ctx, const FusedArgs &args,
                  const SoftmaxOperands &ops, Tiles &&tiles) {
  RowStatistics rows = rowStatistics(ops.sim.rows.size(0), args);
  RingPass pass;
  pass.features = {ops.sim.cols, ops.colTargets};
  pass.lengths = ops.colSizes;
  pass.newCarry = [&](int64_t length) {
    return Tensors{at::empty({3, length}, args.options())};
  };
  pass.visit = [&](const Chunk &chunk) {
    at::Tensor stats = pass.newCarry(chunk.length())[0];
    stats[0].fill_(-kInf);
    stats.narrow(0, 1, 2).zero_();
    tiles(chunk, rows, stats);
    return Tensors{stats};
  };
  pass.merge = [](Tensors &mine, const Tensors &upstream) {
    mergeLse(mine[0][0], mine[0][1], upstream[0][0], upstream[0][1]);
    mine[0][2].add_(upstream[0][2]);
  };
  at::Tensor colStats = runRing(ctx.communicator(), pass)[0];

  at::Tensor rowLse = lseOf(rows.max, rows.sum);
  at::Tensor colLse = lseOf(colStats[0], colStats[1]);
  ctx.setResult(0, (rowLse - rows.picked).to(args.type(0)));
  ctx.setResult(1, (colLse - colStats[2]).to(args.type(1)));
  ctx.setResult(2, rowLse.to(args.type(0)));
  ctx.setResult(3, colLse.to(args.type(1)));
}

void ringSoftmaxCE(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_softmax_ce");
  DLOSS_DEVICE_DISPATCH(ringSoftmaxCEDevice)
  SoftmaxOperands ops = softmaxOperands(args);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0);
  TileShape tile = clippedTile(n, largest(ops.colSizes), args.compute);
  TileScratch scratch(tile, 2, args.options());

  runSoftmaxCE(
      ctx, args, ops,
      [&](const Chunk &chunk, RowStatistics &rows, at::Tensor &stats) {
        const at::Tensor &cols = chunk.features[0],
                         &colTargets = chunk.features[1];
        Elements rowTargetAt(rows.picked), colTargetAt(stats[2]);
        forEachBlock(n, chunk.length(), tile, [&](const Block &block) {
          at::Tensor logits =
              similarityTile(sim, cols, block, scratch(0, block))
                  .mul_(sim.scale);
          Elements logit(logits);
          forRowTargets(
              ops.rowTargets, block, chunk.offset,
              [&](int64_t i, int64_t e) { rowTargetAt.set(i, logit.get(e)); });
          forColTargets(
              colTargets, block, ops.rowOffset,
              [&](int64_t j, int64_t e) { colTargetAt.set(j, logit.get(e)); });
          foldTile(logits, 1, rows.max.narrow(0, block.row, block.rows),
                   rows.sum.narrow(0, block.row, block.rows),
                   scratch(1, block));
          foldTile(logits, 0, stats[0].narrow(0, block.col, block.cols),
                   stats[1].narrow(0, block.col, block.cols),
                   scratch(1, block));
        });
      });
}

void ringSoftmaxCEGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_softmax_ce_grad");
  DLOSS_DEVICE_DISPATCH(ringSoftmaxCEGradDevice)
  SoftmaxOperands ops = softmaxOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const at::Tensor &rowLse = ops.rowLse, &ctRow = ops.ctRow;
  const int64_t n = sim.rows.size(0), d = sim.rows.size(1);
  TileShape tile = clippedTile(n, largest(ops.colSizes), args.compute);
  TileScratch scratch(tile, 3, args.options());
  at::Tensor dRows = at::zeros({n, d}, args.options());
  double dScale = 0;

  // dscale = sum(G * S) splits into the row direction's part (this rank's
  // share) and the column direction's part, which belongs to the columns'
  // owner and travels home with their gradient: each rank's share is then the
  // gradient of its own rows' and columns' losses, as in the unfused plan
  // (and OpenCLIP's local_loss + gather_with_grad).
  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols, double &colShare) {
    const at::Tensor &cols = chunk.features[0], &colTargets = chunk.features[1];
    const at::Tensor &chunkLse = chunk.features[2],
                     &chunkCt = chunk.features[3];
    forEachBlock(n, chunk.length(), tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
      // G = ct_row P_row + ct_col P_col - the one-hot targets.
      at::Tensor grad = scratch(1, block), byCol = scratch(2, block);
      grad.copy_(s).mul_(sim.scale);
      grad.sub_(rowLse.narrow(0, block.row, block.rows).unsqueeze(1)).exp_();
      grad.mul_(ctRow.narrow(0, block.row, block.rows).unsqueeze(1));
      byCol.copy_(s).mul_(sim.scale);
      byCol.sub_(chunkLse.narrow(0, block.col, block.cols).unsqueeze(0)).exp_();
      byCol.mul_(chunkCt.narrow(0, block.col, block.cols).unsqueeze(0));
      double colPart = at::dot(byCol.view({-1}), s.view({-1})).item<double>();
      grad.add_(byCol);
      Elements g(grad), sAt(s), ctRowAt(ctRow), ctColAt(chunkCt);
      forRowTargets(ops.rowTargets, block, chunk.offset,
                    [&](int64_t i, int64_t e) { g.add(e, -ctRowAt.get(i)); });
      forColTargets(colTargets, block, ops.rowOffset,
                    [&](int64_t j, int64_t e) {
                      g.add(e, -ctColAt.get(j));
                      colPart -= ctColAt.get(j) * sAt.get(e);
                    });
      double all = backpropTile(grad, s, block, sim, cols, dRows, dCols);
      dScale += all - colPart;
      colShare += colPart;
    });
  };
  ColumnGradient own = runGradientRing(
      ctx.communicator(), {sim.cols, ops.colTargets, ops.colLse, ops.ctCol},
      ops.colSizes, d, args.options(), tiles);

  setGradients(ctx, args, dRows, own.dCols,
               {dScale + own.share.item<double>()});
}

//===----------------------------------------------------------------------===//
// dloss.ring_sigmoid_pairs and its backward
//===----------------------------------------------------------------------===//

/// Operands 0-4 of both sigmoid ops, with every rank's column counts, and
/// the backward's cotangents 5-6.
struct SigmoidOperands {
  Similarity sim;
  double bias = 0;
  std::vector<int64_t> colSizes;
  at::Tensor targets;
  TileShape tile{1, 1};
  at::Tensor ctPair, ctPositive; ///< the backward's
};

SigmoidOperands sigmoidOperands(const FusedArgs &args, bool backward = false) {
  SigmoidOperands ops;
  ops.sim = similarityOperands(args);
  ops.bias = args.scalar(3, "bias");
  ops.colSizes = args.ctx.rankSizes(1, 0);
  ops.targets = args.targets(4, "targets", ops.sim.rows.size(0),
                             total(ops.colSizes), "columns");
  ops.tile =
      clippedTile(ops.sim.rows.size(0), largest(ops.colSizes), args.compute);
  if (backward) {
    ops.ctPair = args.vector(5, "ct_pair", ops.sim.rows.size(0));
    ops.ctPositive = args.vector(6, "ct_positive", ops.sim.rows.size(0));
  }
  return ops;
}

/// The SigLIP forward's ring and results, for the CPU and GPU ops:
/// tiles(chunk, pairSum, positive) adds this rank's tiles of a chunk to each
/// row's sum of softplus(L) and stores L at its target into `positive`.
template <typename Tiles>
void runSigmoidPairs(KernelContext &ctx, const FusedArgs &args,
                     const SigmoidOperands &ops, Tiles &&tiles) {
  const int64_t n = ops.sim.rows.size(0);
  at::Tensor pairSum = at::zeros({n}, args.options());
  at::Tensor positive = at::zeros({n}, args.options());
  RingPass pass;
  pass.features = {ops.sim.cols};
  pass.lengths = ops.colSizes;
  pass.visit = [&](const Chunk &chunk) {
    tiles(chunk, pairSum, positive);
    return Tensors{};
  };
  runRing(ctx.communicator(), pass);

  ctx.setResult(0, pairSum.to(args.type(0)));
  ctx.setResult(1, positive.to(args.type(0)));
}

/// L = scale S + bias for a chunk's block, in its scratch tile 0.
at::Tensor sigmoidLogits(const SigmoidOperands &ops, const at::Tensor &cols,
                         const Block &block, const TileScratch &scratch) {
  return similarityTile(ops.sim, cols, block, scratch(0, block))
      .mul_(ops.sim.scale)
      .add_(ops.bias);
}

void ringSigmoidPairs(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_sigmoid_pairs");
  DLOSS_DEVICE_DISPATCH(ringSigmoidPairsDevice)
  SigmoidOperands ops = sigmoidOperands(args);
  const int64_t n = ops.sim.rows.size(0);
  TileScratch scratch(ops.tile, 2, args.options());

  runSigmoidPairs(
      ctx, args, ops,
      [&](const Chunk &chunk, at::Tensor &pairSum, at::Tensor &positive) {
        Elements positiveAt(positive);
        forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
          at::Tensor logits =
              sigmoidLogits(ops, chunk.features[0], block, scratch);
          Elements logit(logits);
          forRowTargets(
              ops.targets, block, chunk.offset,
              [&](int64_t i, int64_t e) { positiveAt.set(i, logit.get(e)); });
          // softplus(x) = log1p(exp(-|x|)) + max(x, 0), exact at both ends.
          at::Tensor softplus = scratch(1, block);
          at::abs_out(softplus, logits).neg_().exp_().log1p_();
          softplus.add_(logits.clamp_min_(0));
          pairSum.narrow(0, block.row, block.rows).add_(softplus.sum(1));
        });
      });
}

void ringSigmoidPairsGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_sigmoid_pairs_grad");
  DLOSS_DEVICE_DISPATCH(ringSigmoidPairsGradDevice)
  SigmoidOperands ops = sigmoidOperands(args, /*backward=*/true);
  const int64_t n = ops.sim.rows.size(0), d = ops.sim.rows.size(1);
  TileScratch scratch(ops.tile, 2, args.options());
  at::Tensor dRows = at::zeros({n, d}, args.options());
  double dScale = 0, dBias = 0;

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols, double &) {
    const at::Tensor &cols = chunk.features[0];
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      // S in tile 0; G = ct_pair sigmoid(L) + ct_positive at the targets.
      at::Tensor s = similarityTile(ops.sim, cols, block, scratch(0, block));
      at::Tensor grad = scratch(1, block);
      grad.copy_(s).mul_(ops.sim.scale).add_(ops.bias).sigmoid_();
      grad.mul_(ops.ctPair.narrow(0, block.row, block.rows).unsqueeze(1));
      Elements g(grad), ctAt(ops.ctPositive);
      forRowTargets(ops.targets, block, chunk.offset,
                    [&](int64_t i, int64_t e) { g.add(e, ctAt.get(i)); });
      dBias += grad.sum().item<double>();
      dScale += backpropTile(grad, s, block, ops.sim, cols, dRows, dCols);
    });
  };
  at::Tensor dCols = runGradientRing(ctx.communicator(), {ops.sim.cols},
                                     ops.colSizes, d, args.options(), tiles)
                         .dCols;

  setGradients(ctx, args, dRows, dCols, {dScale, dBias});
}

//===----------------------------------------------------------------------===//
// dloss.sharded_softmax and its backward
//===----------------------------------------------------------------------===//

/// Operands 0-3 of both sharded ops: the gathered rows, this rank's class
/// shard, the scale and the global class targets; and the backward's 4-6:
/// the saved lse_rest and the cotangents.
struct ShardOperands {
  Similarity sim;
  int64_t classOffset = 0;
  at::Tensor targets;
  TileShape tile{1, 1};
  at::Tensor lseRest, ctLse, ctTarget; ///< the backward's
};

ShardOperands shardOperands(const FusedArgs &args, bool backward = false) {
  ShardOperands ops;
  ops.sim = similarityOperands(args);
  std::vector<int64_t> classSizes = args.ctx.rankSizes(1, 0);
  ops.classOffset = offsetOf(classSizes, args.rank);
  ops.targets = args.targets(3, "targets", ops.sim.rows.size(0),
                             total(classSizes), "classes");
  ops.tile =
      clippedTile(ops.sim.rows.size(0), ops.sim.cols.size(0), args.compute);
  if (backward) {
    const int64_t batch = ops.sim.rows.size(0);
    ops.lseRest = args.vector(4, "lse_rest", batch);
    ops.ctLse = args.vector(5, "ct_lse", batch);
    ops.ctTarget = args.vector(6, "ct_target", batch);
  }
  return ops;
}

/// Combines the shards' row statistics (this rank's classes, without the
/// targets) and target dots into the results lse_rest and target_dot. Every
/// rank makes both calls, whatever its shard holds.
void combineShards(KernelContext &ctx, const FusedArgs &args,
                   RowStatistics &rows) {
  Communicator &comm = ctx.communicator();
  at::Tensor globalMax = comm.allReduce(rows.max, Reduction::Max);
  rows.sum.mul_((rows.max - finiteShift(globalMax)).exp_());
  at::Tensor sums =
      comm.allReduce(at::stack({rows.sum, rows.picked}), Reduction::Sum);
  // No class but the target anywhere: max -inf, sum 0, lse -inf.
  ctx.setResult(0, lseOf(globalMax, sums[0]).to(args.type(0)));
  ctx.setResult(1, sums[1].to(args.type(0)));
}

void shardedSoftmax(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.sharded_softmax", "weights");
  DLOSS_DEVICE_DISPATCH(shardedSoftmaxDevice)
  ShardOperands ops = shardOperands(args);
  const int64_t batch = ops.sim.rows.size(0);
  TileScratch scratch(ops.tile, 2, args.options());
  RowStatistics rows = rowStatistics(batch, args);
  Elements targetDotAt(rows.picked);

  forEachBlock(batch, ops.sim.cols.size(0), ops.tile, [&](const Block &block) {
    at::Tensor logits =
        similarityTile(ops.sim, ops.sim.cols, block, scratch(0, block));
    Elements logit(logits);
    // The target dot is unscaled; its logit leaves the sum (lse of the rest).
    forRowTargets(
        ops.targets, block, ops.classOffset,
        [&](int64_t i, int64_t e) { targetDotAt.set(i, logit.get(e)); });
    logits.mul_(ops.sim.scale);
    forRowTargets(ops.targets, block, ops.classOffset,
                  [&](int64_t, int64_t e) { logit.set(e, -kInf); });
    foldTile(logits, 1, rows.max.narrow(0, block.row, block.rows),
             rows.sum.narrow(0, block.row, block.rows), scratch(1, block));
  });
  combineShards(ctx, args, rows);
}

void shardedSoftmaxGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.sharded_softmax_grad", "weights");
  DLOSS_DEVICE_DISPATCH(shardedSoftmaxGradDevice)
  ShardOperands ops = shardOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t batch = sim.rows.size(0), classes = sim.cols.size(0);
  TileScratch scratch(ops.tile, 2, args.options());
  at::Tensor dRows = at::zeros_like(sim.rows);
  at::Tensor dWeights = at::zeros_like(sim.cols);
  double dScale = 0;

  forEachBlock(batch, classes, ops.tile, [&](const Block &block) {
    at::Tensor s = similarityTile(sim, sim.cols, block, scratch(0, block));
    // G = ct_lse P, P the softmax over the classes other than the target.
    at::Tensor grad = scratch(1, block);
    grad.copy_(s).mul_(sim.scale);
    grad.sub_(ops.lseRest.narrow(0, block.row, block.rows).unsqueeze(1)).exp_();
    Elements g(grad);
    forRowTargets(ops.targets, block, ops.classOffset,
                  [&](int64_t, int64_t e) { g.set(e, 0); });
    grad.mul_(ops.ctLse.narrow(0, block.row, block.rows).unsqueeze(1));
    dScale += backpropTile(grad, s, block, sim, sim.cols, dRows, dWeights);
  });

  // target_dot = rows[i] . w_t: its cotangent reaches both factors.
  std::vector<int64_t> rowsHit, classesHit;
  forTargetsIn(ops.targets, 0, batch, ops.classOffset, classes,
               [&](int64_t i, int64_t c) {
                 rowsHit.push_back(i);
                 classesHit.push_back(c);
               });
  at::Tensor rowIndex = at::tensor(rowsHit, at::kLong);
  at::Tensor classIndex = at::tensor(classesHit, at::kLong);
  at::Tensor ct = ops.ctTarget.index_select(0, rowIndex).unsqueeze(1);
  dRows.index_add_(0, rowIndex, sim.cols.index_select(0, classIndex) * ct);
  dWeights.index_add_(0, classIndex, sim.rows.index_select(0, rowIndex) * ct);

  setGradients(ctx, args, dRows, dWeights, {dScale});
}

#ifdef DLOSS_HAVE_CUDA
//===----------------------------------------------------------------------===//
// The GPU path: the same ring, a device visit
//===----------------------------------------------------------------------===//

/// The GPU tile: DLOSS_TILE when set (tests cross block edges with it),
/// otherwise 2048 x 4096. Its fp32 S (32 MiB) stays in Hopper's 50 MB L2
/// between the GEMM and its epilogue; the GEMM has 256 output tiles of
/// 128 x 256 (two waves on 132 SMs), and the backward GEMMs get K = 2048 or
/// 4096, enough for cuBLAS's split-K/stream-K. Memory stays O(tile): 48 MiB
/// of workspace in bf16, against GiBs for the full similarity.
TileShape deviceTileShape(int64_t rows, int64_t cols) {
  TileShape tile{2048, 4096};
  if (const char *value = std::getenv("DLOSS_TILE"); value && *value)
    tile = parseTile(value);
  return {std::min(tile.rows, std::max<int64_t>(rows, 1)),
          std::min(tile.cols, std::max<int64_t>(cols, 1))};
}

cuda::ElementType elementTypeOf(at::ScalarType type) {
  return type == at::kBFloat16 ? cuda::ElementType::BF16
         : type == at::kHalf   ? cuda::ElementType::F16
                               : cuda::ElementType::F32;
}

/// LibTorch's current stream when it has CUDA; the legacy default stream
/// otherwise (then no CUDA tensor can reach here except through the tests).
void *currentStream(const at::Device &device) {
#ifdef DLOSS_TORCH_HAS_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;
#endif
}

/// One call's tile launches: the tile shape and the workspace (from
/// LibTorch's allocator, on the operands' device).
class DeviceTiles {
public:
  DeviceTiles(const FusedArgs &args, int64_t rows, int64_t cols)
      : shape(deviceTileShape(rows, cols)) {
    launch.device = args.device.index();
    launch.stream = currentStream(args.device);
    launch.type = elementTypeOf(args.matrixType);
    launch.maxRows = shape.rows;
    launch.maxCols = shape.cols;
    const char *tf32 = std::getenv("DLOSS_CUDA_TF32");
    launch.allowTF32 = tf32 && std::string(tf32) == "1";
    size_t bytes =
        cuda::tileWorkspaceBytes(shape.rows, shape.cols, launch.type);
    workspace = at::empty({static_cast<int64_t>(bytes)},
                          args.options().dtype(at::kByte));
    launch.workspace = workspace.data_ptr();
  }

  /// The operands of `block`: rows[block.row...], cols[block.col...].
  cuda::Tile tile(const at::Tensor &rows, const at::Tensor &cols,
                  const Block &block) const {
    const int64_t depth = rows.size(1);
    const size_t row = rows.element_size() * depth;
    cuda::Tile tile;
    tile.rows = static_cast<const char *>(rows.data_ptr()) + block.row * row;
    tile.cols = static_cast<const char *>(cols.data_ptr()) + block.col * row;
    tile.rowCount = block.rows;
    tile.colCount = block.cols;
    tile.depth = depth;
    return tile;
  }

  TileShape shape;
  cuda::TileLaunch launch;

private:
  at::Tensor workspace;
};

/// Element `offset` of a contiguous tensor of T.
template <typename T> T *dataAt(const at::Tensor &tensor, int64_t offset = 0) {
  return tensor.data_ptr<T>() + offset;
}

void onDevice(KernelContext &ctx, const FusedArgs &args,
              void (*op)(KernelContext &, const FusedArgs &)) {
  try {
    op(ctx, args);
  } catch (const Error &) {
    throw;
  } catch (const std::runtime_error &error) {
    args.fail(error.what(),
              "A CUDA kernel or cuBLAS call of the fused op failed; rerun "
              "with CUDA_LAUNCH_BLOCKING=1 to locate it");
  }
}

void ringSoftmaxCEDevice(KernelContext &ctx, const FusedArgs &args) {
  SoftmaxOperands ops = softmaxOperands(args);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0);
  DeviceTiles dev(args, n, largest(ops.colSizes));

  runSoftmaxCE(ctx, args, ops,
               [&](const Chunk &chunk, RowStatistics &rows, at::Tensor &stats) {
                 const at::Tensor &cols = chunk.features[0],
                                  &colTargets = chunk.features[1];
                 const int64_t length = chunk.length();
                 forEachBlock(n, length, dev.shape, [&](const Block &block) {
                   cuda::ClipForward tile;
                   tile.scale = static_cast<float>(sim.scale);
                   tile.rowTargets = dataAt<int64_t>(ops.rowTargets, block.row);
                   tile.colBase = chunk.offset + block.col;
                   tile.colTargets = dataAt<int64_t>(colTargets, block.col);
                   tile.rowBase = ops.rowOffset + block.row;
                   tile.rowMax = dataAt<float>(rows.max, block.row);
                   tile.rowSum = dataAt<float>(rows.sum, block.row);
                   tile.rowTarget = dataAt<float>(rows.picked, block.row);
                   tile.colMax = dataAt<float>(stats, block.col);
                   tile.colSum = dataAt<float>(stats, length + block.col);
                   tile.colTarget =
                       dataAt<float>(stats, 2 * length + block.col);
                   cuda::clipForwardTile(dev.launch,
                                         dev.tile(sim.rows, cols, block), tile);
                 });
               });
}

/// Per row, in f64, a backward's share of a 0-d parameter's gradient.
at::Tensor perRowShares(int64_t n, const FusedArgs &args) {
  return at::zeros({n}, args.options().dtype(at::kDouble));
}

/// A GPU backward's rows: their targets, the gradient dRows [n, d] and, per
/// row, the share of dscale; what every backward tile takes (BackwardTile).
struct DeviceRowGradient {
  DeviceRowGradient(const FusedArgs &args, double scale,
                    const at::Tensor &targets, int64_t n, int64_t d)
      : scale(scale), targets(targets), d(d),
        dRows(at::zeros({n, d}, args.options())),
        dScaleRow(perRowShares(n, args)) {}

  /// Points `tile`'s BackwardTile fields at `block`, whose columns are the
  /// global columns colOffset + block.col... and whose column gradient is in
  /// dCols ([count, d] float32).
  void point(cuda::BackwardTile &tile, const Block &block, int64_t colOffset,
             const at::Tensor &dCols) const {
    tile.scale = static_cast<float>(scale);
    tile.rowTargets = dataAt<int64_t>(targets, block.row);
    tile.colBase = colOffset + block.col;
    tile.dRows = dataAt<float>(dRows, block.row * d);
    tile.dCols = dataAt<float>(dCols, block.col * d);
    tile.dScaleRow = dataAt<double>(dScaleRow, block.row);
  }

  double scale;
  at::Tensor targets;
  int64_t d;
  at::Tensor dRows, dScaleRow;
};

double totalOf(const at::Tensor &shares) { return shares.sum().item<double>(); }

void ringSoftmaxCEGradDevice(KernelContext &ctx, const FusedArgs &args) {
  SoftmaxOperands ops = softmaxOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0), d = sim.rows.size(1);
  DeviceTiles dev(args, n, largest(ops.colSizes));
  // Per row: the row direction's share of dscale (see the CPU op).
  DeviceRowGradient rows(args, sim.scale, ops.rowTargets, n, d);

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    const at::Tensor &cols = chunk.features[0], &colTargets = chunk.features[1];
    const at::Tensor &chunkLse = chunk.features[2],
                     &chunkCt = chunk.features[3];
    at::Tensor colShareRow = perRowShares(n, args);
    cuda::prepareGradientScale(dev.launch, static_cast<float>(sim.scale),
                               dataAt<float>(ops.ctRow), n,
                               dataAt<float>(chunkCt), chunk.length());
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::ClipBackward tile;
      rows.point(tile, block, chunk.offset, dCols);
      tile.rowLse = dataAt<float>(ops.rowLse, block.row);
      tile.ctRow = dataAt<float>(ops.ctRow, block.row);
      tile.colLse = dataAt<float>(chunkLse, block.col);
      tile.ctCol = dataAt<float>(chunkCt, block.col);
      tile.colTargets = dataAt<int64_t>(colTargets, block.col);
      tile.rowBase = ops.rowOffset + block.row;
      tile.colShareRow = dataAt<double>(colShareRow, block.row);
      cuda::clipBackwardTile(dev.launch, dev.tile(sim.rows, cols, block), tile);
    });
    return colShareRow.sum().reshape({1});
  };
  ColumnGradient own = runGradientRing(
      ctx.communicator(), {sim.cols, ops.colTargets, ops.colLse, ops.ctCol},
      ops.colSizes, d, args.options(), tiles);

  setGradients(ctx, args, rows.dRows, own.dCols,
               {totalOf(rows.dScaleRow) + own.share.item<double>()});
}

void ringSigmoidPairsDevice(KernelContext &ctx, const FusedArgs &args) {
  SigmoidOperands ops = sigmoidOperands(args);
  const int64_t n = ops.sim.rows.size(0);
  DeviceTiles dev(args, n, largest(ops.colSizes));

  runSigmoidPairs(
      ctx, args, ops,
      [&](const Chunk &chunk, at::Tensor &pairSum, at::Tensor &positive) {
        forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
          cuda::SigmoidForward tile;
          tile.scale = static_cast<float>(ops.sim.scale);
          tile.bias = static_cast<float>(ops.bias);
          tile.targets = dataAt<int64_t>(ops.targets, block.row);
          tile.colBase = chunk.offset + block.col;
          tile.pairSum = dataAt<float>(pairSum, block.row);
          tile.positive = dataAt<float>(positive, block.row);
          cuda::sigmoidForwardTile(
              dev.launch, dev.tile(ops.sim.rows, chunk.features[0], block),
              tile);
        });
      });
}

void ringSigmoidPairsGradDevice(KernelContext &ctx, const FusedArgs &args) {
  SigmoidOperands ops = sigmoidOperands(args, /*backward=*/true);
  const int64_t n = ops.sim.rows.size(0), d = ops.sim.rows.size(1);
  DeviceTiles dev(args, n, largest(ops.colSizes));
  DeviceRowGradient rows(args, ops.sim.scale, ops.targets, n, d);
  at::Tensor dBiasRow = perRowShares(n, args);
  // G's magnitude depends on this rank's cotangents only: one prescale.
  cuda::prepareGradientScale(dev.launch, static_cast<float>(ops.sim.scale),
                             dataAt<float>(ops.ctPair), n,
                             dataAt<float>(ops.ctPositive), n);

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::SigmoidBackward tile;
      rows.point(tile, block, chunk.offset, dCols);
      tile.bias = static_cast<float>(ops.bias);
      tile.ctPair = dataAt<float>(ops.ctPair, block.row);
      tile.ctPositive = dataAt<float>(ops.ctPositive, block.row);
      tile.dBiasRow = dataAt<double>(dBiasRow, block.row);
      cuda::sigmoidBackwardTile(
          dev.launch, dev.tile(ops.sim.rows, chunk.features[0], block), tile);
    });
    return at::zeros({1}, args.options().dtype(at::kDouble));
  };
  at::Tensor dCols = runGradientRing(ctx.communicator(), {ops.sim.cols},
                                     ops.colSizes, d, args.options(), tiles)
                         .dCols;

  setGradients(ctx, args, rows.dRows, dCols,
               {totalOf(rows.dScaleRow), totalOf(dBiasRow)});
}

void shardedSoftmaxDevice(KernelContext &ctx, const FusedArgs &args) {
  ShardOperands ops = shardOperands(args);
  const int64_t batch = ops.sim.rows.size(0), classes = ops.sim.cols.size(0);
  DeviceTiles dev(args, batch, classes);
  RowStatistics rows = rowStatistics(batch, args);

  forEachBlock(batch, classes, dev.shape, [&](const Block &block) {
    cuda::ShardedForward tile;
    tile.scale = static_cast<float>(ops.sim.scale);
    tile.targets = dataAt<int64_t>(ops.targets, block.row);
    tile.colBase = ops.classOffset + block.col;
    tile.rowMax = dataAt<float>(rows.max, block.row);
    tile.rowSum = dataAt<float>(rows.sum, block.row);
    tile.targetDot = dataAt<float>(rows.picked, block.row);
    cuda::shardedForwardTile(dev.launch,
                             dev.tile(ops.sim.rows, ops.sim.cols, block), tile);
  });
  combineShards(ctx, args, rows);
}

void shardedSoftmaxGradDevice(KernelContext &ctx, const FusedArgs &args) {
  ShardOperands ops = shardOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t batch = sim.rows.size(0), classes = sim.cols.size(0),
                d = sim.rows.size(1);
  DeviceTiles dev(args, batch, classes);
  DeviceRowGradient rows(args, sim.scale, ops.targets, batch, d);
  at::Tensor dWeights = at::zeros({classes, d}, args.options());
  cuda::prepareGradientScale(dev.launch, static_cast<float>(sim.scale),
                             dataAt<float>(ops.ctLse), batch, nullptr, 0);

  forEachBlock(batch, classes, dev.shape, [&](const Block &block) {
    cuda::ShardedBackward tile;
    rows.point(tile, block, ops.classOffset, dWeights);
    tile.lseRest = dataAt<float>(ops.lseRest, block.row);
    tile.ctLse = dataAt<float>(ops.ctLse, block.row);
    cuda::shardedBackwardTile(dev.launch, dev.tile(sim.rows, sim.cols, block),
                              tile);
  });

  // target_dot = rows[i] . w_t: its cotangent reaches both factors.
  at::Tensor local = ops.targets - ops.classOffset;
  at::Tensor rowIndex =
      (local >= 0).logical_and_(local < classes).nonzero().squeeze(1);
  at::Tensor classIndex = local.index_select(0, rowIndex);
  at::Tensor ct = ops.ctTarget.index_select(0, rowIndex).unsqueeze(1);
  rows.dRows.index_add_(
      0, rowIndex, sim.cols.index_select(0, classIndex).to(at::kFloat) * ct);
  dWeights.index_add_(0, classIndex,
                      sim.rows.index_select(0, rowIndex).to(at::kFloat) * ct);

  setGradients(ctx, args, rows.dRows, dWeights, {totalOf(rows.dScaleRow)});
}
#endif // DLOSS_HAVE_CUDA

} // namespace

//===----------------------------------------------------------------------===//
// Public functions
//===----------------------------------------------------------------------===//

TileShape fusedTileShape(size_t elementSize) {
  if (const char *value = std::getenv("DLOSS_TILE"); value && *value)
    return parseTile(value);
  // One tile in about half the L2 cache leaves room for the operand blocks.
  int64_t budget = l2CacheBytes() / 2 / static_cast<int64_t>(elementSize);
  int64_t rows = std::clamp<int64_t>(budget / 512, 32, 256);
  int64_t cols = std::max<int64_t>(64, budget / rows / 64 * 64);
  return {rows, cols};
}

void addFusedKernels(std::unordered_map<std::string, KernelRule> &table) {
  auto rule = [](void (*fn)(KernelContext &), int operands, int results,
                 ShapeFlow flow = ShapeFlow::None) {
    return KernelRule{[fn](const StepAttrs &) -> Kernel { return fn; },
                      operands, operands, results, flow};
  };
  table.emplace("dloss.ring_softmax_ce", rule(ringSoftmaxCE, 5, 4));
  // The backward ops' result 0 (d rows) has the shape of operand 0 (rows).
  table.emplace("dloss.ring_softmax_ce_grad",
                rule(ringSoftmaxCEGrad, 9, 3, ShapeFlow::Operand0));
  table.emplace("dloss.ring_sigmoid_pairs", rule(ringSigmoidPairs, 5, 2));
  table.emplace("dloss.ring_sigmoid_pairs_grad",
                rule(ringSigmoidPairsGrad, 7, 4, ShapeFlow::Operand0));
  table.emplace("dloss.sharded_softmax", rule(shardedSoftmax, 4, 2));
  table.emplace("dloss.sharded_softmax_grad",
                rule(shardedSoftmaxGrad, 7, 3, ShapeFlow::Operand0));
}

} // namespace dloss
