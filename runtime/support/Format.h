// Text forms of shapes and rank lists for the runtime's messages, one spelling
// everywhere.
#ifndef DLOSS_RUNTIME_SUPPORT_FORMAT_H
#define DLOSS_RUNTIME_SUPPORT_FORMAT_H

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dloss {

/// "[4, 8]"; a negative size (unknown, in a plan's types) prints as "?", and
/// `truncated` (more dimensions than were recorded) appends ", ...".
std::string shapeText(c10::ArrayRef<int64_t> sizes, bool truncated = false);

/// "0,1,3" with `separator` ",".
std::string joinInts(const std::vector<int> &values, const char *separator);

/// "rank 2", or "ranks 0,1,3" with `separator` ",".
std::string rankList(const std::vector<int> &ranks,
                     const char *separator = ",");

} // namespace dloss

#endif // DLOSS_RUNTIME_SUPPORT_FORMAT_H
