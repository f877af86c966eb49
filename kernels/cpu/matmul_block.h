// The register-blocked inner product shared by the CPU matmul kernels: a block of up to kRows input rows
// times one packed tile of kTile output columns, [in, kTile] floats, its sums held in registers over the whole
// input dimension.
#pragma once

#include "vector_math.h"

namespace kernels {

constexpr int kVectors = 2;  // output vectors per row in a block: kRows * kVectors sums + kVectors weights
constexpr int kRows = 6;     // + 1 broadcast fit AVX2's 16 registers
constexpr int kTile = kVectors * kLanes;

// Where a block's results go: row i to outs[i], plus `bias` (or none), times scales[i].
struct Epilogue {
  float* outs[kRows];
  float scales[kRows];
  const float* bias;
};

// rows[0..R) times the packed tile `w` [in, kTile], finished as `end` says.
template <int R>
inline void block(const float* const* rows, const float* w, int in, const Epilogue& end) {
  vf acc[R][kVectors] = {};
  for (int k = 0; k < in; ++k) {
    vf b[kVectors];
    for (int v = 0; v < kVectors; ++v) b[v] = load(w + (k * kTile + v * kLanes));
    for (int i = 0; i < R; ++i) {
      const float a = rows[i][k];
      for (int v = 0; v < kVectors; ++v) acc[i][v] += a * b[v];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < kVectors; ++v) {
      vf sum = acc[i][v];
      if (end.bias) sum += load(end.bias + v * kLanes);
      store(end.outs[i] + v * kLanes, sum * end.scales[i]);
    }
}

// rows[0..count) (count <= kRows) times the tile `w`.
inline void any_block(int count, const float* const* rows, const float* w, int in, const Epilogue& end) {
  switch (count) {
    case 6: block<6>(rows, w, in, end); break;
    case 5: block<5>(rows, w, in, end); break;
    case 4: block<4>(rows, w, in, end); break;
    case 3: block<3>(rows, w, in, end); break;
    case 2: block<2>(rows, w, in, end); break;
    default: block<1>(rows, w, in, end);
  }
}

}  // namespace kernels
