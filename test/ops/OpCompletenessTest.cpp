// Every op a plan may hold has every rule: adjoint, replication, cost, runtime
// kernel, ODS op-table entry, numeric oracle.
//
// A rule that is missing would otherwise show up only when a loss using the
// op reaches the pass, the report, the runtime or the numeric checks. The
// test names each op and what it lacks. The front ends (a dloss::Graph
// builder, a dloss.Graph binding, a trace rule for every op not marked
// Dloss_Internal) are checked by GraphCompletenessTest.cpp and
// test/python/test_op_completeness.py.
#include "dialect/DlossOps.h"
#include "driver/Compile.h"
#include "runtime/kernels/KernelTable.h"
#include "runtime/kernels/OpTable.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

/// The ops the numeric oracle (test/numeric/dloss_sim.py) gives a meaning.
std::set<std::string> oracleOps() {
  std::string command =
      std::string(DLOSS_TORCH_PYTHON) + " " + DLOSS_SIMULATOR + " --list-ops";
  std::unique_ptr<FILE, int (*)(FILE *)> pipe(popen(command.c_str(), "r"),
                                              pclose);
  std::set<std::string> ops;
  if (!pipe)
    return ops;
  std::array<char, 256> line;
  while (fgets(line.data(), line.size(), pipe.get())) {
    std::string name(line.data());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r'))
      name.pop_back();
    if (!name.empty())
      ops.insert(name);
  }
  return ops;
}

struct Registered {
  Registered() : context(registry()) { context.loadAllAvailableDialects(); }
  static mlir::DialectRegistry registry() {
    mlir::DialectRegistry registry;
    mlir::dloss::registerLossDialects(registry);
    return registry;
  }
  mlir::MLIRContext context;
};

TEST(OpCompleteness, EveryPlanOpHasEveryRule) {
  Registered registered;
  std::set<std::string> oracle = oracleOps();
  ASSERT_FALSE(oracle.empty())
      << "could not list the oracle's ops (" << DLOSS_TORCH_PYTHON << " "
      << DLOSS_SIMULATOR << " --list-ops)";
  const auto &kernels = dloss::kernelTable();

  std::vector<std::string> missing;
  int dlossOps = 0;
  for (mlir::RegisteredOperationName op :
       registered.context.getRegisteredOperations()) {
    std::string name = op.getStringRef().str();
    bool isDloss = op.getDialectNamespace() == "dloss";
    bool isPlanOp = isDloss || kernels.count(name);
    if (!isPlanOp)
      continue; // arith ops a plan never holds need no rules
    dlossOps += isDloss;
    auto lacks = [&](const char *rule) {
      missing.push_back(name + " has no " + rule);
    };
    // Index arithmetic and constants carry no gradient and are replicated
    // when their operands are: only dloss ops need these two.
    if (isDloss && !op.hasInterface<mlir::dloss::AdjointOpInterface>())
      lacks("adjoint rule (AdjointOpInterface, dialect/DlossAdjoints.cpp)");
    if (isDloss && !op.hasInterface<mlir::dloss::ReplicationOpInterface>())
      lacks("replication rule (ReplicationOpInterface, dialect/DlossOps.cpp)");
    if (!op.hasInterface<mlir::dloss::CostOpInterface>())
      lacks("cost rule (CostOpInterface, dialect/DlossCosts.cpp)");
    if (!kernels.count(name))
      lacks("runtime kernel (runtime kernel table)");
    if (!dloss::findOpSpec(name))
      lacks("op-table entry (runtime/OpTable.inc: cmake --build build "
            "--target dloss-op-table)");
    if (!oracle.count(name))
      lacks("oracle rule (test/numeric/dloss_sim.py)");
  }
  // And nothing runs that the compiler cannot emit.
  for (const auto &entry : kernels)
    if (!mlir::RegisteredOperationName::lookup(entry.first,
                                               &registered.context))
      missing.push_back(entry.first +
                        " has a runtime kernel but is no registered op");

  EXPECT_GT(dlossOps, 40) << "the dloss dialect's ops were not registered";
  std::string text;
  for (const std::string &line : missing)
    text += "  " + line + "\n";
  EXPECT_TRUE(missing.empty()) << "ops with missing rules:\n" << text;
}

} // namespace
