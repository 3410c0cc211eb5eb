// Tests of the communicators: the c10d engine (Gloo) across real processes on
// loopback (world sizes 1-4, uneven sizes, failures), the single-process
// communicator, and RendezvousOptions::fromEnvironment.
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/support/Error.h"
#include "test/runtime/MultiProcess.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace {

using dloss::Communicator;
using dloss::Reduction;
using dloss::RendezvousOptions;
using namespace dloss::test;

//===----------------------------------------------------------------------===//
// Rank-dependent data and the single-process reference
//===----------------------------------------------------------------------===//

// Uneven per-rank batch sizes, as a last batch or filtered data give.
std::vector<int64_t> unevenSizes(int worldSize) {
  static const int64_t sizes[] = {5, 3, 7, 1};
  return std::vector<int64_t>(sizes, sizes + worldSize);
}

// Small integers (exact in every dtype) whose element-wise maximum and
// minimum come from different ranks at different positions.
at::Tensor rankData(int rank, at::IntArrayRef shape, at::ScalarType type) {
  at::Tensor index = at::arange(c10::multiply_integers(shape), at::kLong);
  at::Tensor values = (index * (2 * rank + 3) + 5 * rank).remainder(11) - 5;
  return values.reshape(shape).to(type);
}

void expectTensor(const at::Tensor &actual, const at::Tensor &expected,
                  const std::string &what) {
  bool sameShape = actual.sizes() == expected.sizes();
  bool sameType = actual.scalar_type() == expected.scalar_type();
  bool sameValues = false;
  if (sameShape && sameType)
    sameValues = at::isFloatingType(actual.scalar_type())
                     ? at::allclose(actual, expected, 1e-6, 1e-6)
                     : at::equal(actual, expected);
  CHILD_CHECK(sameValues, what << ": got " << actual.sizes() << " "
                               << actual.scalar_type() << "\n"
                               << actual << "\nexpected " << expected.sizes()
                               << " " << expected.scalar_type() << "\n"
                               << expected);
}

at::Tensor reduceReference(const std::vector<at::Tensor> &pieces,
                           Reduction op) {
  at::Tensor stacked = at::stack(pieces);
  switch (op) {
  case Reduction::Sum:
    return stacked.sum(0).to(pieces[0].scalar_type());
  case Reduction::Mean:
    return stacked.mean(0);
  case Reduction::Max:
    return std::get<0>(stacked.max(0));
  case Reduction::Min:
    return std::get<0>(stacked.min(0));
  }
  return {};
}

//===----------------------------------------------------------------------===//
// Collectives, world sizes 1-4
//===----------------------------------------------------------------------===//

TEST(ProcessGroupCommunicatorTest, AllGatherUnevenAxis0) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      int rank = comm.rank();
      std::vector<int64_t> sizes = unevenSizes(n);
      at::Tensor input = rankData(rank, {sizes[rank], 4}, at::kFloat);
      at::Tensor before = input.clone();
      at::Tensor gathered = comm.allGather(input, 0, sizes);

      std::vector<at::Tensor> pieces;
      for (int r = 0; r < n; ++r)
        pieces.push_back(rankData(r, {sizes[r], 4}, at::kFloat));
      expectTensor(gathered, at::cat(pieces, 0), "allGather axis 0");
      expectTensor(input, before, "allGather left its input alone");

      // A rank with an empty shard (filtered data) still takes part.
      std::vector<int64_t> withEmpty = sizes;
      withEmpty[n - 1] = 0;
      at::Tensor shard = rankData(rank, {withEmpty[rank], 4}, at::kFloat);
      std::vector<at::Tensor> expected;
      for (int r = 0; r < n; ++r)
        expected.push_back(rankData(r, {withEmpty[r], 4}, at::kFloat));
      expectTensor(comm.allGather(shard, 0, withEmpty), at::cat(expected, 0),
                   "allGather with an empty shard");
    });
}

TEST(ProcessGroupCommunicatorTest, AllGatherUnevenAxis1) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      int rank = comm.rank();
      std::vector<int64_t> sizes = unevenSizes(n);
      for (at::ScalarType type : {at::kDouble, at::kLong, at::kBool}) {
        at::Tensor input = rankData(rank, {2, sizes[rank], 3}, type);
        std::vector<at::Tensor> pieces;
        for (int r = 0; r < n; ++r)
          pieces.push_back(rankData(r, {2, sizes[r], 3}, type));
        at::Tensor expected = at::cat(pieces, 1);
        expectTensor(comm.allGather(input, 1, sizes), expected,
                     std::string("allGather axis 1, ") + c10::toString(type));
        // A negative axis counts from the end.
        expectTensor(comm.allGather(input, -2, sizes), expected,
                     "allGather axis -2");
      }
      // A non-contiguous input (a transposed view) gathers by value.
      at::Tensor transposed = rankData(rank, {sizes[rank], 2}, at::kFloat).t();
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < n; ++r)
        pieces.push_back(rankData(r, {sizes[r], 2}, at::kFloat).t());
      expectTensor(comm.allGather(transposed, 1, sizes), at::cat(pieces, 1),
                   "allGather of a transposed view");
    });
}

void checkAllReduce(Communicator &comm, at::ScalarType type,
                    const std::vector<Reduction> &ops) {
  int n = comm.worldSize();
  at::Tensor input = rankData(comm.rank(), {4, 3}, type);
  at::Tensor before = input.clone();
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < n; ++r)
    pieces.push_back(rankData(r, {4, 3}, type));
  for (Reduction op : ops) {
    at::Tensor reduced = comm.allReduce(input, op);
    expectTensor(reduced, reduceReference(pieces, op),
                 std::string("allReduce ") + dloss::reductionName(op) + " " +
                     c10::toString(type));
    expectTensor(input, before, "allReduce left its input alone");
  }
}

TEST(ProcessGroupCommunicatorTest, AllReduceFloat) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [](Communicator &comm) {
      checkAllReduce(
          comm, at::kFloat,
          {Reduction::Sum, Reduction::Mean, Reduction::Max, Reduction::Min});
      checkAllReduce(comm, at::kDouble, {Reduction::Mean});
    });
}

