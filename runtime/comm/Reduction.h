// How collectives and reductions combine values (shared by the runtime and the
// C++ graph builder).
#ifndef DLOSS_RUNTIME_REDUCTION_H
#define DLOSS_RUNTIME_REDUCTION_H

namespace dloss {
enum class Reduction { Sum, Mean, Max, Min };

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
