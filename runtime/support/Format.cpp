// Text forms of shapes for the runtime's messages.
#include "runtime/support/Format.h"

namespace dloss {

std::string shapeText(c10::ArrayRef<int64_t> sizes, bool truncated) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? ", " : "") +
           (sizes[i] < 0 ? std::string("?") : std::to_string(sizes[i]));
  return out + (truncated ? ", ...]" : "]");
}

} // namespace dloss