TEST(ProcessGroupCommunicatorTest, AllReduceInt64) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [](Communicator &comm) {
      checkAllReduce(comm, at::kLong,
                     {Reduction::Sum, Reduction::Max, Reduction::Min});
      // Integer Mean is rejected before anything moves, on every rank alike,
      // and leaves the communicator usable.
      at::Tensor ints = rankData(comm.rank(), {2}, at::kLong);
      bool threw = false;
      try {
        comm.allReduce(ints, Reduction::Mean);
      } catch (const dloss::Error &e) {
        threw = true;
        CHILD_CHECK(std::string(e.what()).find("Mean") != std::string::npos,
                    "unexpected message: " << e.what());
        CHILD_CHECK(e.rank() == comm.rank(), "the error names no rank");
      }
      CHILD_CHECK(threw, "integer Mean did not raise dloss::Error");
      checkAllReduce(comm, at::kLong, {Reduction::Sum});
    });
}

// Non-integer values, so that a float sum depends on its order and a wrong
// block or a dropped contribution cannot cancel out.
at::Tensor fractionalData(int rank, at::IntArrayRef shape,
                          at::ScalarType type) {
  at::Tensor index =
      at::arange(c10::multiply_integers(shape), at::kDouble).reshape(shape);
  return (rankData(rank, shape, at::kDouble) * 0.37 + index * 0.011 +
          0.123 * rank)
      .to(type);
}

// `op` of every rank's `data(r)`, reduced in double (exact for the small
// integers of the integer cases), then rank `rank`'s slice of `dim`.
at::Tensor reduceScatterReference(const std::function<at::Tensor(int)> &data,
                                  int worldSize, Reduction op, int64_t dim,
                                  const std::vector<int64_t> &sizes, int rank) {
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < worldSize; ++r)
    pieces.push_back(data(r).to(at::kDouble));
  at::Tensor reduced = reduceReference(pieces, op);
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r)
    offset += sizes[r];
  return reduced.narrow(dim, offset, sizes[rank]).to(data(0).scalar_type());
}

// Exact for integers; relative 1e-6 (float) or 1e-12 (double) otherwise,
// against the largest magnitude so that sums near zero compare sensibly.
void expectReduced(const at::Tensor &actual, const at::Tensor &expected,
                   const std::string &what) {
  bool same = actual.sizes() == expected.sizes() &&
              actual.scalar_type() == expected.scalar_type();
  if (same && at::isFloatingType(actual.scalar_type())) {
    double tolerance = actual.scalar_type() == at::kFloat ? 1e-6 : 1e-12;
    double scale =
        expected.numel() ? expected.abs().max().item<double>() + 1.0 : 1.0;
    same = at::allclose(actual, expected, tolerance, tolerance * scale);
  } else if (same) {
    same = at::equal(actual, expected);
  }
  CHILD_CHECK(same, what << ": got " << actual.sizes() << " "
                         << actual.scalar_type() << "\n"
                         << actual << "\nexpected " << expected.sizes() << " "
                         << expected.scalar_type() << "\n"
                         << expected);
}

// Per-rank sizes for reduceScatter: uneven, one rank empty, and all rows on
// the last rank.
std::vector<std::vector<int64_t>> scatterSizes(int n) {
  std::vector<std::vector<int64_t>> cases = {unevenSizes(n)};
  std::vector<int64_t> withEmpty = unevenSizes(n);
  withEmpty[n / 2] = 0;
  cases.push_back(withEmpty);
  if (n > 1) {
    std::vector<int64_t> lastOnly(n, 0);
    lastOnly[n - 1] = 4;
    cases.push_back(lastOnly);
  }
  return cases;
}

// One reduceScatter checked against the local reference: result, input left
// alone, and exactly one collective counted.
void checkReduceScatter(Communicator &comm,
                        const std::function<at::Tensor(int)> &data,
                        Reduction op, int64_t axis,
                        const std::vector<int64_t> &sizes,
                        const std::string &what) {
  int n = comm.worldSize();
  at::Tensor input = data(comm.rank());
  at::Tensor before = input.clone();
  int64_t dim = axis < 0 ? axis + input.dim() : axis;
  int64_t started = comm.collectivesStarted();
  at::Tensor result = comm.reduceScatter(input, op, axis, sizes);
  std::string name = what + " " + dloss::reductionName(op) + " axis " +
                     std::to_string(axis) + " sizes " +
                     c10::str(at::IntArrayRef(sizes));
  CHILD_CHECK(comm.collectivesStarted() == started + 1,
              name << " counted " << comm.collectivesStarted() - started
                   << " collectives, expected 1");
  expectReduced(result,
                reduceScatterReference(data, n, op, dim, sizes, comm.rank()),
                name);
  CHILD_CHECK(result.is_contiguous(), name << ": result not contiguous");
  CHILD_CHECK(at::equal(input, before), name << ": the input changed");
}

TEST(ProcessGroupCommunicatorTest, ReduceScatterUneven) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      for (const std::vector<int64_t> &sizes : scatterSizes(n)) {
        int64_t total = 0;
        for (int64_t size : sizes)
          total += size;
        for (at::ScalarType type : {at::kFloat, at::kDouble}) {
          std::string what = c10::toString(type);
          for (Reduction op : {Reduction::Sum, Reduction::Mean}) {
            checkReduceScatter(
                comm,
                [&](int r) {
                  return fractionalData(r, {total, 3}, type);
                },
                op, 0, sizes, what);
            checkReduceScatter(
                comm,
                [&](int r) {
                  return fractionalData(r, {2, total, 5}, type);
                },
                op, 1, sizes, what);
          }
        }
        for (at::ScalarType type : {at::kLong, at::kInt}) {
          std::string what = c10::toString(type);
          checkReduceScatter(
              comm,
              [&](int r) {
                return rankData(r, {total, 4}, type);
              },
              Reduction::Sum, 0, sizes, what);
          checkReduceScatter(
              comm,
              [&](int r) {
                return rankData(r, {3, total}, type);
              },
              Reduction::Sum, 1, sizes, what);
          // The ring combines with max and min as well.
          for (Reduction op : {Reduction::Max, Reduction::Min})
            checkReduceScatter(
                comm,
                [&](int r) {
                  return rankData(r, {2, total}, type);
                },
                op, -1, sizes, what);
        }
        // A non-contiguous input (a transposed view) reduces by value.
        checkReduceScatter(
            comm,
            [&](int r) {
              return fractionalData(r, {4, total}, at::kFloat).t();
            },
            Reduction::Sum, 0, sizes, "transposed float");
        // Nothing to move at all (the other dimension is empty): still one
        // collective on every rank.
        checkReduceScatter(
            comm,
            [&](int r) {
              return rankData(r, {total, 0}, at::kFloat);
            },
            Reduction::Sum, 0, sizes, "empty float");
      }
    });
}

