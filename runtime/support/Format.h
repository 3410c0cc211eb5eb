// Text forms of shapes for the runtime's messages, one spelling everywhere:
// "[4, ?, 8]".
#ifndef DLOSS_RUNTIME_SUPPORT_FORMAT_H
#define DLOSS_RUNTIME_SUPPORT_FORMAT_H

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace dloss {

/// "[4, 8]"; a negative size (unknown, in a plan's types) prints as "?", and
/// `truncated` (more dimensions than were recorded) appends ", ...".
std::string shapeText(c10::ArrayRef<int64_t> sizes, bool truncated = false);

} // namespace dloss

#endif // DLOSS_RUNTIME_SUPPORT_FORMAT_H
