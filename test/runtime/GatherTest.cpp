// gatherUneven on real Gloo processes: uneven (and empty) shards, and the
// shared error on a mismatch.
#include "runtime/comm/Gather.h"
#include "runtime/support/Error.h"
#include "test/runtime/MultiProcess.h"

#include <gtest/gtest.h>

namespace {

using namespace dloss::test;

at::Tensor shard(int rank, int64_t rows, at::ScalarType type) {
  return (at::arange(rows * 3, at::kLong).reshape({rows, 3}) + 100 * rank)
      .to(type);
}

TEST(GatherUnevenTest, ConcatenatesUnevenShardsInRankOrder) {
  const std::vector<int64_t> rows = {5, 0, 2};
  runGloo(3, [&](dloss::Communicator &comm) {
    for (at::ScalarType type : {at::kFloat, at::kLong}) {
      at::Tensor got = dloss::gatherUneven(
          comm, shard(comm.rank(), rows[comm.rank()], type));
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < 3; ++r)
        pieces.push_back(shard(r, rows[r], type));
      at::Tensor want = at::cat(pieces, 0);
      CHILD_CHECK(got.sizes() == want.sizes() && at::equal(got, want),
                  "gathered rows differ from the rank-ordered concatenation");
      // Along axis 1: columns vary, rows agree.
      at::Tensor cols = at::full({2, comm.rank() + 1}, comm.rank(), at::kLong);
      at::Tensor byCols = dloss::gatherUneven(comm, cols, 1);
      CHILD_CHECK(byCols.size(1) == 6 && byCols[0][5].item<int64_t>() == 2,
                  "gathering along axis 1 is wrong");
    }
  });
}

TEST(GatherUnevenTest, MismatchRaisesTheSameErrorOnEveryRank) {
  runGloo(3, [&](dloss::Communicator &comm) {
    int64_t features = comm.rank() == 2 ? 4 : 3;
    try {
      dloss::gatherUneven(comm, at::zeros({2, features}));
      CHILD_CHECK(false, "a feature-size mismatch was accepted");
    } catch (const dloss::Error &e) {
      std::string message = e.what();
      CHILD_CHECK(
          message.find("ranks 0,1 passed Float [2, 3]") != std::string::npos &&
              message.find("rank 2 passed Float [2, 4]") != std::string::npos,
          "unexpected message: " << message);
    }
  });
}

} // namespace