// Large blocks (several MiB each) go through the ring in full.
TEST(ProcessGroupCommunicatorTest, ReduceScatterLargeBlocks) {
  for (int n : {2, 3})
    runGloo(n, [n](Communicator &comm) {
      std::vector<int64_t> sizes = {1000, 700, 1300};
      sizes.resize(n);
      int64_t total = 0;
      for (int64_t size : sizes)
        total += size;
      checkReduceScatter(
          comm,
          [&](int r) {
            return fractionalData(r, {total, 1024}, at::kFloat);
          },
          Reduction::Mean, 0, sizes, "large float");
    });
}

// Deferred reductions (a plan's loss value) ride on the next all-gather
// along axis 0: one collective for both, the gather's result unchanged, and
// each reduction's result the one allReduce gives, 0-d, of its dtype, on
// every rank. flushReductions completes them alone; dropped ones never
// complete; what is not a 0-d float (and everything on one rank) reduces
// at once.
TEST(ProcessGroupCommunicatorTest, DeferredReductionsRideOnTheNextAllGather) {
  for (int n = 1; n <= 3; ++n)
    runGloo(n, [n](Communicator &comm) {
      const int r = comm.rank();
      const std::vector<Reduction> ops = {Reduction::Sum, Reduction::Mean,
                                          Reduction::Max, Reduction::Min};
      std::vector<at::Tensor> inputs, got(ops.size());
      for (size_t k = 0; k < ops.size(); ++k) {
        // Quarters: every order of summing them gives the same bits.
        inputs.push_back(
            at::scalar_tensor(1.5 * r - 0.25 * static_cast<double>(k * r * r),
                              k % 2 ? at::kDouble : at::kFloat));
        comm.deferReduction(inputs[k], ops[k],
                            [&got, k](at::Tensor t) { got[k] = t; });
      }
      std::vector<int64_t> sizes;
      for (int q = 0; q < n; ++q)
        sizes.push_back(q + 1);
      at::Tensor rows = rankData(r, {r + 1, 3}, at::kFloat);
      const int64_t before = comm.collectivesStarted();
      at::Tensor all = comm.allGather(rows, 0, sizes);
      if (n > 1)
        CHILD_CHECK(comm.collectivesStarted() - before == 1,
                    "the deferred reductions took a collective of their own");
      std::vector<at::Tensor> pieces;
      for (int q = 0; q < n; ++q)
        pieces.push_back(rankData(q, {q + 1, 3}, at::kFloat));
      CHILD_CHECK(at::equal(all, at::cat(pieces)),
                  "the all-gather's rows changed");
      for (size_t k = 0; k < ops.size(); ++k) {
        CHILD_CHECK(got[k].defined(), "reduction " << k << " never completed");
        at::Tensor expected = comm.allReduce(inputs[k], ops[k]);
        CHILD_CHECK(got[k].dim() == 0 &&
                        got[k].scalar_type() == inputs[k].scalar_type() &&
                        at::equal(got[k], expected),
                    "reduction " << k << " gave " << got[k] << ", not "
                                 << expected);
      }

      // Flushed alone, in one collective.
      at::Tensor flushed;
      comm.deferReduction(at::scalar_tensor(r + 1.0, at::kDouble),
                          Reduction::Sum,
                          [&flushed](at::Tensor t) { flushed = t; });
      const int64_t beforeFlush = comm.collectivesStarted();
      comm.flushReductions();
      CHILD_CHECK(comm.collectivesStarted() - beforeFlush == (n > 1 ? 1 : 0),
                  "the flush is not one collective");
      CHILD_CHECK(flushed.defined() &&
                      flushed.item<double>() == n * (n + 1) / 2.0,
                  "the flushed sum is wrong");
      comm.flushReductions(); // nothing pending: nothing moves
      CHILD_CHECK(comm.collectivesStarted() - beforeFlush == (n > 1 ? 1 : 0),
                  "an empty flush moved something");

      // Dropped: a later all-gather carries nothing of it.
      bool called = false;
      comm.deferReduction(at::scalar_tensor(1.0), Reduction::Sum,
                          [&called](at::Tensor) { called = true; });
      comm.dropReductions();
      comm.allGather(rows, 0, sizes);
      CHILD_CHECK(called == (n == 1), "a dropped reduction completed");

      // A vector reduces at once.
      at::Tensor vector;
      comm.deferReduction(at::ones({2}), Reduction::Sum,
                          [&vector](at::Tensor t) { vector = t; });
      CHILD_CHECK(vector.defined() && vector[0].item<float>() == n,
                  "a vector's reduction was deferred");
    });
}

TEST(ProcessGroupCommunicatorTest, BroadcastFromNonZeroRoot) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      for (int root : {n - 1, n / 2}) {
        // Only the root's values matter; the others give the shape.
        at::Tensor input = comm.rank() == root
                               ? rankData(root, {3, 5}, at::kFloat)
                               : at::full({3, 5}, 99.0f);
        at::Tensor before = input.clone();
        expectTensor(comm.broadcast(input, root),
                     rankData(root, {3, 5}, at::kFloat),
                     "broadcast from root " + std::to_string(root));
        expectTensor(input, before, "broadcast left its input alone");
      }
    });
}

// An empty tensor moves nothing, yet counts as one collective on every rank,
// so the ranks' numbering stays in step.
TEST(ProcessGroupCommunicatorTest,
     EmptyAllReduceAndBroadcastAreStillCollectives) {
  for (int n = 1; n <= 3; ++n)
    runGloo(n, [n](Communicator &comm) {
      at::Tensor empty = at::zeros({0, 4}, at::kFloat);
      int64_t started = comm.collectivesStarted();
      at::Tensor reduced = comm.allReduce(empty, Reduction::Mean);
      CHILD_CHECK(reduced.sizes() == empty.sizes() && reduced.is_contiguous(),
                  "allReduce of an empty tensor changed its shape");
      at::Tensor broadcast = comm.broadcast(empty, n - 1);
      CHILD_CHECK(broadcast.sizes() == empty.sizes(),
                  "broadcast of an empty tensor changed its shape");
      CHILD_CHECK(comm.collectivesStarted() == started + 2,
                  "two empty collectives counted "
                      << comm.collectivesStarted() - started);
      // The ranks are still in step: a real collective follows.
      expectTensor(comm.allReduce(at::ones({2}), Reduction::Sum),
                   at::full({2}, static_cast<float>(n)),
                   "allReduce after the empty ones");
    });
}

