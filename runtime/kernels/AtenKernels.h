// The rules of the plan's generic ops, as the kernel table (KernelTable.cpp)
// lists them: one ATen kernel each.
#ifndef DLOSS_RUNTIME_KERNELS_ATENKERNELS_H
#define DLOSS_RUNTIME_KERNELS_ATENKERNELS_H

#include "runtime/kernels/KernelTable.h"

namespace dloss::aten {

using UnaryFn = at::Tensor (*)(const at::Tensor &);
using BinaryFn = at::Tensor (*)(const at::Tensor &, const at::Tensor &);
using IndexFn = int64_t (*)(int64_t, int64_t);

KernelRule unaryRule(UnaryFn fn);

/// Element-wise binary ops: equal shapes, or one 0-d operand broadcast to
/// the other. General broadcasting is refused: it would hide plan bugs.
KernelRule binaryRule(BinaryFn fn);

/// dloss.select: `cond != 0 ? true_value : false_value`, element-wise.
KernelRule selectValuesRule();

at::Tensor eqIndicator(const at::Tensor &lhs, const at::Tensor &rhs);

KernelRule clampRule();

KernelRule castRule();

KernelRule matmulRule();

KernelRule l2NormalizeRule();

/// dloss.l2_normalize_grad: one pass over each row, no input-sized temporary.
KernelRule l2NormalizeGradRule();

KernelRule reduceRule();

/// A rule with a single `axis` attribute, normalised against operand 0.
KernelRule axisRule(void (*fn)(KernelContext &, int64_t axis));

void logsumexpKernel(KernelContext &ctx, int64_t axis);

void takeAlongKernel(KernelContext &ctx, int64_t axis);

KernelRule withFlow(KernelRule rule, ShapeFlow flow);

void putAlongKernel(KernelContext &ctx, int64_t axis);

void crossEntropyKernel(KernelContext &ctx, int64_t axis);

KernelRule arangeRule();

KernelRule expandRule();

void sliceKernel(KernelContext &ctx, int64_t axis);

void padKernel(KernelContext &ctx, int64_t axis);

/// A rule whose kernel needs nothing from the attributes.
KernelRule plainRule(void (*fn)(KernelContext &));

void rankKernel(KernelContext &ctx);

void worldSizeKernel(KernelContext &ctx);

void dimKernel(KernelContext &ctx, int64_t axis);

void shardOffsetKernel(KernelContext &ctx, int64_t axis);

void globalSizeKernel(KernelContext &ctx, int64_t axis);

KernelRule allGatherRule();

KernelRule allReduceRule();

KernelRule reduceScatterRule();

KernelRule broadcastRule();

KernelRule ringShiftRule();

KernelRule constantRule();

KernelRule indexBinaryRule(IndexFn fn);

int64_t wrapAdd(int64_t a, int64_t b);

int64_t wrapSub(int64_t a, int64_t b);

int64_t wrapMul(int64_t a, int64_t b);

int64_t divsi(int64_t a, int64_t b);

KernelRule cmpiRule();

void selectKernel(KernelContext &ctx);

void indexCastKernel(KernelContext &ctx);

} // namespace dloss::aten

#endif // DLOSS_RUNTIME_KERNELS_ATENKERNELS_H
