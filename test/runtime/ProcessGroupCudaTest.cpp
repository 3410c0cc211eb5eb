// The c10d engine on real GPUs, over the group connectProcessGroup builds
// ("cpu:gloo,cuda:nccl", as init_process_group() makes it): CUDA tensors
// through c10d's ProcessGroupNCCL, world size 1 on any GPU machine, 2-4 ranks
// (one GPU each) where several GPUs are visible. These are the scenarios of
// the retired home-made NCCL engine; the CPU side of the same engine (Gloo)
// is CommunicatorTest.cpp's and ReliabilityTest.cpp's, and a tensor on a
// device the group has no backend for is test_collectives.py's.
//
// Every test skips, saying why, where no CUDA device is visible. NCCL refuses
// two ranks on one GPU, so a machine with one GPU runs only the world-size-1
// checks: the multi-rank ones (uneven sizes, point to point between ranks,
// the deadline naming a rank that never arrived) need two or more GPUs.
//
// The test process itself never touches CUDA: ranks are forked children
// (MultiProcess.h), and CUDA cannot be used in a child forked after its
// parent initialised it. Even the device count is probed in a child.
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/support/Error.h"

#include "test/runtime/MultiProcess.h"

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>

namespace {

using dloss::test::CheckFailure;
using dloss::test::ChildOutcome;
using dloss::test::freePort;
using dloss::test::loopbackOptions;
using dloss::test::runChildren;

struct DeviceProbe {
  int count = 0;
  std::string reason; // why none is usable
};

// Counts the visible CUDA devices in a forked child, once.
const DeviceProbe &probeDevices() {
  static const DeviceProbe probe = [] {
    DeviceProbe result;
    int fds[2];
    if (::pipe(fds) != 0) {
      result.reason = "pipe() failed";
      return result;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int count = 0;
      cudaError_t status = cudaGetDeviceCount(&count);
      std::string text = status == cudaSuccess
                             ? std::to_string(count) +
                                   " cudaGetDeviceCount found " +
                                   std::to_string(count) + " devices"
                             : std::string("0 cudaGetDeviceCount failed: ") +
                                   cudaGetErrorString(status);
      ssize_t written = ::write(fds[1], text.data(), text.size());
      (void)written;
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string text;
    char buffer[256];
    ssize_t got;
    while ((got = ::read(fds[0], buffer, sizeof(buffer))) > 0)
      text.append(buffer, static_cast<size_t>(got));
    ::close(fds[0]);
    if (pid > 0)
      ::waitpid(pid, nullptr, 0);
    result.count = std::atoi(text.c_str());
    auto space = text.find(' ');
    result.reason = space == std::string::npos ? "the probe child failed"
                                               : text.substr(space + 1);
    return result;
  }();
  return probe;
}

#define SKIP_WITHOUT_GPUS(needed)                                              \
  do {                                                                         \
    const DeviceProbe &probe_ = probeDevices();                                \
    if (probe_.count < (needed))                                               \
      GTEST_SKIP() << "needs " << (needed)                                     \
                   << " visible CUDA device(s), one per rank (NCCL refuses "   \
                      "two ranks on one GPU); "                                \
                   << probe_.reason;                                           \
  } while (false)

// Runs `body` on `worldSize` forked ranks, rank r on cuda:r (its current
// device, as a training script sets LOCAL_RANK's).
void runOnGpus(int worldSize, std::chrono::milliseconds timeout,
               const std::function<void(dloss::Communicator &, int)> &body) {
  int port = freePort();
  std::vector<int> ranks(worldSize);
  std::iota(ranks.begin(), ranks.end(), 0);
  auto outcomes = runChildren(ranks, [&](int rank) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(rank));
    auto comm = dloss::connectProcessGroup(
        loopbackOptions(port, rank, worldSize, timeout));
    CHILD_CHECK(comm->rank() == rank, "rank() is wrong");
    CHILD_CHECK(comm->worldSize() == worldSize, "worldSize() is wrong");
    CHILD_CHECK(comm->collectivesStarted() == 1,
                "the connection check is collective #1, got "
                    << comm->collectivesStarted());
    body(*comm, rank);
  });
  dloss::test::expectAllSucceeded(outcomes,
                                  "world size " + std::to_string(worldSize));
}