TEST(ProcessGroupCommunicatorTest, RingShiftWithDifferentShapes) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      int rank = comm.rank();
      std::vector<int64_t> sizes = unevenSizes(n);
      auto shapeOf = [&](int r) {
        return std::vector<int64_t>{sizes[r], 2 + r};
      };
      for (int64_t shift : {int64_t{1}, int64_t{-1}, int64_t{2}, int64_t{n + 1},
                            int64_t{-2 * n - 1}}) {
        int source = static_cast<int>(((rank - shift) % n + n) % n);
        for (at::ScalarType type : {at::kFloat, at::kBool}) {
          at::Tensor input = rankData(rank, shapeOf(rank), type);
          expectTensor(comm.ringShift(input, shift),
                       rankData(source, shapeOf(source), type),
                       "ringShift by " + std::to_string(shift) + " " +
                           c10::toString(type));
        }
      }
      // Ranks whose tensor is empty send and receive shapes only.
      at::Tensor maybeEmpty = rankData(rank, {rank % 2, 3}, at::kFloat);
      int source = (rank - 1 + n) % n;
      expectTensor(comm.ringShift(maybeEmpty, 1),
                   rankData(source, {source % 2, 3}, at::kFloat),
                   "ringShift of possibly empty tensors");
    });
}

TEST(ProcessGroupCommunicatorTest, AllGatherInts) {
  for (int n = 1; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      int64_t r = comm.rank();
      std::vector<int64_t> gathered =
          comm.allGatherInts({r, 10 * r, -r, int64_t{1} << 40});
      std::vector<int64_t> expected;
      for (int64_t q = 0; q < n; ++q)
        expected.insert(expected.end(), {q, 10 * q, -q, int64_t{1} << 40});
      CHILD_CHECK(gathered == expected, "allGatherInts gave a wrong result");
      CHILD_CHECK(comm.allGatherInts({}).empty(),
                  "allGatherInts of nothing gave something");
    });
}

TEST(ProcessGroupCommunicatorTest, SendRecvPairs) {
  for (int n = 2; n <= 4; ++n)
    runGloo(n, [n](Communicator &comm) {
      int rank = comm.rank();
      int next = (rank + 1) % n;
      int previous = (rank - 1 + n) % n;
      // A ring of transfers, receives posted first; two tags in flight.
      at::Tensor fromPrevious = at::empty({3, 4}, at::kFloat);
      at::Tensor longFromPrevious = at::empty({6}, at::kLong);
      auto receive = comm.recv(fromPrevious, previous, 7);
      auto receiveLong = comm.recv(longFromPrevious, previous, 8);
      at::Tensor outgoing = rankData(rank, {3, 4}, at::kFloat);
      auto sendLong = comm.send(rankData(rank, {6}, at::kLong), next, 8);
      auto send = comm.send(outgoing, next, 7);
      receive->wait();
      receiveLong->wait();
      send->wait();
      sendLong->wait();
      expectTensor(fromPrevious, rankData(previous, {3, 4}, at::kFloat),
                   "recv tag 7");
      expectTensor(longFromPrevious, rankData(previous, {6}, at::kLong),
                   "recv tag 8");

      // Pairs (0,1), (2,3): a transposed (non-contiguous) bool target is
      // staged and copied back.
      int partner = rank ^ 1;
      if (partner < n) {
        at::Tensor target = at::zeros({4, 2}, at::kBool).t();
        auto in = comm.recv(target, partner, 0);
        auto out = comm.send(rankData(rank, {2, 4}, at::kBool), partner, 0);
        in->wait();
        out->wait();
        expectTensor(target, rankData(partner, {2, 4}, at::kBool),
                     "recv into a transposed bool tensor");
      }
    });
}

//===----------------------------------------------------------------------===//
// Failures
//===----------------------------------------------------------------------===//

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// World 3, rank 2 never starts: both survivors fail at the deadline, naming
// rank 2.
TEST(ProcessGroupCommunicatorTest, RendezvousNamesTheMissingRank) {
  constexpr auto timeout = std::chrono::seconds(3);
  int port = freePort();
  Clock::time_point start = Clock::now();
  auto outcomes = runChildren({0, 1}, [&](int rank) {
    Clock::time_point joined = Clock::now();
    try {
      dloss::connectProcessGroup(loopbackOptions(port, rank, 3, timeout));
    } catch (const dloss::Error &e) {
      double elapsed = secondsSince(joined);
      std::fprintf(stderr, "[rank %d] rendezvous failed after %.2f s: %s\n",
                   rank, elapsed, e.what());
      std::string message = e.what();
      CHILD_CHECK(message.find("rank 2 never joined") != std::string::npos,
                  "the error does not name rank 2: " << message);
      CHILD_CHECK(message.find("DLOSS_TIMEOUT_S") != std::string::npos,
                  "the error says not what to do: " << message);
      CHILD_CHECK(e.rank() == rank, "the error names no rank");
      CHILD_CHECK(elapsed > 2.5 && elapsed < 3.0 + 5.0,
                  "failed after " << elapsed << " s, deadline 3 s");
      return;
    }
    CHILD_CHECK(false, "the rendezvous of 2 out of 3 ranks succeeded");
  });
  expectAllSucceeded(outcomes, "missing rank 2");
  EXPECT_LT(secondsSince(start), 3.0 + 10.0);
}

