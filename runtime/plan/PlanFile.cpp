// Loading and validating a compiled plan (.plan file or bytes) for the runtime.
#include "runtime/plan/PlanFile.h"

#include "runtime/support/Error.h"

#include <flatbuffers/flatbuffers.h>

#include <fstream>
#include <iterator>
#include <set>
#include <utility>

namespace dloss {

namespace {

const char *kRecompileHint = "Recompile the loss with dlossc (-o x.plan) using "
                             "the dlossc that matches this runtime";

Error badPlan(const std::string &name, const std::string &problem) {
  return Error("plan '" + name + "' " + problem, kRecompileHint);
}

} // namespace

PlanFile::PlanFile(std::vector<uint8_t> bytes, std::string name)
    : data(std::move(bytes)), sourceName(std::move(name)) {
  // Check the cheap things first so that the message says what the file is,
  // not merely that it failed verification.
  if (data.size() < 8)
    throw badPlan(sourceName, "is " + std::to_string(data.size()) +
                                  " bytes long, too short to be a plan");
  if (!plan::PlanBufferHasIdentifier(data.data()))
    throw badPlan(sourceName, "is not a dloss plan (its file identifier is "
                              "not \"" +
                                  std::string(plan::PlanIdentifier()) + "\")");
  // Plans are small programs but may carry large constants, so allow many
  // tables; the depth is fixed by the schema.
  flatbuffers::Verifier verifier(data.data(), data.size(), /*max_depth=*/64,
                                 /*max_tables=*/1u << 26);
  if (!plan::VerifyPlanBuffer(verifier))
    throw badPlan(sourceName, "is corrupt or truncated (FlatBuffers "
                              "verification failed)");
  root = plan::GetPlan(data.data());
  if (root->version() != kPlanVersion)
    throw badPlan(sourceName, "has plan format version " +
                                  std::to_string(root->version()) +
                                  ", this runtime reads version " +
                                  std::to_string(kPlanVersion));
  std::set<std::string> seen;
  if (root->functions())
    for (const plan::Function *function : *root->functions())
      if (!seen.insert(function->name()->str()).second)
        throw badPlan(sourceName, "defines function '" +
                                      function->name()->str() + "' twice");
}

std::shared_ptr<const PlanFile> PlanFile::load(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot open plan '" + path + "'",
                "Check the path, or compile the loss with dlossc -o " + path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad())
    throw Error("cannot read plan '" + path + "'", "Check the file");
  return fromBytes(std::move(bytes), path);
}

std::shared_ptr<const PlanFile> PlanFile::fromBytes(std::vector<uint8_t> bytes,
                                                    std::string name) {
  // The constructor is private; make_shared cannot reach it.
  return std::shared_ptr<const PlanFile>(
      new PlanFile(std::move(bytes), std::move(name)));
}

const plan::Function *PlanFile::findFunction(const std::string &name) const {
  if (!root->functions())
    return nullptr;
  for (const plan::Function *function : *root->functions())
    if (function->name()->string_view() == name)
      return function;
  return nullptr;
}

const plan::Function &PlanFile::function(const std::string &name) const {
  if (const plan::Function *function = findFunction(name))
    return *function;
  std::string known;
  for (const std::string &candidate : functionNames())
    known += (known.empty() ? "@" : ", @") + candidate;
  throw Error("plan '" + sourceName + "' has no function @" + name,
              known.empty() ? std::string("The plan is empty; recompile it")
                            : "It has " + known);
}

std::vector<std::string> PlanFile::functionNames() const {
  std::vector<std::string> names;
  if (root->functions())
    for (const plan::Function *function : *root->functions())
      names.push_back(function->name()->str());
  return names;
}

PlanEntry PlanFile::entry(const std::string &requested,
                          const std::string &option) const {
  std::string losses;
  PlanEntry chosen;
  int matches = 0;
  if (root->functions())
    for (const plan::Function *function : *root->functions()) {
      if (!isLossEntry(*function))
        continue;
      losses += (losses.empty() ? "" : ", ") + function->name()->str();
      if (requested.empty() || function->name()->string_view() == requested) {
        chosen.loss = function;
        ++matches;
      }
    }
  if (matches == 0)
    throw Error("plan '" + sourceName + "' has " +
                    (requested.empty() ? "no loss entry point"
                                       : "no loss called '" + requested + "'"),
                losses.empty()
                    ? "Mark the loss function with the dloss.loss attribute"
                    : "Choose one of: " + losses + " (" + option + ")");
  if (matches > 1)
    throw Error("plan '" + sourceName + "' has several losses: " + losses,
                "Choose one with " + option);
  std::string loss = chosen.loss->name()->str();
  for (const plan::Function *function : *root->functions())
    if (isDerivedGradient(*function) &&
        function->gradient_of()->string_view() == loss)
      chosen.grad = function;
  if (!chosen.grad)
    throw Error("plan '" + sourceName + "' has no gradient function for @" +
                    loss,
                "Compile the loss with dlossc or dloss::jit::compile, which "
                "derive @" +
                    loss + "_grad");
  return chosen;
}

bool isDerivedGradient(const plan::Function &function) {
  return function.gradient_of() && function.gradient_of()->size();
}

bool isLossEntry(const plan::Function &function) {
  return function.grad_mode() && function.grad_mode()->size() &&
         !isDerivedGradient(function);
}

std::string gradModeOf(const plan::Function &function) {
  return function.grad_mode() && function.grad_mode()->size()
             ? function.grad_mode()->str()
             : "ddp";
}

std::string inputName(const plan::Function &function, size_t i) {
  const plan::Argument *argument = function.arguments()->Get(i);
  if (argument->name() && argument->name()->size())
    return argument->name()->str();
  return "arg" + std::to_string(i);
}

} // namespace dloss
