// Row-wise float32 kernels on CPU, each one pass over memory where torch takes several ops:
// RMSNorm with the residual add before it, rotary embedding, SiLU(gate) * up, and each row's argmax. Rows are spread
// over torch's threads once a call is big enough to repay starting them.

#include <cmath>
#include <cstring>

#include "vector_math.h"

namespace {

constexpr long kParallelElements = 1 << 15;  // below this one thread is faster than waking the others

}  // namespace

// out = weight * x / rms(x) per row of `dim` floats; with `residual`, x is first replaced by
// x + residual, which is also written to `new_residual`.
extern "C" void rms_norm_f32(const float* x, const float* residual, const float* weight, float* out,
                             float* new_residual, int rows, int dim, float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (static_cast<long>(rows) * dim >= kParallelElements)
  for (int r = 0; r < rows; ++r) {
    const long offset = static_cast<long>(r) * dim;
    const float* in = x + offset;
    if (residual != nullptr) {
      float* sum = new_residual + offset;
#pragma omp simd
      for (int i = 0; i < dim; ++i) sum[i] = in[i] + residual[offset + i];
      in = sum;
    }
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int i = 0; i < dim; ++i) squares += in[i] * in[i];
    const float inv = 1.0f / std::sqrt(squares / dim + eps);
    float* o = out + offset;
#pragma omp simd
    for (int i = 0; i < dim; ++i) o[i] = weight[i] * (in[i] * inv);
  }
}

// Rotates `heads` vectors of size 2 * half per token (the half-split layout) by the token's cos/sin
// [half]; token t's first vector starts at x + t * row_stride, the vectors are contiguous, and the
// result goes to `out` [tokens, heads, 2 * half].
extern "C" void rotary_f32(const float* x, long row_stride, const float* cos, const float* sin, float* out,
                           int tokens, int heads, int half, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (2L * tokens * heads * half >= kParallelElements)
  for (int t = 0; t < tokens; ++t) {
    const float* c = cos + static_cast<long>(t) * half;
    const float* s = sin + static_cast<long>(t) * half;
    for (int h = 0; h < heads; ++h) {
      const float* in = x + t * row_stride + 2L * h * half;
      float* o = out + (static_cast<long>(t) * heads + h) * 2 * half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        o[i] = in[i] * c[i] - in[half + i] * s[i];
        o[half + i] = in[half + i] * c[i] + in[i] * s[i];
      }
    }
  }
}

// out[t] = silu(gate_up[t, :size]) * gate_up[t, size:], with silu(x) = x / (1 + e^-x) computed from
// e^-|x| so the exponential never overflows.
extern "C" void silu_and_mul_f32(const float* gate_up, float* out, int tokens, int size, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (static_cast<long>(tokens) * size >= kParallelElements)
  for (int t = 0; t < tokens; ++t) {
    const float* gate = gate_up + 2L * t * size;
    const float* up = gate + size;
    float* o = out + static_cast<long>(t) * size;
#pragma omp simd
    for (int i = 0; i < size; ++i) {
      const float g = gate[i];
      const float e = kernels::exp_nonpositive(-std::fabs(g));
      const float sigmoid = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
      o[i] = g * sigmoid * up[i];
    }
  }
}

// out[r] = the index of row r's largest value (kernels::first_argmax).
extern "C" void argmax_f32(const float* x, long* out, int rows, int size, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (static_cast<long>(rows) * size >= 8 * kParallelElements)
  for (int r = 0; r < rows; ++r) out[r] = kernels::first_argmax(x + static_cast<long>(r) * size, size);
}