// Rank 0 hosts the store; when it never starts, the others name it.
TEST(ProcessGroupCommunicatorTest, RendezvousNamesAMissingRankZero) {
  constexpr auto timeout = std::chrono::seconds(3);
  int port = freePort();
  auto outcomes = runChildren({1}, [&](int rank) {
    Clock::time_point joined = Clock::now();
    try {
      dloss::connectProcessGroup(loopbackOptions(port, rank, 2, timeout));
    } catch (const dloss::Error &e) {
      double elapsed = secondsSince(joined);
      std::fprintf(stderr, "[rank %d] rendezvous failed after %.2f s: %s\n",
                   rank, elapsed, e.what());
      std::string message = e.what();
      CHILD_CHECK(message.find("rank 0 never joined") != std::string::npos,
                  "the error does not name rank 0: " << message);
      // At the deadline, not after TCPStore's own retries (which overshot
      // it by up to 4 s before the store's address was polled).
      CHILD_CHECK(elapsed < 3.0 + 2.0,
                  "failed after " << elapsed << " s, deadline 3 s");
      return;
    }
    CHILD_CHECK(false, "the rendezvous without rank 0 succeeded");
  });
  expectAllSucceeded(outcomes, "missing rank 0");
}

// Reserved ports are never handed out twice, and no plain bind takes them,
// so jobs started at once never meet in one store.
TEST(ReserveLoopbackPortTest, PortsStayReservedAndDistinct) {
  std::vector<int> ports;
  for (int i = 0; i < 32; ++i)
    ports.push_back(dloss::reserveLoopbackPort());
  std::vector<int> sorted = ports;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  for (int port : ports) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_NE(
        ::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)), 0)
        << "port " << port << " was bound although reserved";
    ::close(fd);
  }
}

// A launcher hosts the store (torchrun's agent, TORCHELASTIC_USE_AGENT_STORE):
// every rank is a client, rank 0 included, and a second attempt on the same
// store (TORCHELASTIC_RESTART_COUNT=1) does not read the first one's keys.
TEST(ProcessGroupCommunicatorTest, RanksMeetInALaunchersStore) {
  int port = freePort();
  constexpr auto timeout = std::chrono::seconds(30);
  auto outcomes = runChildren({-1, 0, 1}, [&](int rank) {
    c10d::TCPStoreOptions storeOptions;
    storeOptions.port = static_cast<std::uint16_t>(port);
    storeOptions.isServer = rank < 0;
    storeOptions.numWorkers = 3;
    storeOptions.waitWorkers = false;
    storeOptions.timeout = timeout;
    c10d::TCPStore launcher("127.0.0.1", storeOptions);
    if (rank < 0) { // the launcher: up until both ranks are done
      launcher.wait({"test/done/0", "test/done/1"});
      return;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      dloss::RendezvousOptions options =
          loopbackOptions(port, rank, 2, timeout);
      options.agentStore = true;
      options.restartCount = attempt;
      auto comm = dloss::connectProcessGroup(options);
      at::Tensor sum =
          comm->allReduce(at::full({3}, rank + 1.0 + attempt), Reduction::Sum);
      CHILD_CHECK(sum.eq(3.0 + 2 * attempt).all().item<bool>(),
                  "attempt " << attempt << ": the sum is wrong");
    }
    launcher.set("test/done/" + std::to_string(rank), {1});
  });
  expectAllSucceeded(outcomes, "a launcher's store");
}

// TORCHELASTIC_USE_AGENT_STORE without a launcher's store: each rank says
// that the launcher's store is unreachable, at the deadline.
TEST(ProcessGroupCommunicatorTest, AMissingLaunchersStoreIsNamed) {
  int port = freePort();
  constexpr auto timeout = std::chrono::seconds(2);
  auto outcomes = runChildren({0, 1}, [&](int rank) {
    dloss::RendezvousOptions options = loopbackOptions(port, rank, 2, timeout);
    options.agentStore = true;
    try {
      dloss::connectProcessGroup(options);
    } catch (const dloss::Error &e) {
      std::string message = e.what();
      CHILD_CHECK(
          message.find("launcher's rendezvous store") != std::string::npos &&
              message.find("TORCHELASTIC_USE_AGENT_STORE") != std::string::npos,
          "the error names not the launcher's store: " << message);
      return;
    }
    CHILD_CHECK(false, "connected without any store");
  });
  expectAllSucceeded(outcomes, "no launcher's store");
}

// Runs `collective` on ranks 0 and 1 of a world of 3 while rank 2 misbehaves
// (`rank2`: dies or stalls), and checks on the survivors that the collective
// raises a dloss::Error within [minSeconds, maxSeconds] containing one of
// `needles`, after which the communicator refuses further calls at once.
void expectCollectiveFailure(
    std::chrono::milliseconds timeout, const std::function<void()> &rank2,
    const std::function<void(Communicator &)> &collective,
    const std::string &collectiveName, const std::vector<std::string> &needles,
    double minSeconds, double maxSeconds, std::optional<int> rank2Signal) {
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm =
        dloss::connectProcessGroup(loopbackOptions(port, rank, 3, timeout));
    // One collective that works, so the mesh is surely up.
    comm->allReduce(at::ones({4}), Reduction::Sum);
    if (rank == 2) {
      rank2();
      return;
    }
    Clock::time_point start = Clock::now();
    try {
      collective(*comm);
    } catch (const dloss::Error &e) {
      double elapsed = secondsSince(start);
      std::fprintf(stderr, "[rank %d] %s failed after %.2f s: %s\n", rank,
                   collectiveName.c_str(), elapsed, e.what());
      std::string message = e.what();
      bool saysWhatToDo = false;
      for (const std::string &needle : needles)
        saysWhatToDo |= message.find(needle) != std::string::npos;
      CHILD_CHECK(
          message.find(collectiveName) != std::string::npos && saysWhatToDo,
          "the error does not say what failed and what to do: " << message);
      CHILD_CHECK(e.rank() == rank, "the error names no rank");
      CHILD_CHECK(elapsed >= minSeconds && elapsed <= maxSeconds,
                  "failed after " << elapsed << " s, expected " << minSeconds
                                  << " to " << maxSeconds);

      Clock::time_point retry = Clock::now();
      try {
        comm->allGatherInts({1});
      } catch (const dloss::Error &again) {
        CHILD_CHECK(std::string(again.what()).find("unusable") !=
                        std::string::npos,
                    "unexpected second error: " << again.what());
        CHILD_CHECK(secondsSince(retry) < 1.0, "the second call was slow");
        return;
      }
      CHILD_CHECK(false, "the broken communicator accepted another call");
    }
    CHILD_CHECK(false, collectiveName << " succeeded without rank 2");
  });
  ASSERT_EQ(outcomes.size(), 3u);
  expectAllSucceeded({outcomes[0], outcomes[1]}, "survivor");
  if (rank2Signal) {
    EXPECT_EQ(outcomes[2].signal, rank2Signal) << describe(outcomes[2]);
  }
}

