// "file:line:col" of an MLIR location (see LocationText.h).
#include "passes/LocationText.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

using namespace mlir;

std::string dloss::locationText(Location loc, bool fileNameOnly) {
  std::string text;
  loc->walk([&](Location inner) {
    if (auto file = dyn_cast<FileLineColLoc>(inner)) {
      StringRef name = file.getFilename().getValue();
      if (fileNameOnly)
        name = llvm::sys::path::filename(name);
      text =
          llvm::formatv("{0}:{1}:{2}", name, file.getLine(), file.getColumn())
              .str();
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return text;
}
