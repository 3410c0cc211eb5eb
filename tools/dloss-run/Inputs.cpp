// Each rank's inputs (--input): names checked, files loaded, failures shared.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/io/Npy.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"

#include <cstdlib>

#include <unistd.h>

namespace dloss {
namespace tools {

namespace {

std::string substituteRank(std::string path, int rank) {
  const std::string key = "{rank}";
  for (size_t at; (at = path.find(key)) != std::string::npos;)
    path.replace(at, key.size(), std::to_string(rank));
  return path;
}

/// The .npy path of input `name` on rank `rank`, or "" for an inline number.
std::string inputPath(const std::string &source, int rank) {
  char *end = nullptr;
  std::strtod(source.c_str(), &end);
  if (!source.empty() && *end == 0 && !endsWith(source, ".npy"))
    return "";
  return substituteRank(source, rank);
}

/// Why an input file could not be loaded, as a code every rank can explain.
enum LoadFailure : int64_t {
  Loaded = 0,
  Missing = 1,
  Unreadable = 2,
  Invalid = 3
};

const char *explain(int64_t reason) {
  switch (reason) {
  case Missing:
    return "the file does not exist";
  case Unreadable:
    return "the file cannot be read";
  default:
    return "it is not a valid .npy file";
  }
}

} // namespace

void checkInputNames(const Options &o, const plan::Function &f) {
  unsigned n = f.arguments() ? f.arguments()->size() : 0;
  std::vector<bool> given(n, false);
  for (const auto &input : o.inputs) {
    unsigned i = 0;
    while (i < n && inputName(f, i) != input.first)
      ++i;
    if (i == n) {
      std::string names;
      for (unsigned j = 0; j < n; ++j)
        names += (j ? ", " : "") + inputName(f, j);
      throw Error("--input " + input.first + ": @" + f.name()->str() +
                      " has no argument called '" + input.first + "'",
                  "Its arguments are: " + names);
    }
    given[i] = true;
  }
  for (unsigned i = 0; i < n; ++i)
    if (!given[i])
      throw Error("no input for argument '" + inputName(f, i) + "' of @" +
                      f.name()->str(),
                  "Pass --input " + inputName(f, i) +
                      "=PATH.npy (or a number)");
}

std::vector<at::Tensor> loadInputs(const Options &o, const plan::Function &f,
                                   int rank, InputFailure *failure) {
  checkInputNames(o, f);
  unsigned n = f.arguments() ? f.arguments()->size() : 0;
  std::vector<at::Tensor> inputs(n);
  for (const auto &[name, source] : o.inputs) {
    unsigned i = 0;
    while (inputName(f, i) != name)
      ++i;
    std::string path = inputPath(source, rank);
    if (path.empty()) {
      // An unknown plan dtype raises here, alike on every rank (they share
      // the plan), rather than being reported as an unreadable file.
      at::ScalarType type =
          toScalarType(f.arguments()->Get(i)->type()->dtype());
      inputs[i] =
          at::scalar_tensor(std::strtod(source.c_str(), nullptr), at::kDouble)
              .to(type);
      continue;
    }
    try {
      inputs[i] = npy::load(path);
    } catch (const std::exception &) {
      if (!failure)
        throw;
      if (failure->argument < 0)
        *failure = {i, access(path.c_str(), F_OK) != 0   ? Missing
                       : access(path.c_str(), R_OK) != 0 ? Unreadable
                                                         : Invalid};
    }
  }
  return inputs;
}

void agreeOnInputs(const Options &o, const plan::Function &f,
                   Communicator &comm, InputFailure mine) {
  std::vector<int64_t> all = comm.allGatherInts({mine.argument, mine.reason});
  std::string problem;
  for (int r = 0; r < comm.worldSize(); ++r) {
    int64_t arg = all[2 * r], reason = all[2 * r + 1];
    if (arg < 0)
      continue;
    std::string name = inputName(f, static_cast<unsigned>(arg));
    std::string source;
    for (const auto &input : o.inputs)
      if (input.first == name)
        source = input.second;
    problem += std::string(problem.empty() ? "" : "; ") + "rank " +
               std::to_string(r) + " could not load input '" + name +
               "' from '" + inputPath(source, r) + "': " + explain(reason);
  }
  if (!problem.empty())
    throw Error(problem,
                "Check those ranks' input files (--input NAME=PATH, with "
                "{rank} for per-rank files)");
}

} // namespace tools
} // namespace dloss
