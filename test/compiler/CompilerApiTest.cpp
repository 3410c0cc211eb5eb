// libdloss_compiler's C API: a loss compiles to a plan the runtime verifies;
// a broken one gives diagnostics as data (severity, file, line, column) and as
// MLIR prints them; a graph is built op by op, its mistakes named with the
// user's line, and printed as MLIR that compiles.
#include "compiler/dloss_compiler.h"
#include "runtime/plan/Plan_generated.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace {

using Result =
    std::unique_ptr<dloss_compile_result, decltype(&dloss_compile_result_free)>;

Result compile(const std::string &source, const char *name = "test.mlir",
               const char *gradMode = "", int fuse = 1) {
  dloss_compile_request request{
      source.data(), source.size(), name, gradMode, fuse, /*general_only=*/0};
  return Result(dloss_compile(&request), dloss_compile_result_free);
}

std::string readExample(const std::string &file) {
  std::ifstream in(std::string(DLOSS_EXAMPLES_DIR) + "/" + file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CompilerApi, VersionAndIdentity) {
  EXPECT_EQ(dloss_compiler_api_version(), DLOSS_COMPILER_API_VERSION);
  EXPECT_EQ(std::string(dloss_compiler_identity()).size(), 64u); // SHA-256
}

TEST(CompilerApi, CompilesALossToAVerifiedPlan) {
  for (int fuse : {1, 0}) {
    Result result =
        compile(readExample("clip.mlir"), "clip.mlir", "global", fuse);
    ASSERT_EQ(dloss_compile_ok(result.get()), 1)
        << dloss_compile_messages(result.get());
    size_t size = 0;
    const uint8_t *bytes = dloss_compile_plan(result.get(), &size);
    ASSERT_GT(size, 0u);
    flatbuffers::Verifier verifier(bytes, size);
    EXPECT_TRUE(dloss::plan::VerifyPlanBuffer(verifier)) << "fuse=" << fuse;
  }
}

TEST(CompilerApi, ReportsDiagnosticsAsData) {
  Result result = compile("func.func @f(%x: tensor<?xf32>) -> tensor<f32> {\n"
                          "  %y = dloss.nonsense %x : tensor<?xf32>\n"
                          "}\n",
                          "broken.mlir");
  EXPECT_EQ(dloss_compile_ok(result.get()), 0);
  size_t size = 1;
  dloss_compile_plan(result.get(), &size);
  EXPECT_EQ(size, 0u);
  ASSERT_GE(dloss_compile_diagnostic_count(result.get()), 1u);
  dloss_diagnostic first = dloss_compile_diagnostic(result.get(), 0);
  EXPECT_EQ(first.severity, DLOSS_SEVERITY_ERROR);
  EXPECT_STREQ(first.file, "broken.mlir");
  EXPECT_EQ(first.line, 2);
  EXPECT_GT(first.column, 0);
  EXPECT_NE(std::string(first.message).find("nonsense"), std::string::npos)
      << first.message;
  std::string printed = dloss_compile_messages(result.get());
  EXPECT_NE(printed.find("broken.mlir:2:"), std::string::npos) << printed;
  EXPECT_NE(printed.find("error:"), std::string::npos) << printed;
}

TEST(CompilerApi, RejectsAnUnknownGradMode) {
  Result result = compile(readExample("clip.mlir"), "clip.mlir", "sideways");
  EXPECT_EQ(dloss_compile_ok(result.get()), 0);
  EXPECT_NE(std::string(dloss_compile_messages(result.get()))
                .find("must be ddp or global"),
            std::string::npos);
}

// A graph as frontend/Graph.cpp drives it: sum(x * 2) over the ranks.
TEST(CompilerApi, BuildsAGraphOpByOp) {
  std::unique_ptr<dloss_graph, decltype(&dloss_graph_destroy)> graph(
      dloss_graph_create("twice"), dloss_graph_destroy);
  dloss_graph_error error{};
  auto add = [&](dloss_graph_call call) {
    call.file = "user.cpp";
    call.line = 7;
    return dloss_graph_add(graph.get(), &call, &error);
  };
  // input "x": f32 (DType 2), grad, not replicated, not state, shape
  // [-1, 3].
  const int64_t inputInts[] = {2, 1, 0, 0, -1, 3};
  dloss_graph_call input{"input",   nullptr, 0,       nullptr, 0,
                         inputInts, 6,       nullptr, 0,       "x"};
  int32_t x = add(input);
  ASSERT_EQ(x, 0) << error.message;
  int64_t dims[2] = {0, 0};
  EXPECT_EQ(dloss_graph_shape(graph.get(), x, dims, 2), 2);
  EXPECT_EQ(dims[0], -1);
  EXPECT_EQ(dims[1], 3);
  const double two = 2.0;
  const int32_t likeX[] = {x};
  int32_t c = add({"constantLike", likeX, 1, nullptr, 0, nullptr, 0, &two, 1});
  ASSERT_GE(c, 0) << error.message;
  const int32_t xc[] = {x, c};
  int32_t y = add({"mul", xc, 2});
  ASSERT_GE(y, 0) << error.message;

  // A mistake: a sum over axis 5 of a 2-d tensor names the op and the
  // user's line, and leaves the graph as it was.
  const int32_t yOnly[] = {y};
  const int64_t sumAxis5[] = {0, 5};
  EXPECT_EQ(add({"reduce", yOnly, 1, nullptr, 0, sumAxis5, 2}), -1);
  EXPECT_STREQ(error.op, "dloss.reduce");
  EXPECT_STREQ(error.location, "user.cpp:7");
  EXPECT_STRNE(error.message, "");
  EXPECT_EQ(add({"no such op"}), -1);
  EXPECT_NE(std::string(error.message).find("no graph op 'no such op'"),
            std::string::npos);

  // sum over both axes (Reduction::Sum = 0), then allReduce Sum.
  const int64_t sumAll[] = {0, 0, 1};
  int32_t s = add({"reduce", yOnly, 1, nullptr, 0, sumAll, 3});
  ASSERT_GE(s, 0) << error.message;
  const int32_t sOnly[] = {s};
  const int64_t sum[] = {0};
  int32_t total = add({"allReduce", sOnly, 1, nullptr, 0, sum, 1});
  ASSERT_GE(total, 0) << error.message;
  const int32_t loss[] = {total};
  const int64_t ddp[] = {0};
  ASSERT_EQ(add({"setLoss", loss, 1, nullptr, 0, ddp, 1}), 0) << error.message;

  std::string text = dloss_graph_mlir(graph.get());
  EXPECT_NE(text.find("dloss.all_reduce"), std::string::npos) << text;
  EXPECT_NE(text.find("user.cpp"), std::string::npos) << text;
  Result result = compile(text, "twice");
  EXPECT_EQ(dloss_compile_ok(result.get()), 1)
      << dloss_compile_messages(result.get());
}

} // namespace
