// gatherUneven: sizes first, then one all_gather.
#include "runtime/comm/Gather.h"

#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <map>

namespace dloss {

namespace {
constexpr int64_t kMaxDims = 8;

// "Float [3, 4]": a rank's dtype and shape from its record.
std::string recordText(const int64_t *record) {
  return std::string(c10::toString(static_cast<at::ScalarType>(record[0]))) +
         " " + shapeText(c10::ArrayRef<int64_t>(record + 2, record[1]));
}
} // namespace

at::Tensor gatherUneven(Communicator &comm, const at::Tensor &local,
                        int64_t axis) {
  // Each rank: dtype, ndim, sizes (-1 padded); a bad local call still
  // takes part, so that no rank raises alone.
  std::vector<int64_t> mine(2 + kMaxDims, -1);
  bool usable = local.defined() && local.dim() <= kMaxDims && local.dim() > 0;
  if (usable) {
    mine[0] = static_cast<int64_t>(local.scalar_type());
    mine[1] = local.dim();
    for (int64_t d = 0; d < local.dim(); ++d)
      mine[2 + d] = local.size(d);
  }
  std::vector<int64_t> all = comm.allGatherInts(mine);
  int world = comm.worldSize();
  auto record = [&](int r) {
    return all.data() + static_cast<size_t>(r) * mine.size();
  };

  // Group ranks by everything but the size along `axis`.
  std::map<std::vector<int64_t>, std::vector<int>> groups;
  for (int r = 0; r < world; ++r) {
    std::vector<int64_t> key(record(r), record(r) + mine.size());
    if (key[1] > axis && axis >= 0)
      key[2 + axis] = -2;
    groups[key].push_back(r);
  }
  bool bad = groups.size() != 1 || record(0)[1] < 1 || axis < 0 ||
             axis >= record(0)[1];
  if (bad) {
    std::string problem =
        "gatherUneven along axis " + std::to_string(axis) + ":";
    for (const auto &[key, ranks] : groups) {
      problem += " rank";
      for (size_t i = 0; i < ranks.size(); ++i)
        problem += (i ? "," : (ranks.size() > 1 ? "s " : " ")) +
                   std::to_string(ranks[i]);
      problem += record(ranks.front())[1] < 1
                     ? " passed no tensor of rank 1 to 8;"
                     : " passed " + recordText(record(ranks.front())) + ";";
    }
    problem.pop_back();
    throw Error(problem,
                "Ranks may differ only in the size along the gathered axis");
  }
  std::vector<int64_t> sizes;
  for (int r = 0; r < world; ++r)
    sizes.push_back(record(r)[2 + axis]);
  return comm.allGather(local.contiguous(), axis, sizes);
}

} // namespace dloss
