// The cost report's text and JSON forms (see Output.h).
#include "report/Output.h"

#include "runtime/plan/ScheduleCosts.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::dloss;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr size_t kLargestShown = 5;

std::string mib(double bytes) {
  return llvm::formatv("{0:F2}", bytes / kMiB).str();
}

void printVariant(llvm::raw_ostream &os, const FunctionReport &r,
                  StringRef variant) {
  os << "== @" << r.name << ", " << variant << " ==\n";
  os << "peak memory: " << mib(r.peakBytes) << " MiB (" << r.peakBytes
     << " B) at " << r.peakOp;
  if (!r.peakLocation.empty())
    os << " " << r.peakLocation;
  os << "\n  live values " << mib(r.liveBytes) << " MiB + kernel workspace "
     << mib(r.workspaceBytes) << " MiB";
  if (!r.workspaceHow.empty())
    os << " (" << r.workspaceHow << ")";
  os << "\n  largest live values at the peak:\n";
  for (const LiveValue &v : llvm::ArrayRef(r.largest).take_front(kLargestShown))
    os << llvm::formatv("    {0,10} MiB  {1,-18} {2}\n", mib(v.bytes), v.type,
                        v.what);
  if (r.largest.size() > kLargestShown)
    os << "    ... " << r.largest.size() - kLargestShown << " more\n";
  os << "communicated per call (bytes each rank sends):\n";
  for (const Transfer &t : r.transfers)
    os << llvm::formatv("  {0,-28} {1,-18} {2,12} B {3,10} MiB  {4}\n", t.op,
                        t.location, std::llround(t.bytes), mib(t.bytes), t.how);
  os << llvm::formatv("  {0,-28} {1,-18} {2,12} B {3,10} MiB\n", "total", "",
                      std::llround(r.sentBytes), mib(r.sentBytes));
  os << "\n";
}

std::string ratioText(double unfused, double fused) {
  if (fused <= 0)
    return "n/a";
  return llvm::formatv("{0:F2}x", unfused / fused).str();
}

void printSummary(llvm::raw_ostream &os, const FunctionReport &fused,
                  const FunctionReport &unfused) {
  os << "@" << fused.name << ": peak memory: fused " << mib(fused.peakBytes)
     << " MiB vs unfused " << mib(unfused.peakBytes) << " MiB (unfused/fused "
     << ratioText(unfused.peakBytes, fused.peakBytes)
     << "); communicated: fused " << mib(fused.sentBytes) << " MiB vs unfused "
     << mib(unfused.sentBytes) << " MiB\n";
}

void writeJsonVariant(llvm::json::OStream &j, const FunctionReport &r) {
  j.object([&] {
    j.attribute("peak_bytes", r.peakBytes);
    j.attribute("peak_op", r.peakOp);
    j.attribute("peak_location", r.peakLocation);
    j.attribute("live_bytes", r.liveBytes);
    j.attribute("workspace_bytes", r.workspaceBytes);
    j.attribute("workspace", r.workspaceHow);
    j.attributeArray("live_at_peak", [&] {
      for (const LiveValue &v : r.largest)
        j.object([&] {
          j.attribute("value", v.what);
          j.attribute("type", v.type);
          j.attribute("bytes", v.bytes);
        });
    });
    j.attributeArray("communication", [&] {
      for (const Transfer &t : r.transfers)
        j.object([&] {
          j.attribute("op", t.op);
          j.attribute("location", t.location);
          j.attribute("bytes", static_cast<int64_t>(std::llround(t.bytes)));
          j.attribute("how", t.how);
        });
    });
    j.attribute("sent_bytes", static_cast<int64_t>(std::llround(r.sentBytes)));
  });
}

