// The scalar rules of every instruction of the fused similarity's tile
// program, forward and reverse, written once for the CPU kernels and the
// CUDA tiles. The program's encoding, which the compiler writes, is
// runtime/plan/TileEncoding.h's.
//
// No MLIR, ATen or CUDA type appears here: plain C++ that nvcc also compiles
// (DLOSS_HD marks the functions both sides call).
#ifndef DLOSS_RUNTIME_FUSED_EPILOGUE_H
#define DLOSS_RUNTIME_FUSED_EPILOGUE_H

#include "runtime/plan/TileEncoding.h"

#include <cmath>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include "runtime/fused/FastMath.h"
#endif

namespace dloss::epilogue {

//===----------------------------------------------------------------------===//
// Scalar rules: the one definition of every instruction's value and
// derivative, instantiated per opcode (so a CPU loop over a row segment has
// no switch inside and vectorises) or dispatched per element (CUDA).
//===----------------------------------------------------------------------===//

namespace detail {
// float exp and log: the device's own on CUDA; on the host, straight-line
// versions (FastMath.h) that let the CPU's loops over a row vectorise.
#if defined(__CUDA_ARCH__)
DLOSS_HD float exp_(float x) { return ::expf(x); }
DLOSS_HD float expNonPositive_(float x) { return ::expf(x); }
DLOSS_HD float log_(float x) { return ::logf(x); }
DLOSS_HD float log1p_(float x) { return ::log1pf(x); }
#else
DLOSS_HD float exp_(float x) { return fastmath::exp(x); }
/// exp of x <= 88 (a difference from a maximum or log-sum-exp): the CPU
/// loops' cheaper form (fastmath::expNonPositive).
DLOSS_HD float expNonPositive_(float x) { return fastmath::expNonPositive(x); }
DLOSS_HD float log_(float x) { return fastmath::log(x); }
DLOSS_HD float log1p_(float x) { return fastmath::log1p(x); }
#endif
DLOSS_HD double exp_(double x) { return ::exp(x); }
DLOSS_HD double expNonPositive_(double x) { return ::exp(x); }
DLOSS_HD double log_(double x) { return ::log(x); }
DLOSS_HD double log1p_(double x) { return ::log1p(x); }
DLOSS_HD float cos_(float x) { return ::cosf(x); }
DLOSS_HD double cos_(double x) { return ::cos(x); }
DLOSS_HD float sin_(float x) { return ::sinf(x); }
DLOSS_HD double sin_(double x) { return ::sin(x); }
DLOSS_HD float acos_(float x) { return ::acosf(x); }
DLOSS_HD double acos_(double x) { return ::acos(x); }
DLOSS_HD float sqrt_(float x) { return ::sqrtf(x); }
DLOSS_HD double sqrt_(double x) { return ::sqrt(x); }
DLOSS_HD float abs_(float x) { return ::fabsf(x); }
DLOSS_HD double abs_(double x) { return ::fabs(x); }
} // namespace detail

/// softplus(x) = log(1 + exp(x)), computed stably (as the dialect defines it).
template <typename T> DLOSS_HD T softplus(T x) {
  return (x > T(0) ? x : T(0)) + detail::log1p_(detail::exp_(-detail::abs_(x)));
}

template <typename T> DLOSS_HD T sigmoid(T x) {
  // exp of a non-positive number only: no overflow. Both sides computed,
  // no branch, so a loop over a row vectorises.
  T e = detail::exp_(-detail::abs_(x));
  T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}

/// The value of arithmetic instruction `O` on register values a, b, c (b
/// and c are unused by unary opcodes; Clamp reads its bounds from `ins`).
template <Op O, typename T> DLOSS_HD T apply(T a, T b, T c, const Instr &ins) {
  using namespace detail;
  if constexpr (O == Op::Add)
    return a + b;
  else if constexpr (O == Op::Sub)
    return a - b;
  else if constexpr (O == Op::Mul)
    return a * b;
  else if constexpr (O == Op::Div)
    return a / b;
  else if constexpr (O == Op::Neg)
    return -a;
  else if constexpr (O == Op::Exp)
    return exp_(a);
  else if constexpr (O == Op::Log)
    return log_(a);
  else if constexpr (O == Op::Softplus)
    return softplus(a);
  else if constexpr (O == Op::LogSigmoid)
    return -softplus(-a);
  else if constexpr (O == Op::Sigmoid)
    return sigmoid(a);
  else if constexpr (O == Op::Cos)
    return cos_(a);
  else if constexpr (O == Op::Acos)
    return acos_(a);
  else if constexpr (O == Op::Sin)
    return sin_(a);
  else if constexpr (O == Op::Sqrt)
    return sqrt_(a);
  else if constexpr (O == Op::Clamp) {
    T lo = T(bitsToDouble(ins.b)), hi = T(bitsToDouble(ins.c));
    return a < lo ? lo : (a > hi ? hi : a);
  } else if constexpr (O == Op::Eq)
    return a == b ? T(1) : T(0);
  else if constexpr (O == Op::Select)
    return a != T(0) ? b : c;
  else if constexpr (O == Op::StopGradient)
    return a;
  else
    return T(0);
}

/// The cotangents instruction `O` passes to its register operands, given
/// its operands a, b, c, its value `out` and its cotangent `ct`: adds to
/// da, db, dc. The rules are the dialect's adjoints (dialect/DlossAdjoints.cpp)
/// on scalars; Eq, StopGradient and Select's condition carry no gradient, a
/// clamp passes the gradient where its input lies inside the bounds (bounds
/// included).
template <Op O, typename T>
DLOSS_HD void adjoint(T a, T b, T c, T out, T ct, const Instr &ins, T &da,
                      T &db, T &dc) {
  using namespace detail;
  (void)b;
  (void)c;
  (void)ins;
  if constexpr (O == Op::Add) {
    da += ct;
    db += ct;
  } else if constexpr (O == Op::Sub) {
    da += ct;
    db -= ct;
  } else if constexpr (O == Op::Mul) {
    da += ct * b;
    db += ct * a;
  } else if constexpr (O == Op::Div) {
    da += ct / b;
    db -= ct * a / (b * b);
  } else if constexpr (O == Op::Neg)
    da -= ct;
  else if constexpr (O == Op::Exp)
    da += ct * out;
  else if constexpr (O == Op::Log)
    da += ct / a;
  else if constexpr (O == Op::Softplus)
    da += ct * sigmoid(a);
  else if constexpr (O == Op::LogSigmoid)
    da += ct * sigmoid(-a);
  else if constexpr (O == Op::Sigmoid)
    da += ct * out * (T(1) - out);
  else if constexpr (O == Op::Cos)
    da -= ct * sin_(a);
  else if constexpr (O == Op::Acos)
    da -= ct / sqrt_(T(1) - a * a);
  else if constexpr (O == Op::Sin)
    da += ct * cos_(a);
  else if constexpr (O == Op::Sqrt)
    da += ct / (T(2) * out);
  else if constexpr (O == Op::Clamp) {
    if (out == a)
      da += ct;
  } else if constexpr (O == Op::Select) {
    if (a != T(0))
      db += ct;
    else
      dc += ct;
  }
  // Eq, StopGradient: no gradient.
}

/// What instruction O's adjoint reads besides its cotangent: kReadsA, B, C
/// (operands) and kReadsOut (its own value). The CPU backward evaluates only
/// the registers some adjoint or log-sum-exp seed reads (a softplus whose
/// sum is a result is not recomputed there).
enum : int { kReadsA = 1, kReadsB = 2, kReadsC = 4, kReadsOut = 8 };
DLOSS_HD int adjointReads(Op op) {
  switch (op) {
  case Op::Add:
  case Op::Sub:
  case Op::Neg:
  case Op::Eq:
  case Op::StopGradient:
    return 0;
  case Op::Mul:
  case Op::Div:
    return kReadsA | kReadsB;
  case Op::Exp:
  case Op::Sigmoid:
  case Op::Sqrt:
    return kReadsOut;
  case Op::Clamp:
    return kReadsA | kReadsOut;
  case Op::Select: // the condition
  case Op::Log:
  case Op::Softplus:
  case Op::LogSigmoid:
  case Op::Cos:
  case Op::Acos:
  case Op::Sin:
    return kReadsA;
  default: // leaves
    return 0;
  }
}

/// Calls fn(std::integral_constant-like tag) with the opcode as a template
/// argument: `visit<T>(op, [&](auto tag) { apply<decltype(tag)::value, T>...
/// })`. Leaves are not dispatched (their value comes from the kernel).
template <Op O> struct OpTag { static constexpr Op value = O; };

template <typename Fn> DLOSS_HD void dispatch(Op op, Fn &&fn) {
  switch (op) {
#define DLOSS_EPILOGUE_CASE(name)                                              \
  case Op::name:                                                               \
    fn(OpTag<Op::name>{});                                                     \
    break;
    DLOSS_EPILOGUE_CASE(Add)
    DLOSS_EPILOGUE_CASE(Sub)
    DLOSS_EPILOGUE_CASE(Mul)
    DLOSS_EPILOGUE_CASE(Div)
    DLOSS_EPILOGUE_CASE(Neg)
    DLOSS_EPILOGUE_CASE(Exp)
    DLOSS_EPILOGUE_CASE(Log)
    DLOSS_EPILOGUE_CASE(Softplus)
    DLOSS_EPILOGUE_CASE(LogSigmoid)
    DLOSS_EPILOGUE_CASE(Sigmoid)
    DLOSS_EPILOGUE_CASE(Cos)
    DLOSS_EPILOGUE_CASE(Acos)
    DLOSS_EPILOGUE_CASE(Sin)
    DLOSS_EPILOGUE_CASE(Sqrt)
    DLOSS_EPILOGUE_CASE(Clamp)
    DLOSS_EPILOGUE_CASE(Eq)
    DLOSS_EPILOGUE_CASE(Select)
    DLOSS_EPILOGUE_CASE(StopGradient)
#undef DLOSS_EPILOGUE_CASE
  default:
    break;
  }
}

/// The value of one element, all registers at once (the CUDA tiles' form):
/// `regs` has one slot per instruction; leaf values come from `leaf(ins)`.
template <typename T, typename Leaf>
DLOSS_HD void evaluate(const Instr *program, int64_t count, T *regs,
                       Leaf &&leaf) {
  for (int64_t t = 0; t < count; ++t) {
    const Instr &ins = program[t];
    if (registerOperands(ins.op) == 0) {
      regs[t] = ins.op == Op::Const ? T(bitsToDouble(ins.a)) : leaf(ins);
      continue;
    }
    T a = regs[ins.a];
    T b = registerOperands(ins.op) > 1 ? regs[ins.b] : T(0);
    T c = registerOperands(ins.op) > 2 ? regs[ins.c] : T(0);
    dispatch(ins.op, [&](auto tag) {
      regs[t] = apply<decltype(tag)::value, T>(a, b, c, ins);
    });
  }
}

/// The reverse sweep of one element after `evaluate`: `cts` holds the
/// cotangents of the output registers (zero elsewhere) and receives every
/// register's cotangent, leaves included.
template <typename T>
DLOSS_HD void reverse(const Instr *program, int64_t count, const T *regs,
                      T *cts) {
  for (int64_t t = count - 1; t >= 0; --t) {
    const Instr &ins = program[t];
    int operands = registerOperands(ins.op);
    if (operands == 0 || cts[t] == T(0))
      continue;
    T a = regs[ins.a];
    T b = operands > 1 ? regs[ins.b] : T(0);
    T c = operands > 2 ? regs[ins.c] : T(0);
    T da = 0, db = 0, dc = 0;
    dispatch(ins.op, [&](auto tag) {
      adjoint<decltype(tag)::value, T>(a, b, c, regs[t], cts[t], ins, da, db,
                                       dc);
    });
    cts[ins.a] += da;
    if (operands > 1)
      cts[ins.b] += db;
    if (operands > 2)
      cts[ins.c] += dc;
  }
}

} // namespace dloss::epilogue

#endif // DLOSS_RUNTIME_FUSED_EPILOGUE_H
