// Tests for dloss::Error: message rendering, field accessors and amended
// copies.
#include "runtime/support/Error.h"

#include <gtest/gtest.h>

namespace {

using dloss::Error;
using dloss::ErrorInfo;

TEST(ErrorTest, RendersAllFields) {
  ErrorInfo info;
  info.problem = "shard sizes differ across ranks";
  info.hint = "Pad the last batch or pass sizes explicitly";
  info.rank = 2;
  info.op = "dloss.all_gather";
  info.location = "clip.mlir:12:8";
  Error error(info);
  EXPECT_STREQ(error.what(),
               "dloss error [rank 2, op dloss.all_gather at clip.mlir:12:8]: "
               "shard sizes differ across ranks. Pad the last batch or pass "
               "sizes explicitly.");
}

TEST(ErrorTest, OmitsAbsentParts) {
  EXPECT_STREQ(Error("bad input").what(), "dloss error: bad input.");
  EXPECT_STREQ(Error("bad input", "Fix it").what(),
               "dloss error: bad input. Fix it.");
  EXPECT_STREQ(Error("x").withRank(0).what(), "dloss error [rank 0]: x.");
  EXPECT_STREQ(Error("x").withOp("dloss.exp").what(),
               "dloss error [op dloss.exp]: x.");
  EXPECT_STREQ(Error("x").withLocation("a.mlir:1:2").what(),
               "dloss error [at a.mlir:1:2]: x.");
  EXPECT_STREQ(Error("x").withRank(3).withLocation("a.mlir:1:2").what(),
               "dloss error [rank 3, at a.mlir:1:2]: x.");
  EXPECT_STREQ(Error("").what(), "dloss error: unknown error.");
}

TEST(ErrorTest, KeepsExistingPunctuation) {
  EXPECT_STREQ(Error("done.", "Really?").what(), "dloss error: done. Really?");
  EXPECT_STREQ(Error("stop!").what(), "dloss error: stop!");
}

TEST(ErrorTest, AccessorsReturnFields) {
  Error error =
      Error("p", "h").withRank(1).withOp("dloss.matmul").withLocation("l:1:1");
  EXPECT_EQ(error.problem(), "p");
  EXPECT_EQ(error.hint(), "h");
  ASSERT_TRUE(error.rank().has_value());
  EXPECT_EQ(*error.rank(), 1);
  EXPECT_EQ(error.op(), "dloss.matmul");
  EXPECT_EQ(error.location(), "l:1:1");
  EXPECT_EQ(error.fields().op, "dloss.matmul");

  Error bare("p");
  EXPECT_FALSE(bare.rank().has_value());
  EXPECT_TRUE(bare.hint().empty());
  EXPECT_TRUE(bare.op().empty());
  EXPECT_TRUE(bare.location().empty());
}

TEST(ErrorTest, WithCopiesLeaveTheOriginalUnchanged) {
  Error original("p");
  Error amended = original.withRank(5).withHint("do this");
  EXPECT_FALSE(original.rank().has_value());
  EXPECT_STREQ(original.what(), "dloss error: p.");
  EXPECT_STREQ(amended.what(), "dloss error [rank 5]: p. do this.");
  // Replacing a field re-renders the message.
  EXPECT_STREQ(amended.withRank(6).what(), "dloss error [rank 6]: p. do this.");
}

TEST(ErrorTest, CatchableAsStdRuntimeErrorWithTheSameMessage) {
  try {
    throw Error("p", "h").withOp("dloss.all_reduce");
  } catch (const std::runtime_error &e) {
    EXPECT_STREQ(e.what(), "dloss error [op dloss.all_reduce]: p. h.");
    return;
  }
  FAIL() << "dloss::Error was not caught as std::runtime_error";
}

TEST(ErrorTest, RethrowAddsContext) {
  bool caught = false;
  try {
    try {
      throw Error("timeout in collective", "Check that every rank called it");
    } catch (const Error &e) {
      throw e.withRank(3).withOp("dloss.all_gather");
    }
  } catch (const Error &e) {
    EXPECT_EQ(e.problem(), "timeout in collective");
    EXPECT_STREQ(e.what(), "dloss error [rank 3, op dloss.all_gather]: "
                           "timeout in collective. Check that every rank "
                           "called it.");
    caught = true;
  }
  EXPECT_TRUE(caught);
}

} // namespace
