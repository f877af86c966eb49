// A projection against a quantized weight on CPU, float32 activations: the weight stays quantized in memory and
// each task dequantizes its tile of kTile output columns into a float buffer (in * kTile floats, in cache), then
// runs the tile's rows through the same register-blocked product as the float kernels (matmul_block.h).
//
// Codes are 8-bit (one byte each) or 4-bit (two per byte: byte j holds column j in its low nibble and column
// j + kTile / 2 in its high one, so that both halves unpack with contiguous stores), packed per tile
// as [out / kTile, in, kTile * bits / 8]. A code's value is code - 2^(bits - 1) for integers (offset as
// compressed-tensors packs them), or a float's: FP8 e4m3 for 8 bits, FP4 e2m1 (MXFP4's) for 4, its bits moved
// into a float32's (all plain arithmetic, which vectorises), and w[k][c] = (value - zero[g][c]) * scale[g][c] for the group g = k / group of inputs, with scale and zero
// packed per tile as [out / kTile, in / group, kTile]. Written with GCC vector extensions at the
// CPU's own vector width.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "matmul_block.h"

using kernels::any_block;
using kernels::Epilogue;
using kernels::kRows;
using kernels::kTile;

namespace {

// The value of a small float code with E exponent bits (bias 2^(E-1) - 1) and M mantissa bits under its sign bit:
// sign, exponent and mantissa moved into a float32's (bias 127); exponent 0 is subnormal, mantissa * 2^(1-bias-M).
// FP8 e4m3 is <4, 3> (its NaN codes, never in a checkpoint's weights, read as 480), MXFP4's e2m1 is <2, 1>.
template <int E, int M>
inline float small_float(uint8_t code) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  const uint32_t exponent = (code >> M) & ((1u << E) - 1), mantissa = code & ((1u << M) - 1);
  const uint32_t sign = static_cast<uint32_t>((code >> (E + M)) & 1) << 31;
  float subnormal = static_cast<float>(mantissa) * (1.0f / (1 << (kBias + M - 1)));
  uint32_t bits;
  std::memcpy(&bits, &subnormal, sizeof bits);
  bits = sign | (exponent ? ((exponent + 127 - kBias) << 23) | (mantissa << (23 - M)) : bits);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The tile's weights as floats, [in, kTile].
void dequantize_tile(const uint8_t* codes, int bits, bool floating, const float* scale, const float* zero, int in,
                     int group, float* w) {
  const int bytes = kTile * bits / 8;
  for (int k = 0; k < in; ++k) {
    const uint8_t* row = codes + static_cast<long>(k) * bytes;
    const float* s = scale + (k / group) * kTile;
    const float* z = zero ? zero + (k / group) * kTile : nullptr;
    float* out = w + static_cast<long>(k) * kTile;
    float values[kTile];
    constexpr int kHalf = kTile / 2;
    if (bits == 8 && floating) {
      for (int c = 0; c < kTile; ++c) values[c] = small_float<4, 3>(row[c]);
    } else if (bits == 8) {
      for (int c = 0; c < kTile; ++c) values[c] = static_cast<float>(row[c]) - 128.0f;
    } else if (floating) {
      for (int c = 0; c < kHalf; ++c) {
        values[c] = small_float<2, 1>(row[c] & 15);
        values[c + kHalf] = small_float<2, 1>(row[c] >> 4);
      }
    } else {
      for (int c = 0; c < kHalf; ++c) {
        values[c] = static_cast<float>(row[c] & 15) - 8.0f;
        values[c + kHalf] = static_cast<float>(row[c] >> 4) - 8.0f;
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

// out [rows, out_dim] = x [rows, in] @ W.T + bias (or none), W dequantized tile by tile as above: float codes if
// `floating`, else integers.
extern "C" void quantized_matmul_f32(const float* x, long rows, int in, int out_dim, const uint8_t* codes, int bits,
                                     int floating, const float* scale, const float* zero, int group,
                                     const float* bias, float* out, int num_threads) {
  const int tiles = out_dim / kTile, groups = in / group;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> w(static_cast<long>(in) * kTile);
#pragma omp for schedule(dynamic, 1)
    for (int tile = 0; tile < tiles; ++tile) {
      const long column = static_cast<long>(tile) * kTile;
      dequantize_tile(codes + column * in * bits / 8, bits, floating != 0, scale + column * groups,
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
