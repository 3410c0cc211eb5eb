// Text forms of shapes and rank lists for the runtime's messages.
#include "runtime/support/Format.h"

namespace dloss {

std::string shapeText(c10::ArrayRef<int64_t> sizes, bool truncated) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? ", " : "") +
           (sizes[i] < 0 ? std::string("?") : std::to_string(sizes[i]));
  return out + (truncated ? ", ...]" : "]");
}

std::string joinInts(const std::vector<int> &values, const char *separator) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i)
    out += (i ? separator : "") + std::to_string(values[i]);
  return out;
}

std::string rankList(const std::vector<int> &ranks, const char *separator) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + joinInts(ranks, separator);
}

} // namespace dloss
