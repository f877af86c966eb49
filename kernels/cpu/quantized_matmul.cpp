// A projection against a quantized weight on CPU, float32 activations: the weight stays quantized in memory and
// each task dequantizes its tile of kTile output columns into a float buffer (in * kTile floats, in cache), then
// runs the tile's rows through the same register-blocked product as the float kernels (matmul_block.h).
//
// Codes are 8-bit (one byte each) or 4-bit (two per byte, the even column in the low nibble), packed per tile
// as [out / kTile, in, kTile * bits / 8]; a code's value comes from `lut` (so one kernel reads INT4, INT8 and
// FP8 alike), and w[k][c] = (lut[code] - zero[g][c]) * scale[g][c] for the group g = k / group of inputs, with
// scale and zero packed per tile as [out / kTile, in / group, kTile]. Written with GCC vector extensions at the
// CPU's own vector width.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "matmul_block.h"

using kernels::any_block;
using kernels::Epilogue;
using kernels::kRows;
using kernels::kTile;

namespace {

// The tile's weights as floats, [in, kTile].
void dequantize_tile(const uint8_t* codes, int bits, const float* lut, const float* scale, const float* zero,
                     int in, int group, float* w) {
  const int bytes = kTile * bits / 8;
  for (int k = 0; k < in; ++k) {
    const uint8_t* row = codes + static_cast<long>(k) * bytes;
    const float* s = scale + (k / group) * kTile;
    const float* z = zero ? zero + (k / group) * kTile : nullptr;
    float* out = w + static_cast<long>(k) * kTile;
    float values[kTile];
    if (bits == 8) {
      for (int c = 0; c < kTile; ++c) values[c] = lut[row[c]];
    } else {
      for (int c = 0; c < kTile; c += 2) {
        values[c] = lut[row[c / 2] & 15];
        values[c + 1] = lut[row[c / 2] >> 4];
      }
    }
    if (z)
      for (int c = 0; c < kTile; ++c) out[c] = (values[c] - z[c]) * s[c];
    else
      for (int c = 0; c < kTile; ++c) out[c] = values[c] * s[c];
  }
}

}  // namespace

// The width of the tiles that the codes are packed in.
extern "C" int quantized_matmul_tile() { return kTile; }

// out [rows, out_dim] = x [rows, in] @ W.T + bias (or none), W dequantized tile by tile as above.
extern "C" void quantized_matmul_f32(const float* x, long rows, int in, int out_dim, const uint8_t* codes, int bits,
                                     const float* lut, const float* scale, const float* zero, int group,
                                     const float* bias, float* out, int num_threads) {
  const int tiles = out_dim / kTile, groups = in / group;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> w(static_cast<long>(in) * kTile);
#pragma omp for schedule(dynamic, 1)
    for (int tile = 0; tile < tiles; ++tile) {
      const long column = static_cast<long>(tile) * kTile;
      dequantize_tile(codes + column * in * bits / 8, bits, lut, scale + column * groups,
                      zero ? zero + column * groups : nullptr, in, group, w.data());
      for (long r = 0; r < rows; r += kRows) {
        const float* inputs[kRows];
        Epilogue end;
        end.bias = bias ? bias + column : nullptr;
        const int count = static_cast<int>(std::min<long>(kRows, rows - r));
        for (int i = 0; i < count; ++i) {
          inputs[i] = x + (r + i) * in;
          end.outs[i] = out + (r + i) * out_dim + column;
          end.scales[i] = 1.0f;
        }
        any_block(count, inputs, w.data(), in, end);
      }
    }
  }
}
