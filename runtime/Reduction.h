// How collectives and reductions combine values (shared by the runtime and the C++ graph builder).
#ifndef DLOSS_RUNTIME_REDUCTION_H
#define DLOSS_RUNTIME_REDUCTION_H

namespace dloss {
enum class Reduction { Sum, Mean, Max, Min };
} // namespace dloss

#endif // DLOSS_RUNTIME_REDUCTION_H
