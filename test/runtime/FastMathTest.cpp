// The CPU epilogue's float exp and log (runtime/fused/FastMath.h) against
// libm: within 2 ulp over the whole float range, IEEE at the edges.
#include "runtime/fused/FastMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

/// The distance in units in the last place between two finite floats; inf
/// when `got` is not finite (std::max would drop a NaN and pass the check).
double ulps(float got, double want) {
  float w = static_cast<float>(want);
  if (got == w)
    return 0;
  if (!std::isfinite(got))
    return std::numeric_limits<double>::infinity();
  float step = std::nextafter(w, std::numeric_limits<float>::infinity()) - w;
  return std::fabs(static_cast<double>(got) - want) / step;
}

TEST(FastMath, ExpWithinTwoUlps) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.000731f)
    worst = std::max(worst, ulps(dloss::fastmath::exp(x), std::exp(double(x))));
  EXPECT_LE(worst, 2.0);
}

// The hot loops' exp of differences from a maximum: exp's value wherever
// it is defined (x <= 88), the same edges below.
TEST(FastMath, ExpNonPositiveIsExp) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x = -100.0f; x <= 88.0f; x += 0.000917f)
    ASSERT_EQ(dloss::fastmath::expNonPositive(x), dloss::fastmath::exp(x))
        << "x = " << x;
  for (float x : {-inf, -1000.0f, -87.5f, -87.49f, -0.0f, 0.0f, 1e-7f, 88.0f})
    EXPECT_EQ(dloss::fastmath::expNonPositive(x), dloss::fastmath::exp(x))
        << "x = " << x;
  EXPECT_TRUE(std::isnan(dloss::fastmath::expNonPositive(
      std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMath, LogWithinTwoUlps) {
  double worst = 0;
  // Every binade, subnormals included.
  const float up = std::numeric_limits<float>::infinity();
  for (float x = 1e-44f; x < 3e38f;
       x = std::max(x * 1.000917f, std::nextafter(x, up)))
    worst = std::max(worst, ulps(dloss::fastmath::log(x), std::log(double(x))));
  EXPECT_LE(worst, 2.0);
}

TEST(FastMath, Log1pKeepsSmallArguments) {
  double worst = 0;
  for (float x = -0.9f; x < 10.0f; x += 0.000613f)
    worst =
        std::max(worst, ulps(dloss::fastmath::log1p(x), std::log1p(double(x))));
  for (float x = 1e-30f; x < 1e-3f; x *= 1.37f) // normal: always grows
    worst =
        std::max(worst, ulps(dloss::fastmath::log1p(x), std::log1p(double(x))));
  EXPECT_LE(worst, 4.0);
}

TEST(FastMath, EdgesAreIeee) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(dloss::fastmath::exp(-inf), 0.0f);
  EXPECT_EQ(dloss::fastmath::exp(-1000.0f), 0.0f);
  EXPECT_EQ(dloss::fastmath::exp(inf), inf);
  EXPECT_EQ(dloss::fastmath::exp(1000.0f), inf);
  EXPECT_TRUE(std::isnan(dloss::fastmath::exp(nan)));
  EXPECT_EQ(dloss::fastmath::exp(0.0f), 1.0f);
  EXPECT_EQ(dloss::fastmath::log(0.0f), -inf);
  EXPECT_EQ(dloss::fastmath::log(inf), inf);
  EXPECT_EQ(dloss::fastmath::log(1.0f), 0.0f);
  EXPECT_TRUE(std::isnan(dloss::fastmath::log(-1.0f)));
  EXPECT_TRUE(std::isnan(dloss::fastmath::log(nan)));
  EXPECT_EQ(dloss::fastmath::log1p(0.0f), 0.0f);
  EXPECT_EQ(dloss::fastmath::log1p(-1.0f), -inf);
  EXPECT_EQ(dloss::fastmath::log1p(inf), inf);
}

} // namespace
