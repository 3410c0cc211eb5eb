// Gathering per-rank results of different sizes (metrics over a whole, unevenly
// split evaluation set).
#ifndef DLOSS_RUNTIME_GATHER_H
#define DLOSS_RUNTIME_GATHER_H

#include "runtime/comm/Communicator.h"

namespace dloss {

/// Every rank's `local` concatenated along `axis` in rank order, on every
/// rank, when the ranks hold different sizes along `axis` (the last batch,
/// filtered data, a rank with none): embeddings, labels or scores for
/// retrieval metrics. It exchanges the sizes first; if the ranks disagree on
/// anything else (dtype, number of dims, another dimension), every rank
/// raises the same dloss::Error naming the ranks and shapes. Collective:
/// every rank must call it.
at::Tensor gatherUneven(Communicator &comm, const at::Tensor &local,
                        int64_t axis = 0);

} // namespace dloss

#endif // DLOSS_RUNTIME_GATHER_H
