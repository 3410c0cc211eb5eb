// One rank of a job: loads its inputs, runs the loss timed, writes results.
//
// Each rank's result.json has the median time of one forward+backward
// (CallTiming.h) and the loss's memory: loss_mem_mb = peak RSS (VmHWM) after
// the timed calls minus the RSS right before the first call (LossMemory.h).
#include "tools/dloss-run/CallTiming.h"
#include "tools/dloss-run/DlossRun.h"
#include "tools/dloss-run/LossMemory.h"

#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/exec/Executor.h"
#include "runtime/io/Npy.h"
#include "runtime/support/Error.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

namespace dloss {
namespace tools {

namespace {

/// How long a failed rank's teardown may take: the store's host keeps it up
/// for its peers' diagnosis for 3 s at most (PeerStates), plus a margin.
constexpr std::chrono::seconds kFailedTeardownLimit{6};

/// Ends the process once `limit` has passed, whatever the teardown still
/// waits for. After a failure nothing is left to do but the peers' diagnosis,
/// and a teardown can wait on a peer: a Gloo operation the rank stopped
/// waiting for still runs until Gloo's own timeout, and a group that owns it
/// joins it. A rank that outlives its error by the whole deadline holds its
/// peers' connections open and its launcher waiting.
void endTeardownAfter(int rank, std::chrono::seconds limit) {
  std::thread([rank, limit] {
    std::this_thread::sleep_for(limit);
    std::string line = "dloss-run: the teardown of rank " +
                       std::to_string(rank) + " after its failure took over " +
                       std::to_string(limit.count()) +
                       " s (a collective it stopped waiting for may still wait "
                       "on a peer): ending it\n";
    ssize_t written = ::write(2, line.data(), line.size());
    (void)written;
    _exit(1);
  }).detach();
}

} // namespace

int runRank(const Options &o, const std::string &planPath) {
  RendezvousOptions rendezvous = RendezvousOptions::fromEnvironment();
  if (o.timeoutSeconds > 0)
    rendezvous.timeout = std::chrono::seconds(o.timeoutSeconds);
  int rank = rendezvous.rank;
  int threads = intraOpThreads(o);
  at::set_num_threads(threads);
  // Outlives the try block, so that an error is printed before the
  // communicator's teardown (which may wait briefly for the peers).
  std::unique_ptr<Communicator> comm;
  try {
    auto plan = PlanFile::load(planPath);
    PlanEntry entry = entryOf(*plan, o);
    checkInputNames(o, *entry.grad);
    ExecutorOptions executorOptions = ExecutorOptions::fromEnvironment();
    if (o.runtimeChecks)
      executorOptions.check = true;
    executorOptions.schedule =
        fused::parseOptionalSchedule(o.schedule, "--schedule");
    // Flight records go beside the rank's results unless DLOSS_FLIGHT_DIR says.
    if (!std::getenv("DLOSS_FLIGHT_DIR")) {
      rendezvous.flightDir = rankDir(o, rank);
      makeDirectories(rendezvous.flightDir);
    }
    // Meet the peers first: from here on, a problem of this rank reaches
    // every rank through the preflight.
    comm = connectProcessGroup(rendezvous);
    Executor executor(plan, *comm, executorOptions);
    const std::string gradName = entry.grad->name()->str();
    InputFailure failure;
    std::vector<at::Tensor> inputs = loadInputs(o, *entry.grad, rank, &failure);
    agreeOnInputs(o, *entry.grad, *comm, failure);

    // Inputs loaded, peers met: what the calls add from here is the loss's.
    auto memory = LossMemory::start();
    auto warmupStart = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = executor.run(gradName, inputs); // warm-up
    memory.steady();
    // Progress for long runs. Rank 0 ends its warm-up call only once every
    // rank has sent it the call's data, so the line also says that the ranks
    // are past the connection check and into the loss.
    if (rank == 0)
      std::cout << "dloss-run: warm-up call done in "
                << std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - warmupStart)
                       .count()
                << " ms; timing " << o.iters << " call"
                << (o.iters == 1 ? "" : "s") << std::endl;
    double median = timeCalls(*comm, gradName, /*warmup=*/0, o.iters, [&] {
      outputs = executor.run(gradName, inputs);
    });
    memory.stop();
    // The summary names the rank that must fit: the largest loss memory.
    std::vector<int64_t> lossKb =
        comm->allGatherInts({memory.hwmKb - memory.baselineKb});
    double worstLossMb =
        *std::max_element(lossKb.begin(), lossKb.end()) / 1024.0;

    std::string dir = rankDir(o, rank);
    makeDirectories(dir);
    std::ostringstream json;
    json.precision(9);
    json << "{\n  \"rank\": " << rank
         << ",\n  \"world_size\": " << comm->worldSize()
         << ",\n  \"loss\": " << outputs[0].item<double>();
    // After the loss: each state argument's new value (dloss.state), then
    // one gradient per grad argument.
    unsigned k = 1;
    for (unsigned i = 0; i < entry.grad->arguments()->size(); ++i)
      if (entry.grad->arguments()->Get(i)->state() && k < outputs.size())
        npy::save(dir + "/state_" + inputName(*entry.grad, i) + ".npy",
                  outputs[k++].to(at::kFloat).contiguous());
    const auto *gradArgs = entry.grad->grad_arguments();
    for (unsigned g = 0; gradArgs && g < gradArgs->size() && k < outputs.size();
         ++g, ++k) {
      std::string name = inputName(*entry.grad, gradArgs->Get(g));
      at::Tensor grad = outputs[k].to(at::kFloat).contiguous();
      npy::save(dir + "/grad_" + name + ".npy", grad);
      if (grad.dim() == 0)
        json << ",\n  \"grad_" << name << "\": " << grad.item<double>();
    }
    json << ",\n  \"intra_op_threads\": " << at::get_num_threads()
         << ",\n  \"median_ms\": " << median
         << ",\n  \"peak_rss_mb\": " << memory.peakRssMb()
         << ",\n  \"loss_mem_mb\": " << memory.lossMb()
         << ",\n  \"steady_mem_mb\": " << memory.steadyMb()
         << ",\n  \"baseline_rss_mb\": " << memory.baselineMb()
         << ",\n  \"vm_hwm_mb\": " << memory.hwmMb()
         << ",\n  \"hwm_reset\": " << (memory.hwmReset ? "true" : "false")
         << ",\n  \"mmap_threshold_fixed\": "
         << (memory.mmapThresholdFixed ? "true" : "false") << "\n}\n";
    std::ofstream(dir + "/result.json") << json.str();
    if (rank == 0)
      std::cout << "dloss-run: @" << entry.loss->name()->str() << " on "
                << comm->worldSize() << " ranks: loss "
                << outputs[0].item<double>() << ", " << median
                << " ms per forward+backward (median of " << o.iters << "; "
                << threads << " intra-op thread" << (threads == 1 ? "" : "s")
                << " per rank)\n"
                << "dloss-run: loss memory " << worstLossMb
                << " MB per rank at most (peak RSS minus the RSS before the "
                   "first call"
                << (memory.hwmReset
                        ? ""
                        : "; the peak could not be reset, so it may be "
                          "an earlier one")
                << ")\n";
    return 0;
  } catch (const std::exception &e) {
    // One write, so that the ranks' lines never interleave.
    std::string line =
        "dloss-run: rank " + std::to_string(rank) + ": " + e.what() + "\n";
    ssize_t written = ::write(2, line.data(), line.size());
    (void)written;
    endTeardownAfter(rank, kFailedTeardownLimit);
    return 1;
  }
}

} // namespace tools
} // namespace dloss
