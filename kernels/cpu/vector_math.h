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

// The index of the largest of `size` floats, the first of equal ones; with a NaN among them, the first NaN, as
// torch.argmax gives. One pass keeps each of 8 lanes' largest value and its first index (GCC does not vectorise a
// scalar max over floats, as NaN makes it order-dependent), then the lanes are compared.
inline int first_argmax(const float* row, int size) {
  typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
  typedef int v8i __attribute__((vector_size(8 * sizeof(int))));
  const int whole = size / 8 * 8;
  int best = 0, nan = 0;
  if (whole) {
    v8 top, v;
    v8i at = {0, 1, 2, 3, 4, 5, 6, 7}, index = at, nans = {};
    std::memcpy(&top, row, sizeof top);
    for (int i = 8; i < whole; i += 8) {
      std::memcpy(&v, row + i, sizeof v);
      index += 8;
      const v8i larger = v > top;
      top = larger ? v : top;
      at = larger ? index : at;
      nans |= v != v;
    }
    for (int lane = 1; lane < 8; ++lane)
      if (top[lane] > top[best] || (top[lane] == top[best] && at[lane] < at[best])) best = lane;
    for (int lane = 0; lane < 8; ++lane) nan |= nans[lane] | (top[lane] != top[lane]);
    best = at[best];
  }
  for (int i = whole; i < size; ++i) {
    nan |= row[i] != row[i];
    if (row[i] > row[best]) best = i;
  }
  if (nan) {
    best = 0;
    while (row[best] == row[best]) ++best;
  }
  return best;
}

}  // namespace kernels
