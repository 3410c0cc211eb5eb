// How collectives and reductions combine values (shared by the runtime and the
// C++ graph builder).
#ifndef DLOSS_RUNTIME_REDUCTION_H
#define DLOSS_RUNTIME_REDUCTION_H

#include <optional>
#include <string>

namespace dloss {
enum class Reduction { Sum, Mean, Max, Min };

/// The reduction a plan or a caller names "sum", "mean", "max" or "min";
/// nullopt for any other name (the caller says why it is wrong).
inline std::optional<Reduction> reductionFromName(const std::string &name) {
  if (name == "sum")
    return Reduction::Sum;
  if (name == "mean")
    return Reduction::Mean;
  if (name == "max")
    return Reduction::Max;
  if (name == "min")
    return Reduction::Min;
  return std::nullopt;
}

/// "Sum", "Mean", "Max" or "Min", for messages.
inline const char *reductionName(Reduction op) {
  switch (op) {
  case Reduction::Sum:
    return "Sum";
  case Reduction::Mean:
    return "Mean";
  case Reduction::Max:
    return "Max";
  case Reduction::Min:
    return "Min";
  }
  return "?";
}
} // namespace dloss

#endif // DLOSS_RUNTIME_REDUCTION_H
