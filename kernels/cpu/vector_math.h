// Math shared by the CPU kernels, written so that GCC vectorises the loops that call it.
#pragma once

#include <algorithm>
#include <cstring>

namespace kernels {

// e^x for x <= 0: 2^(x log2 e) as an integer power (exponent bits) times 2^f, |f| <= 1/2, from a
// degree-7 polynomial (relative error ~5e-9). Unlike expf it vectorises.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float n = __builtin_nearbyintf(t);
  const float f = (t - n) * 0.69314718055994531f;
  const float p = 1.0f + f * (1.0f + f * (1.0f / 2 + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 +
                  f * (1.0f / 720 + f * (1.0f / 5040)))))));
  const int bits = (static_cast<int>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return p * power;
}

}  // namespace kernels