void dieAbruptly() {
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::raise(SIGKILL);
}

// A peer dies (SIGKILL, no goodbye) while the others are in a collective:
// they fail fast, long before the 60 s deadline.
TEST(ProcessGroupCommunicatorTest, PeerDeathFailsAllReduceQuickly) {
  expectCollectiveFailure(
      std::chrono::seconds(60), dieAbruptly,
      [](Communicator &comm) {
        comm.allReduce(at::ones({1 << 16}), Reduction::Sum);
      },
      "allReduce", {"other ranks' logs"}, 0.0, 15.0, SIGKILL);
}

TEST(ProcessGroupCommunicatorTest, PeerDeathFailsRingShiftQuickly) {
  // Ranks 0 and 1 receive from 2 and 0: rank 0 waits on the dead rank.
  expectCollectiveFailure(
      std::chrono::seconds(60), dieAbruptly,
      [](Communicator &comm) {
        comm.ringShift(at::ones({3, 2}), 1);
        comm.ringShift(at::ones({3, 2}), 1);
      },
      "ringShift", {"other ranks' logs"}, 0.0, 15.0, SIGKILL);
}

TEST(ProcessGroupCommunicatorTest, PeerDeathFailsReduceScatterQuickly) {
  // Rank 0 receives from the dead rank 2 in the ring's first step; rank 1
  // sends to it.
  expectCollectiveFailure(
      std::chrono::seconds(60), dieAbruptly,
      [](Communicator &comm) {
        for (int i = 0; i < 2; ++i)
          comm.reduceScatter(at::ones({6, 1 << 14}), Reduction::Sum, 0,
                             {2, 2, 2});
      },
      "reduceScatter", {"other ranks' logs"}, 0.0, 15.0, SIGKILL);
}

// A peer that stays alive but never calls the collective: the others fail at
// the deadline and are told about DLOSS_TIMEOUT_S.
TEST(ProcessGroupCommunicatorTest, StalledPeerTimesOutAllReduce) {
  expectCollectiveFailure(
      std::chrono::seconds(3),
      [] { std::this_thread::sleep_for(std::chrono::seconds(6)); },
      [](Communicator &comm) { comm.allReduce(at::ones({8}), Reduction::Sum); },
      "allReduce", {"DLOSS_TIMEOUT_S"}, 2.5, 3.0 + 5.0, std::nullopt);
}

TEST(ProcessGroupCommunicatorTest, StalledPeerTimesOutRingShift) {
  // Rank 0 waits on rank 2 and times out; rank 1 waits on rank 0's data and
  // may see rank 0 give up (connection closed) at the same moment.
  expectCollectiveFailure(
      std::chrono::seconds(3),
      [] { std::this_thread::sleep_for(std::chrono::seconds(6)); },
      [](Communicator &comm) {
        comm.ringShift(at::ones({3, 2}), 1);
        comm.ringShift(at::ones({3, 2}), 1);
      },
      "ringShift", {"DLOSS_TIMEOUT_S", "other ranks' logs"}, 2.5, 3.0 + 5.0,
      std::nullopt);
}

TEST(ProcessGroupCommunicatorTest, StalledPeerTimesOutReduceScatter) {
  expectCollectiveFailure(
      std::chrono::seconds(3),
      [] { std::this_thread::sleep_for(std::chrono::seconds(6)); },
      [](Communicator &comm) {
        for (int i = 0; i < 2; ++i)
          comm.reduceScatter(at::ones({3, 4}), Reduction::Sum, 0, {1, 1, 1});
      },
      "reduceScatter", {"DLOSS_TIMEOUT_S", "other ranks' logs"}, 2.5, 3.0 + 5.0,
      std::nullopt);
}

// On Gloo an all-gather is a direct exchange with every peer (sends and
// receives, not Gloo's collective): a peer that dies, or never comes, ends
// it as it ends a collective.
TEST(ProcessGroupCommunicatorTest, PeerDeathFailsAllGatherQuickly) {
  expectCollectiveFailure(
      std::chrono::seconds(60), dieAbruptly,
      [](Communicator &comm) {
        for (int i = 0; i < 2; ++i)
          comm.allGather(at::ones({2, 3}), 0, {2, 2, 2});
      },
      "allGather", {"other ranks' logs"}, 0.0, 15.0, SIGKILL);
}

TEST(ProcessGroupCommunicatorTest, StalledPeerTimesOutAllGather) {
  expectCollectiveFailure(
      std::chrono::seconds(3),
      [] { std::this_thread::sleep_for(std::chrono::seconds(6)); },
      [](Communicator &comm) {
        comm.allGather(at::ones({2, 3}), 0, {2, 2, 2});
      },
      "allGather", {"DLOSS_TIMEOUT_S", "other ranks' logs"}, 2.5, 3.0 + 5.0,
      std::nullopt);
}

// A peer that records its exit and then hangs on its way out (as a process
// whose exit joins a stuck thread does) keeps its connections open, so
// nothing on the wire tells the ranks waiting for it in an exchange (here
// the all-gather's sends and receives) to stop: they learn it from the
// peers' states, checked while they wait, long before their 60 s deadline,
// and name it.
TEST(ProcessGroupCommunicatorTest, AnExchangeStopsWaitingForAPeerThatLeft) {
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm = dloss::connectProcessGroup(
        loopbackOptions(port, rank, 3, std::chrono::seconds(60)));
    comm->allReduce(at::ones({4}), Reduction::Sum);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      comm->recordExit("exited after raising ValueError('bad batch')", true);
      std::this_thread::sleep_for(std::chrono::seconds(12));
      return;
    }
    Clock::time_point start = Clock::now();
    try {
      for (int i = 0; i < 2; ++i)
        comm->allGather(at::ones({2, 3}), 0, {2, 2, 2});
    } catch (const dloss::Error &e) {
      double elapsed = secondsSince(start);
      std::string message = e.what();
      CHILD_CHECK(message.find("allGather") != std::string::npos &&
                      message.find("bad batch") != std::string::npos,
                  "the error names not rank 2's exit: " << message);
      CHILD_CHECK(elapsed < 10.0, "stopped waiting after " << elapsed << " s");
      return;
    }
    CHILD_CHECK(false, "the all-gather succeeded without rank 2");
  });
  expectAllSucceeded(outcomes, "a peer that left");
}

