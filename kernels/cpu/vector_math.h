// Math shared by the CPU kernels, written so that GCC vectorises the loops that call it.
#pragma once

#include <algorithm>
#include <cstring>

namespace kernels {

// The CPU's own vector width in floats (GCC vector extensions compile wider vectors to slow generic code), and
// unaligned loads and stores of one vector.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// e^x for x <= 0: e^x = 2^n * e^f with n the integer nearest x / ln 2 (put into the exponent bits) and
// f = x - n ln 2 (|f| <= ln 2 / 2, with ln 2 split in two so the subtraction stays exact) from a degree-7
// polynomial. Relative error about 1e-7 over [-87, 0]; below -87 it returns e^-87. Unlike expf it vectorises
// (given build.py's -fno-trapping-math, without which GCC keeps the clamp as a branch).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = __builtin_nearbyintf(x * 1.44269504088896341f);
  const float f = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  const float p = 1.0f + f * (1.0f + f * (1.0f / 2 + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 +
                  f * (1.0f / 720 + f * (1.0f / 5040)))))));
  const int bits = (static_cast<int>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return p * power;
}

}  // namespace kernels