/// Which schedule auto picks for a fused op's columns at these sizes, on
/// each engine (runtime/plan/ScheduleCosts.h). The columns: every rank's
/// `batch` rows of `dim` f32 values, as CLIP's and SigLIP's carry.
void printSchedule(llvm::raw_ostream &os, const ReportOptions &options) {
  using namespace ::dloss::schedule;
  const int world = static_cast<int>(options.cost.worldSize);
  const double columns = 4.0 * world * options.batch * options.dim;
  auto choice = [&](Engine engine) {
    int64_t crossover = gatherCrossoverBytes(world, engine);
    return (world > 1 && columns <= crossover ? "gather" : "ring") +
           std::string(" (crossover ") + mib(crossover) + " MiB)";
  };
  // CLIP's and SigLIP's CPU ops: rows as many as columns, CLIP's two
  // similarity-sized products computed again, two exchanges saved.
  const double extraMacs =
      2.0 * options.batch * world * options.batch * options.dim;
  const bool bothSides =
      world > 1 && 2 * columns <= gatherCrossoverBytes(world, Engine::Gloo) &&
      bothSidesPay(world, Engine::Gloo, extraMacs, 2);
  os << "  schedule (auto, chosen per call by the runtime): a fused op "
        "gathers its columns while every rank's together are below the "
        "crossover, else runs the ring; here "
     << mib(columns) << " MiB of f32 columns: " << choice(Engine::Gloo)
     << " with Gloo, " << choice(Engine::Nccl)
     << " with NCCL; CLIP's and SigLIP's ops on the CPU gather both sides "
        "(rows too; no carries travel) while rows and columns are below it "
        "and computing the tiles twice costs less than the exchanges saved: "
     << (bothSides ? "yes" : "no") << " here\n";
}

} // namespace

void mlir::dloss::writeReportText(llvm::raw_ostream &os, StringRef source,
                                  const ReportOptions &options,
                                  ArrayRef<ReportEntry> entries,
                                  ArrayRef<std::string> remarks) {
  os << "dloss report for " << source << "\n"
     << "  " << options.cost.worldSize
     << " ranks, every rank holding the same sizes; rank facts (rank, "
        "shard_offset) as on rank 0\n"
     << "  arguments: dynamic dim 0 = " << options.batch
     << " rows per rank, other dynamic dims = " << options.dim;
  for (const auto &entry : options.argumentShapes)
    os << ", " << entry.getKey() << " = "
       << concreteShapeText(entry.getValue());
  os << "\n  memory: each tensor its own buffer, live from its definition to "
        "its last use (arguments throughout, results to the end), plus kernel "
        "temporaries; fused kernels' nominal tile "
     << options.cost.tileRows << " x " << options.cost.tileCols
     << " elements (the runtime sizes its tile from the L2 cache)\n"
     << "  communication: bytes one rank sends per call (ring all_gather, "
        "ring all_reduce)\n";
  printSchedule(os, options);
  os << "\n";
  for (const ReportEntry &entry : entries) {
    printVariant(os, *entry.fused, "fused");
    if (entry.unfused)
      printVariant(os, *entry.unfused, "unfused");
  }
  for (const ReportEntry &entry : entries)
    if (entry.unfused)
      printSummary(os, *entry.fused, *entry.unfused);
  if (!remarks.empty()) {
    os << "\nfusion remarks (why a similarity stays unfused; its matrix is "
          "built whole):\n";
    for (const std::string &remark : remarks)
      os << "  " << remark << "\n";
  }
}

void mlir::dloss::writeReportJson(llvm::raw_ostream &os, StringRef source,
                                  const ReportOptions &options,
                                  ArrayRef<ReportEntry> entries,
                                  ArrayRef<std::string> remarks) {
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attribute("source", source);
    j.attribute("world_size", options.cost.worldSize);
    j.attribute("batch", options.batch);
    j.attribute("dim", options.dim);
    j.attribute("representative_rank", int64_t(0));
    j.attributeArray("tile", [&] {
      j.value(options.cost.tileRows);
      j.value(options.cost.tileCols);
    });
    j.attributeArray("fusion_remarks", [&] {
      for (const std::string &remark : remarks)
        j.value(remark);
    });
    j.attributeArray("functions", [&] {
      for (const ReportEntry &entry : entries) {
        j.object([&] {
          j.attribute("name", entry.fused->name);
          j.attributeBegin("fused");
          writeJsonVariant(j, *entry.fused);
          j.attributeEnd();
          if (entry.unfused) {
            j.attributeBegin("unfused");
            writeJsonVariant(j, *entry.unfused);
            j.attributeEnd();
          }
        });
      }
    });
  });
  os << "\n";
}