at::Tensor onDevice(const at::Tensor &tensor, int device) {
  return tensor.to(
      at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

bool same(const at::Tensor &a, const at::Tensor &b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.cpu(), b.cpu());
}

// Runs `call` and returns the dloss::Error it raised ("" when none).
template <typename Call> std::string errorOf(Call &&call) {
  try {
    call();
  } catch (const dloss::Error &e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

//===----------------------------------------------------------------------===//
// World size 1
//===----------------------------------------------------------------------===//

// The group moves CPU tensors through Gloo and CUDA ones through NCCL,
// chosen per call by the tensor's device.
TEST(ProcessGroupCuda, WorldOneMovesBothDevices) {
  SKIP_WITHOUT_GPUS(1);
  runOnGpus(1, dloss::test::kCollectiveTimeout,
            [](dloss::Communicator &comm, int device) {
              auto ints = comm.allGatherInts({3, -4, 1LL << 40});
              CHILD_CHECK((ints == std::vector<int64_t>{3, -4, 1LL << 40}),
                          "allGatherInts at world size 1 changed the values");
              at::Tensor cpu = at::arange(4, at::kFloat);
              CHILD_CHECK(same(comm.allReduce(cpu, dloss::Reduction::Sum), cpu),
                          "allReduce of a CPU tensor (Gloo)");
              at::Tensor gpu = onDevice(cpu, device);
              at::Tensor reduced = comm.allReduce(gpu, dloss::Reduction::Sum);
              CHILD_CHECK(reduced.is_cuda() && same(reduced, cpu),
                          "allReduce of a CUDA tensor (NCCL)");
              CHILD_CHECK(comm.collectivesStarted() == 4,
                          "collectives counted: " << comm.collectivesStarted());
            });
}

TEST(ProcessGroupCuda, WorldOneCollectives) {
  SKIP_WITHOUT_GPUS(1);
  runOnGpus(
      1, dloss::test::kCollectiveTimeout,
      [](dloss::Communicator &comm, int device) {
        at::Tensor x =
            onDevice(at::arange(12, at::kFloat).view({3, 4}), device);
        CHILD_CHECK(same(comm.allGather(x, 0, {3}), x), "allGather axis 0");
        CHILD_CHECK(same(comm.allGather(x, -1, {4}), x), "allGather axis -1");
        CHILD_CHECK(same(comm.allGather(x.t(), 0, {4}), x.t()),
                    "allGather of a non-contiguous tensor");
        for (dloss::Reduction op :
             {dloss::Reduction::Sum, dloss::Reduction::Mean,
              dloss::Reduction::Max, dloss::Reduction::Min})
          CHILD_CHECK(same(comm.allReduce(x, op), x),
                      "allReduce " << dloss::reductionName(op));
        at::Tensor ints = onDevice(at::arange(5, at::kLong), device);
        CHILD_CHECK(same(comm.allReduce(ints, dloss::Reduction::Sum), ints),
                    "allReduce of int64");
        at::Tensor half = x.to(at::kBFloat16);
        CHILD_CHECK(same(comm.allReduce(half, dloss::Reduction::Max), half),
                    "allReduce of bfloat16");
        CHILD_CHECK(
            same(comm.reduceScatter(x, dloss::Reduction::Sum, 0, {3}), x),
            "reduceScatter axis 0");
        CHILD_CHECK(
            same(comm.reduceScatter(x, dloss::Reduction::Sum, 1, {4}), x),
            "reduceScatter axis 1");
        CHILD_CHECK(same(comm.broadcast(x, 0), x), "broadcast");
        // Shift 0 modulo the world size: every rank keeps its own.
        CHILD_CHECK(same(comm.ringShift(x, 1), x), "ringShift");
        CHILD_CHECK(same(comm.ringShift(x.t(), -3), x.t()),
                    "ringShift of a non-contiguous tensor");
        at::Tensor flags = x.gt(5);
        CHILD_CHECK(same(comm.ringShift(flags, 1), flags),
                    "ringShift of a bool tensor");
        at::Tensor empty = onDevice(at::empty({0, 7}, at::kDouble), device);
        CHILD_CHECK(same(comm.ringShift(empty, 1), empty),
                    "ringShift of [0, 7]");
        CHILD_CHECK(same(comm.allGather(empty, 0, {0}), empty),
                    "allGather of [0, 7]");
        CHILD_CHECK(comm.collectivesStarted() == 1 + 17,
                    "collectives counted: " << comm.collectivesStarted());

        // The compute stream sees results without a synchronisation of its own.
        at::Tensor big = onDevice(at::rand({1 << 20}), device);
        at::Tensor twice = comm.allReduce(big, dloss::Reduction::Sum).mul(2);
        CHILD_CHECK(same(twice, big.mul(2)), "allReduce ordered with compute");

        std::string error =
            errorOf([&] { comm.allReduce(x.gt(1), dloss::Reduction::Sum); });
        CHILD_CHECK(contains(error, "Sum of a Bool tensor is not supported"),
                    "a bool reduction was not refused: " << error);
        error = errorOf([&] { comm.send(x, 0, 0); });
        CHILD_CHECK(contains(error, "has no other rank"),
                    "a send to itself was not refused: " << error);
        error = errorOf([&] { comm.broadcast(x, 1); });
        CHILD_CHECK(contains(error, "is not a rank"),
                    "root 1 not refused: " << error);
        // Refused calls leave the communicator usable.
        CHILD_CHECK(same(comm.broadcast(x, 0), x), "broadcast after refusals");
      });
}

//===----------------------------------------------------------------------===//
// Several GPUs
//===----------------------------------------------------------------------===//

int multiWorld() { return std::min(probeDevices().count, 4); }

TEST(ProcessGroupCuda, UnevenCollectives) {
  SKIP_WITHOUT_GPUS(2);
  int n = multiWorld();
  runOnGpus(
      n, dloss::test::kCollectiveTimeout,
      [n](dloss::Communicator &comm, int r) {
        // Rank r holds r + 1 rows (the last one none when n > 2) of value 100 r
        // + i.
        std::vector<int64_t> sizes;
        for (int q = 0; q < n; ++q)
          sizes.push_back(n > 2 && q == n - 1 ? 0 : q + 1);
        auto rows = [&](int q) {
          return at::arange(sizes[q] * 3, at::kFloat).view({sizes[q], 3}) +
                 100 * q;
        };
        std::vector<at::Tensor> all;
        for (int q = 0; q < n; ++q)
          all.push_back(rows(q));
        at::Tensor mine = onDevice(rows(r), r);
        CHILD_CHECK(same(comm.allGather(mine, 0, sizes), at::cat(all, 0)),
                    "uneven allGather axis 0");
        std::vector<at::Tensor> columns;
        for (const at::Tensor &t : all)
          columns.push_back(t.t());
        CHILD_CHECK(
            same(comm.allGather(mine.t(), 1, sizes), at::cat(columns, 1)),
            "uneven allGather axis 1");

        at::Tensor values = onDevice(at::full({4}, r + 1.0), r);
        double sum = n * (n + 1) / 2.0;
        CHILD_CHECK(same(comm.allReduce(values, dloss::Reduction::Sum),
                         at::full({4}, sum)),
                    "allReduce Sum");
        CHILD_CHECK(same(comm.allReduce(values, dloss::Reduction::Mean),
                         at::full({4}, sum / n)),
                    "allReduce Mean");
        CHILD_CHECK(same(comm.allReduce(values, dloss::Reduction::Max),
                         at::full({4}, double(n))),
                    "allReduce Max");
        CHILD_CHECK(same(comm.allReduce(values, dloss::Reduction::Min),
                         at::full({4}, 1.0)),
                    "allReduce Min");

        // Every rank contributes (r + 1) * base; rank r keeps its rows.
        int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
        at::Tensor base = at::arange(total * 2, at::kDouble).view({total, 2});
        at::Tensor reduced = comm.reduceScatter(
            onDevice(base * (r + 1), r), dloss::Reduction::Sum, 0, sizes);
        int64_t offset =
            std::accumulate(sizes.begin(), sizes.begin() + r, int64_t{0});
        CHILD_CHECK(same(reduced, base.narrow(0, offset, sizes[r]) * sum),
                    "uneven reduceScatter axis 0");
        at::Tensor reducedT = comm.reduceScatter(
            onDevice(base.t() * (r + 1), r), dloss::Reduction::Mean, 1, sizes);
        CHILD_CHECK(
            same(reducedT, base.t().narrow(1, offset, sizes[r]) * (sum / n)),
            "uneven reduceScatter Mean axis 1");

        at::Tensor rooted = onDevice(at::full({2, 2}, double(r)), r);
        CHILD_CHECK(
            same(comm.broadcast(rooted, n - 1), at::full({2, 2}, n - 1.0)),
            "broadcast from the last rank");

        // Shapes differ per rank and travel with the data.
        int prev = (r + n - 1) % n;
        at::Tensor shifted = comm.ringShift(onDevice(rows(r), r), 1);
        CHILD_CHECK(same(shifted, rows(prev)), "ringShift of uneven shapes");

        auto ints = comm.allGatherInts({r, 10 * r});
        std::vector<int64_t> expected;
        for (int q = 0; q < n; ++q) {
          expected.push_back(q);
          expected.push_back(10 * q);
        }
        CHILD_CHECK(ints == expected, "allGatherInts");
      });
}

TEST(ProcessGroupCuda, PointToPointRing) {
  SKIP_WITHOUT_GPUS(2);
  int n = multiWorld();
  runOnGpus(
      n, dloss::test::kCollectiveTimeout,
      [n](dloss::Communicator &comm, int r) {
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        for (int step = 0; step < 3; ++step) {
          // Posted in opposite tag orders on the two ends: the engine issues
          // each peer's transfers in tag order, so they still match.
          at::Tensor small = onDevice(at::full({2}, double(r + step)), r);
          auto pattern = [step](int q) {
            return (at::arange(15, at::kFloat).view({5, 3}) + 100 * q + step)
                .t();
          };
          at::Tensor large = onDevice(pattern(r), r); // [3, 5], non-contiguous
          at::Tensor inSmall = onDevice(at::empty({2}, at::kDouble), r);
          at::Tensor inLarge = onDevice(at::empty({5, 3}, at::kFloat), r);
          at::Tensor inLargeT = inLarge.t(); // non-contiguous target
          std::vector<std::unique_ptr<dloss::Communicator::Request>> pending;
          pending.push_back(comm.recv(inSmall, prev, 10 * step + 3));
          pending.push_back(comm.recv(inLargeT, prev, 10 * step + 5));
          pending.push_back(comm.send(large, next, 10 * step + 5));
          pending.push_back(comm.send(small, next, 10 * step + 3));
          for (auto &request : pending)
            request->wait();
          CHILD_CHECK(same(inSmall, at::full({2}, double(prev + step))),
                      "ring step " << step << ": small");
          CHILD_CHECK(same(inLargeT.contiguous(), pattern(prev).contiguous()),
                      "ring step " << step << ": large");
        }
        // Transfers do not count as collectives.
        CHILD_CHECK(comm.collectivesStarted() == 1, "send/recv were counted");
      });
}

// Rank 1 skips the next CUDA allReduce and stays alive past the deadline;
// rank 0's allReduce (collective #`number`) must fail at the deadline naming
// rank 1 and saying `detail`, and leave the communicator failing fast.
void skipOnRankOne(dloss::Communicator &comm, int r,
                   std::chrono::milliseconds timeout, int number,
                   const std::string &detail) {
  at::Tensor x = onDevice(at::ones({8}), r);
  if (r == 1) {
    std::this_thread::sleep_for(timeout + std::chrono::seconds(3));
    return;
  }
  auto start = dloss::test::Clock::now();
  std::string error =
      errorOf([&] { comm.allReduce(x, dloss::Reduction::Sum); });
  auto elapsed = dloss::test::Clock::now() - start;
  std::string what =
      "collective #" + std::to_string(number) + " allReduce timed out";
  CHILD_CHECK(contains(error, what), "no timeout error: " << error);
  CHILD_CHECK(contains(error, "rank 1 never arrived"),
              "the missing rank is not named: " << error);
  CHILD_CHECK(contains(error, detail), "no '" << detail << "': " << error);
  CHILD_CHECK(elapsed < timeout + std::chrono::seconds(5),
              "the deadline took too long");
  error = errorOf([&] { comm.allReduce(x, dloss::Reduction::Sum); });
  CHILD_CHECK(contains(error, "unusable after an earlier failure"),
              "a later call did not fail fast: " << error);
}

// Rank 1 never reaches the group's first CUDA collective: the ranks meet
// under the deadline before NCCL starts (NCCL's start would block the host
// with no deadline), so rank 0 names rank 1 instead of hanging.
TEST(ProcessGroupCuda, DeadlineBeforeNcclStartsNamesTheRank) {
  SKIP_WITHOUT_GPUS(2);
  auto timeout = std::chrono::milliseconds(5000);
  runOnGpus(2, timeout, [timeout](dloss::Communicator &comm, int r) {
    skipOnRankOne(comm, r, timeout, 2, "deadline");
  });
}

// Rank 1 skips a CUDA collective once NCCL runs: rank 0's kernel waits on
// the GPU, the host polls it against the deadline, aborts the group's NCCL
// communicators (which ends the kernel) and names rank 1.
TEST(ProcessGroupCuda, DeadlineInNcclAbortsTheGroup) {
  SKIP_WITHOUT_GPUS(2);
  // Long enough for NCCL's start in the first, completed, collective.
  auto timeout = std::chrono::milliseconds(10000);
  runOnGpus(2, timeout, [timeout](dloss::Communicator &comm, int r) {
    at::Tensor x = onDevice(at::ones({8}), r);
    CHILD_CHECK(same(comm.allReduce(x, dloss::Reduction::Sum), x * 2),
                "the first CUDA allReduce");
    skipOnRankOne(comm, r, timeout, 3, "NCCL communicators were aborted");
  });
}

} // namespace
