// "file:line:col" of an MLIR location, as plans and reports show it.
#ifndef DLOSS_PASSES_LOCATIONTEXT_H
#define DLOSS_PASSES_LOCATIONTEXT_H

#include "mlir/IR/Location.h"

#include <string>

namespace mlir::dloss {

/// The first file location inside `loc` as "file:line:col"; empty when it
/// has none. `fileNameOnly` drops the directory, so that reports read the same
/// wherever the source lies; plans keep the path users wrote.
std::string locationText(Location loc, bool fileNameOnly = false);

} // namespace mlir::dloss

#endif // DLOSS_PASSES_LOCATIONTEXT_H