// Bad arguments are dloss::Errors raised before any communication, so the
// communicator stays usable.
TEST(ProcessGroupCommunicatorTest, RejectsBadArgumentsWithoutBreaking) {
  runGloo(2, [](Communicator &comm) {
    int rank = comm.rank();
    auto expectError = [&](const std::function<void()> &call,
                           const std::string &needle) {
      try {
        call();
      } catch (const dloss::Error &e) {
        CHILD_CHECK(std::string(e.what()).find(needle) != std::string::npos,
                    "expected '" << needle << "' in: " << e.what());
        return;
      }
      CHILD_CHECK(false, "no dloss::Error mentioning '" << needle << "'");
    };
    at::Tensor x = at::ones({rank + 2, 3});
    expectError([&] { comm.allGather(x, 0, {rank + 2}); },
                "expected one per rank");
    expectError([&] { comm.allGather(x, 0, {9, 9}); }, "sizes[");
    expectError([&] { comm.allGather(x, 2, {2, 3}); }, "out of range");
    expectError(
        [&] {
          comm.reduceScatter(x, Reduction::Sum, 0, {1, 5});
        },
        "add up to");
    expectError([&] { comm.broadcast(x, 2); }, "root 2");
    expectError([&] { comm.send(x, rank, 0); }, "not another rank");
    expectError([&] { comm.send(x, 1 - rank, 1 << 30); }, "reserved");
    // Still healthy.
    std::vector<int64_t> sizes = {2, 3};
    expectTensor(comm.allGather(x, 0, sizes), at::ones({5, 3}),
                 "allGather after rejected calls");
  });
}

/// A CPU backend that moves nothing: c10d's Backend refuses every
/// collective it does not override, and this one overrides none.
class NoTransferBackend final : public c10d::Backend {
public:
  NoTransferBackend() : c10d::Backend(/*rank=*/0, /*size=*/1) {}
  const std::string getBackendName() const override { return "gloo"; }
};

TEST(ProcessGroupCommunicatorTest, AGroupOfOneMovesNothingThroughTheGroup) {
  // A group of one rank (torchrun --nproc_per_node 1): every collective is
  // the identity, so none may reach the group's backend (a Gloo collective
  // of one rank still costs a hand-off to its worker thread). Each result
  // is a copy, and each call is still numbered.
  auto outcomes = runChildren({0}, [](int) {
    auto group = c10::make_intrusive<c10d::ProcessGroup>(0, 1);
    group->setBackend(c10::DeviceType::CPU,
                      c10d::ProcessGroup::BackendType::GLOO,
                      c10::make_intrusive<NoTransferBackend>());
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    RendezvousOptions options;
    options.flightDir = "off";
    auto comm = dloss::makeProcessGroupCommunicator(options, nullptr, group);
    CHILD_CHECK(comm->rank() == 0 && comm->worldSize() == 1, "not 0 of 1");
    at::Tensor x = rankData(0, {5, 3}, at::kFloat);
    int64_t before = comm->collectivesStarted();
    std::vector<at::Tensor> results = {
        comm->allGather(x, 0, {5}),
        comm->allGather(x, 1, {3}),
        comm->allReduce(x, Reduction::Sum),
        comm->allReduce(x, Reduction::Mean),
        comm->allReduce(x.to(at::kBFloat16), Reduction::Sum).to(at::kFloat),
        comm->reduceScatter(x, Reduction::Mean, 0, {5}),
        comm->broadcast(x, 0),
        comm->ringShift(x, 1),
    };
    for (const at::Tensor &result : results) {
      expectTensor(result, x, "identity");
      CHILD_CHECK(result.data_ptr() != x.data_ptr(),
                  "a result aliases the input");
    }
    CHILD_CHECK(comm->allGatherInts({3, 4}) == std::vector<int64_t>({3, 4}),
                "allGatherInts is not the identity");
    CHILD_CHECK(comm->collectivesStarted() - before == 9,
                "expected 9 numbered collectives, got "
                    << comm->collectivesStarted() - before);
  });
  expectAllSucceeded(outcomes, "group of one");
}

//===----------------------------------------------------------------------===//
// Single-process communicator
//===----------------------------------------------------------------------===//

TEST(SingleProcessCommunicatorTest, EveryCollectiveIsACopy) {
  auto outcomes = runChildren({0}, [](int) {
    auto comm = dloss::makeSingleProcessCommunicator();
    CHILD_CHECK(comm->rank() == 0 && comm->worldSize() == 1, "not 0 of 1");
    at::Tensor x = rankData(0, {5, 3}, at::kFloat);
    std::vector<at::Tensor> results = {
        comm->allGather(x, 0, {5}),
        comm->allReduce(x, Reduction::Sum),
        comm->allReduce(x, Reduction::Mean),
        comm->allReduce(x, Reduction::Max),
        comm->reduceScatter(x, Reduction::Mean, 0, {5}),
        comm->broadcast(x, 0),
        comm->ringShift(x, 1),
        comm->ringShift(x, -3),
    };
    for (const at::Tensor &result : results) {
      expectTensor(result, x, "identity");
      CHILD_CHECK(!result.is_same(x) && result.data_ptr() != x.data_ptr(),
                  "a result aliases the input");
    }
    CHILD_CHECK(comm->allGatherInts({3, 4}) == std::vector<int64_t>({3, 4}),
                "allGatherInts is not the identity");

    auto expectError = [&](const std::function<void()> &call,
                           const std::string &needle) {
      try {
        call();
      } catch (const dloss::Error &e) {
        CHILD_CHECK(std::string(e.what()).find(needle) != std::string::npos,
                    "expected '" << needle << "' in: " << e.what());
        return;
      }
      CHILD_CHECK(false, "no dloss::Error mentioning '" << needle << "'");
    };
    expectError([&] { comm->send(x, 0, 0); }, "single-process");
    expectError([&] { comm->recv(x, 0, 0); }, "single-process");
    expectError([&] { comm->allReduce(x.to(at::kLong), Reduction::Mean); },
                "integer");
    expectError([&] { comm->allGather(x, 0, {4}); }, "sizes");
    expectError([&] { comm->broadcast(x, 1); }, "root 1");
  });
  expectAllSucceeded(outcomes, "single process");
}

