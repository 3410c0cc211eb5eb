// connectProcessGroup: the c10d group of dloss-run and the C++ JIT. It meets
// the other ranks through the rendezvous store and builds the group
// init_process_group() builds by default: Gloo for CPU tensors and, where
// torch has NCCL and this process sees a GPU, NCCL for CUDA tensors (its
// communicators start lazily, at the first CUDA collective). The c10d engine
// (ProcessGroupCommunicator.cpp) runs every collective on it. Setup goes
// through namespace `compat`, the place to adapt when c10d changes.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO // ProcessGroupGloo.hpp is empty without it.
#endif

#include "runtime/comm/Engines.h"
#include "runtime/comm/StoreRendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
// USE_C10D_NCCL comes with torch_cuda's compile definitions (a CUDA torch).
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/Context.h>

#include <cstdlib>
#include <optional>

namespace dloss {

using namespace comm;

namespace {

//===----------------------------------------------------------------------===//
// Version-sensitive c10d calls (torch 2.x)
//===----------------------------------------------------------------------===//

namespace compat {

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

// torch 2.x: a ProcessGroup holds one Backend per device type, as
// init_process_group() builds it: ProcessGroupGloo moves CPU tensors and,
// with `ncclTimeout` set, ProcessGroupNCCL moves CUDA ones.
c10::intrusive_ptr<c10d::ProcessGroup>
makeProcessGroup(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                 int worldSize,
                 std::shared_ptr<::gloo::transport::Device> device,
                 std::chrono::milliseconds timeout,
                 std::optional<std::chrono::milliseconds> ncclTimeout) {
  auto groupOptions = c10d::ProcessGroupGloo::Options::create(timeout);
  groupOptions->devices.push_back(std::move(device));
  // One worker thread: calls are synchronous, so a second thread would only
  // idle, and the machines running many ranks are short of cores.
  groupOptions->threads = 1;
  // Prefixes keep each backend's keys apart from the rendezvous keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dloss/gloo", store);
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      prefixed, rank, worldSize, groupOptions);
  auto group =
      c10::make_intrusive<c10d::ProcessGroup>(prefixed, rank, worldSize);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
                    backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
#ifdef USE_C10D_NCCL
  if (ncclTimeout) {
    auto ncclOptions = c10d::ProcessGroupNCCL::Options::create();
    ncclOptions->timeout = *ncclTimeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("dloss/nccl", store), rank,
        worldSize, ncclOptions);
    group->setBackend(c10::DeviceType::CUDA,
                      c10d::ProcessGroup::BackendType::NCCL, nccl);
  }
#else
  (void)ncclTimeout;
#endif
  return group;
}

// The NCCL backend's own timeout, when the group gets one: later than the
// communicator's deadline, so that dloss's deadline fires first, aborts the
// group (ProcessGroup::abort) and names the ranks that never arrived, before
// NCCL's watchdog tears the process down.
std::optional<std::chrono::milliseconds>
ncclTimeoutFor(std::chrono::milliseconds deadline) {
#ifdef USE_C10D_NCCL
  if (at::globalContext().hasCUDA())
    return deadline + std::chrono::seconds(30);
#endif
  (void)deadline;
  return std::nullopt;
}

} // namespace compat

// Set by a rank once its Gloo mesh is connected.
const char *const kMeshPrefix = "dloss/mesh/";

} // namespace

std::unique_ptr<Communicator>
connectProcessGroup(const RendezvousOptions &options) {
  checkOptions(options, "connectProcessGroup");
  Clock::time_point deadline = Clock::now() + options.timeout;
  c10::intrusive_ptr<c10d::Store> store = openStore(options, "an earlier job");
  guardStore(options,
             [&] { rendezvous(*store, options, deadline, "rendezvous"); });

  // Each rank records when its part of the mesh is up, so that a rank whose
  // mesh does not come up can name the peers that never got there (a rank
  // that died right after the rendezvous blocks everyone's mesh).
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = compat::makeProcessGroup(store, options.rank, options.worldSize,
                                     compat::makeDevice(options.masterAddr),
                                     options.timeout,
                                     compat::ncclTimeoutFor(options.timeout));
    setMark(*store, kMeshPrefix, options.rank, "connected");
  } catch (const std::exception &e) {
    std::string peers =
        unmarkedPeers(*store, options, kMeshPrefix, "never connected");
    throw rendezvousError(
        options,
        "could not connect the Gloo mesh after the rendezvous within the "
        "deadline of " +
            seconds(options.timeout) + " (" + describeError(e) + ")" + peers,
        "A peer rank probably failed while connecting: check the other "
        "ranks' logs; on hosts with several network interfaces set "
        "GLOO_SOCKET_IFNAME to the one the ranks share");
  }

  return makeProcessGroupCommunicator(options, store, std::move(group),
                                      /*ownGroup=*/true);
}

} // namespace dloss
