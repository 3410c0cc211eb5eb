// --check: the ranks' results against one process on the global batch.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/comm/Engines.h"
#include "runtime/exec/Executor.h"
#include "runtime/io/Npy.h"
#include "runtime/support/Error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

namespace dloss {
namespace tools {

namespace {

double readLoss(const std::string &resultJson) {
  std::ifstream in(resultJson);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  size_t at = text.find("\"loss\":");
  if (at == std::string::npos)
    throw Error("'" + resultJson + "' has no loss", "Rerun dloss-run");
  return std::strtod(text.c_str() + at + 7, nullptr);
}

/// One comparison: the relative error and, where a side holds a NaN or an
/// Inf, which one (the error is then infinite: a NaN error would compare
/// false with every tolerance and pass).
struct Comparison {
  double error;
  std::string nonFinite; // "" or ": NaN or Inf in ..."
};

/// max |got - expected| / max |expected|: the error relative to the
/// gradient's scale, so that near-zero entries do not dominate.
Comparison compare(const at::Tensor &got, const at::Tensor &expected,
                   const std::string &gotName) {
  at::Tensor g = got.to(at::kDouble), e = expected.to(at::kDouble);
  bool badGot = !at::isfinite(g).all().item<bool>();
  bool badRef = !at::isfinite(e).all().item<bool>();
  if (badGot || badRef)
    return {std::numeric_limits<double>::infinity(),
            ": NaN or Inf in " + (badGot && badRef
                                      ? gotName + " and the reference"
                                  : badGot ? gotName
                                           : "the reference")};
  double scale = e.numel() ? e.abs().max().item<double>() : 0.0;
  double diff = e.numel() ? (g - e).abs().max().item<double>() : 0.0;
  return {diff / std::max(scale, 1e-30), ""};
}

} // namespace

int checkAgainstReference(const Options &o, const std::string &planPath,
                          int world) {
  auto plan = PlanFile::load(planPath);
  PlanEntry entry = entryOf(*plan, o);
  const auto &grad = *entry.grad;
  unsigned n = grad.arguments()->size();

  // The global batch: varying inputs concatenated in rank order, replicated
  // ones as rank 0 holds them.
  std::vector<std::vector<at::Tensor>> perRank;
  for (int r = 0; r < world; ++r)
    perRank.push_back(loadInputs(o, grad, r));
  std::vector<at::Tensor> global(n);
  for (unsigned i = 0; i < n; ++i) {
    if (grad.arguments()->Get(i)->replicated() || perRank[0][i].dim() == 0) {
      global[i] = perRank[0][i];
      continue;
    }
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < world; ++r)
      pieces.push_back(perRank[r][i]);
    global[i] = at::cat(pieces, 0);
  }
  auto single = makeSingleProcessCommunicator();
  Executor reference(plan, *single);
  std::vector<at::Tensor> expected = reference.run(grad.name()->str(), global);

  bool globalMode = gradModeOf(grad) == "global";
  double refLoss = expected[0].item<double>();
  double worst = 0.0;
  std::string worstWhat = "loss";
  // The first non-finite result stays the worst: a later one only ties.
  auto note = [&](const Comparison &c, const std::string &what) {
    if (c.error > worst) {
      worst = c.error;
      worstWhat = what + c.nonFinite;
    }
  };
  // The loss is the global loss on every rank: the same value, bit for bit
  // (result.json prints 9 significant digits, exact for float32). A NaN loss
  // on every rank is no disagreement between them; it fails as not finite.
  double rank0Loss = readLoss(rankDir(o, 0) + "/result.json");
  bool lossIdentical = true;
  for (int r = 0; r < world; ++r) {
    double loss = readLoss(rankDir(o, r) + "/result.json");
    lossIdentical &=
        loss == rank0Loss || (std::isnan(loss) && std::isnan(rank0Loss));
    note(compare(at::scalar_tensor(loss, at::kDouble), expected[0],
                 "the rank's loss"),
         "loss on rank " + std::to_string(r));
  }
  if (!lossIdentical) {
    std::printf("dloss-run --check: FAIL: the loss differs between ranks (see "
                "%s/rank*/result.json)\n",
                o.out.c_str());
    return 3;
  }
  // The state arguments' new values come between the loss and the
  // gradients: the same on every rank and in one process.
  unsigned first = 1;
  for (unsigned i = 0; i < grad.arguments()->size(); ++i) {
    if (!grad.arguments()->Get(i)->state() || first >= expected.size())
      continue;
    std::string name = inputName(grad, i);
    for (int r = 0; r < world; ++r)
      note(compare(npy::load(rankDir(o, r) + "/state_" + name + ".npy")
                       .to(at::kDouble),
                   expected[first].to(at::kDouble), "the new state"),
           "state " + name + " on rank " + std::to_string(r));
    ++first;
  }
  const auto *gradArgs = grad.grad_arguments();
  for (unsigned k = first;
       gradArgs && k - first < gradArgs->size() && k < expected.size(); ++k) {
    unsigned arg = gradArgs->Get(k - first);
    std::string name = inputName(grad, arg);
    std::vector<at::Tensor> got;
    for (int r = 0; r < world; ++r)
      got.push_back(npy::load(rankDir(o, r) + "/grad_" + name + ".npy"));
    at::Tensor ref = expected[k].to(at::kDouble);
    bool replicated = grad.arguments()->Get(arg)->replicated();
    if (replicated && !globalMode) {
      // ddp: the ranks' gradients average to the global-batch gradient.
      at::Tensor mean = at::zeros_like(ref);
      for (auto &g : got)
        mean = mean + g.to(at::kDouble);
      note(compare(mean / world, ref, "the ranks' mean"),
           "grad_" + name + " (mean over ranks)");
      continue;
    }
    int64_t offset = 0;
    for (int r = 0; r < world; ++r) {
      at::Tensor want = ref;
      if (!replicated && ref.dim() > 0) {
        int64_t rows = perRank[r][arg].size(0);
        want = ref.narrow(0, offset, rows);
        offset += rows;
      }
      if (!globalMode)
        want = want * world; // ddp: N * dF/dx_r
      note(compare(got[r], want, "the rank's gradient"),
           "grad_" + name + " on rank " + std::to_string(r));
    }
  }
  std::printf(
      "dloss-run --check: global loss %.9g (reference %.9g); worst relative "
      "gradient error %.3g (%s), tolerance %.3g: %s\n",
      readLoss(rankDir(o, 0) + "/result.json"), refLoss, worst,
      worstWhat.c_str(), o.tolerance, worst <= o.tolerance ? "PASS" : "FAIL");
  return worst <= o.tolerance ? 0 : 3;
}

} // namespace tools
} // namespace dloss