//===----------------------------------------------------------------------===//
// RendezvousOptions::fromEnvironment
//===----------------------------------------------------------------------===//

// Sets (or unsets, with nullptr) the rendezvous variables for one test and
// restores them afterwards.
class RendezvousOptionsTest : public ::testing::Test {
protected:
  static constexpr const char *kVariables[] = {"MASTER_ADDR",
                                               "MASTER_PORT",
                                               "RANK",
                                               "WORLD_SIZE",
                                               "DLOSS_TIMEOUT_S",
                                               "DLOSS_FLIGHT_DIR",
                                               "TORCHELASTIC_USE_AGENT_STORE",
                                               "TORCHELASTIC_RESTART_COUNT"};

  void SetUp() override {
    for (const char *variable : kVariables) {
      const char *value = std::getenv(variable);
      saved.emplace_back(variable, value ? std::optional<std::string>(value)
                                         : std::nullopt);
    }
    clearVariables();
  }

  static void clearVariables() {
    for (const char *variable : kVariables)
      ::unsetenv(variable);
  }

  void TearDown() override {
    for (const auto &[variable, value] : saved) {
      if (value)
        ::setenv(variable.c_str(), value->c_str(), 1);
      else
        ::unsetenv(variable.c_str());
    }
  }

  static void set(const char *variable, const char *value) {
    ::setenv(variable, value, 1);
  }

  // The message of the dloss::Error fromEnvironment raises ("" if none).
  static std::string errorMessage() {
    try {
      RendezvousOptions::fromEnvironment();
    } catch (const dloss::Error &e) {
      return e.what();
    }
    return "";
  }

  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
};

TEST_F(RendezvousOptionsTest, DefaultsToOneProcess) {
  RendezvousOptions options = RendezvousOptions::fromEnvironment();
  EXPECT_EQ(options.masterAddr, "127.0.0.1");
  EXPECT_EQ(options.masterPort, 29500);
  EXPECT_EQ(options.rank, 0);
  EXPECT_EQ(options.worldSize, 1);
  EXPECT_EQ(options.timeout, std::chrono::seconds(300));
  EXPECT_EQ(options.flightDir, "");
  EXPECT_FALSE(options.agentStore);
  EXPECT_EQ(options.restartCount, 0);
}

TEST_F(RendezvousOptionsTest, ReadsTorchrunVariables) {
  set("MASTER_ADDR", "node7");
  set("MASTER_PORT", "12345");
  set("RANK", "3");
  set("WORLD_SIZE", "4");
  set("DLOSS_TIMEOUT_S", "2.5");
  set("DLOSS_FLIGHT_DIR", "/tmp/flights");
  RendezvousOptions options = RendezvousOptions::fromEnvironment();
  EXPECT_EQ(options.masterAddr, "node7");
  EXPECT_EQ(options.masterPort, 12345);
  EXPECT_EQ(options.rank, 3);
  EXPECT_EQ(options.worldSize, 4);
  EXPECT_EQ(options.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(options.flightDir, "/tmp/flights");
  EXPECT_FALSE(options.agentStore);
}

// torchrun's agent (static rendezvous, its default) hosts the store at
// MASTER_PORT and says so; rank 0 must then not try to host one too.
TEST_F(RendezvousOptionsTest, ReadsTorchrunsAgentStore) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_RESTART_COUNT", "3");
  RendezvousOptions options = RendezvousOptions::fromEnvironment();
  EXPECT_TRUE(options.agentStore);
  EXPECT_EQ(options.restartCount, 3);
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  EXPECT_FALSE(RendezvousOptions::fromEnvironment().agentStore);
}

TEST_F(RendezvousOptionsTest, WorldSizeOneNeedsNoRank) {
  set("WORLD_SIZE", "1");
  EXPECT_EQ(RendezvousOptions::fromEnvironment().worldSize, 1);
}

TEST_F(RendezvousOptionsTest, MalformedValuesNameTheVariableAndValue) {
  struct Case {
    const char *variable;
    const char *value;
  };
  for (Case c :
       {Case{"MASTER_PORT", "http"}, Case{"MASTER_PORT", "70000"},
        Case{"MASTER_PORT", "0"}, Case{"MASTER_PORT", "12 "},
        Case{"DLOSS_TIMEOUT_S", "soon"}, Case{"DLOSS_TIMEOUT_S", "0"},
        Case{"DLOSS_TIMEOUT_S", "-5"}, Case{"DLOSS_TIMEOUT_S", "nan"},
        Case{"WORLD_SIZE", "two"}, Case{"WORLD_SIZE", "0"}, Case{"RANK", "1.5"},
        Case{"RANK", "-1"}, Case{"TORCHELASTIC_USE_AGENT_STORE", "yes"},
        Case{"TORCHELASTIC_USE_AGENT_STORE", "true "},
        Case{"TORCHELASTIC_RESTART_COUNT", "-1"},
        Case{"TORCHELASTIC_RESTART_COUNT", "first"}}) {
    clearVariables();
    set("RANK", "0");
    set("WORLD_SIZE", "2");
    set(c.variable, c.value);
    std::string message = errorMessage();
    EXPECT_NE(message.find(c.variable), std::string::npos)
        << c.variable << "=" << c.value << ": " << message;
    EXPECT_NE(message.find(std::string("'") + c.value + "'"), std::string::npos)
        << c.variable << "=" << c.value << ": " << message;
  }
}

TEST_F(RendezvousOptionsTest, RankAndWorldSizeGoTogether) {
  set("RANK", "1");
  EXPECT_NE(errorMessage().find("WORLD_SIZE is not"), std::string::npos);
  ::unsetenv("RANK");
  set("WORLD_SIZE", "4");
  EXPECT_NE(errorMessage().find("RANK is not"), std::string::npos);
  set("RANK", "4");
  std::string message = errorMessage();
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("torchrun"), std::string::npos) << message;
  set("MASTER_ADDR", "");
  set("RANK", "0");
  EXPECT_NE(errorMessage().find("MASTER_ADDR"), std::string::npos);
}

} // namespace
