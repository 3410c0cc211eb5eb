// exp and log of floats in straight-line arithmetic, so that the CPU loops
// of the tile programs (runtime/fused/Epilogue.h) vectorise: a libm call per
// element cannot. Cephes' polynomials, within 2 ulp of the exact results,
// with IEEE behaviour at the edges (exp(-inf) = 0, exp(inf) = inf, log(0) =
// -inf, log of a negative or NaN is NaN). Host only: the CUDA tiles use the
// device's own expf/logf.
#ifndef DLOSS_RUNTIME_FUSED_FASTMATH_H
#define DLOSS_RUNTIME_FUSED_FASTMATH_H

#include <cstdint>
#include <cstring>
#include <limits>

// Forced inline: a call per element (the runtime is a shared library, so
// even an inline function may go through the PLT) stops vectorisation.
#if defined(__GNUC__)
#define DLOSS_FASTMATH inline __attribute__((always_inline))
#else
#define DLOSS_FASTMATH inline
#endif

namespace dloss::fastmath {

DLOSS_FASTMATH float asFloat(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

DLOSS_FASTMATH int32_t asBits(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

/// e^x = p 2^k for x in [-87.5, 88.5]: range reduction x = k ln 2 + r,
/// |r| <= ln 2 / 2, then a degree-7 polynomial p for e^r.
struct ExpParts {
  float p;
  int32_t k;
};

DLOSS_FASTMATH ExpParts expParts(float x) {
  // Round x / ln 2 to an integer with the 1.5 * 2^23 trick (no SSE4.1).
  const float shifter = 12582912.0f;
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  float r = x - n * 0.693359375f; // ln 2, high part
  r = r + n * 2.12194440e-4f;     // minus ln 2's low part
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  return {p, asBits(t) - asBits(shifter)};
}

/// e^x.
DLOSS_FASTMATH float exp(float x) {
  const float inf = std::numeric_limits<float>::infinity();
  float clamped = x < -87.5f ? -87.5f : (x > 88.5f ? 88.5f : x);
  ExpParts e = expParts(clamped);
  // 2^k in the exponent field; k is in [-127, 128] after the clamp, so
  // build it in two halves to stay inside the normal range.
  int32_t k1 = e.k / 2, k2 = e.k - k1;
  float result = e.p * asFloat((k1 + 127) << 23) * asFloat((k2 + 127) << 23);
  result = x < -87.5f ? 0.0f : result; // underflow (and -inf)
  result = x > 88.5f ? inf : result;   // overflow (and +inf)
  return x != x ? x : result;          // NaN
}

/// e^x for x <= 88, the hot loops' exp of a difference from a maximum or a
/// log-sum-exp (<= 0 but for rounding): exp without the overflow branch
/// and with 2^k in one multiplication (k in [-126, 127]). The same value
/// as exp there; NaN propagates through the arithmetic; larger x gives
/// garbage.
DLOSS_FASTMATH float expNonPositive(float x) {
  float clamped = x < -87.5f ? -87.5f : x;
  ExpParts e = expParts(clamped);
  float result = e.p * asFloat((e.k + 127) << 23);
  return x < -87.5f ? 0.0f : result; // underflow (and -inf)
}

/// ln x, for x > 0 as m 2^e with m in [sqrt(1/2), sqrt(2)), then a
/// degree-9 polynomial in m - 1.
DLOSS_FASTMATH float log(float x) {
  const float inf = std::numeric_limits<float>::infinity();
  // Subnormals: scale up by 2^23 first.
  bool tiny = x < 1.17549435e-38f;
  float y = tiny ? x * 8388608.0f : x;
  int32_t bits = asBits(y);
  int32_t e = ((bits >> 23) & 0xff) - 126;
  float m = asFloat((bits & 0x007fffff) | 0x3f000000); // [0.5, 1)
  bool low = m < 0.707106781186547524f;
  e = low ? e - 1 : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  p = p * m * z;
  float fe = static_cast<float>(e) - (tiny ? 23.0f : 0.0f);
  p = p + fe * -2.12194440e-4f;
  p = p - 0.5f * z;
  float result = m + p + fe * 0.693359375f;
  result = x == 0.0f ? -inf : result;
  result = x == inf ? inf : result;
  return x < 0.0f || x != x ? std::numeric_limits<float>::quiet_NaN() : result;
}

/// ln(1 + x), accurate for small x: log(u) * x / (u - 1) with u = 1 + x
/// corrects the rounding of 1 + x (Goldberg's trick).
DLOSS_FASTMATH float log1p(float x) {
  float u = 1.0f + x;
  float d = u - 1.0f;
  float l = log(u);
  return d == 0.0f
             ? x
             : (u == std::numeric_limits<float>::infinity() ? u : l * (x / d));
}

} // namespace dloss::fastmath

#endif // DLOSS_RUNTIME_FUSED_FASTMATH_H
