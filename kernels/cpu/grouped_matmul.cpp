// A mixture-of-experts layer's grouped product on CPU, float32: rows sorted by expert, each segment times its
// expert's [in, out] matrix (stored input-major, as the experts are), every expert in one parallel region.
// kernels/linear.py also runs the CPU projections through it, as a single expert.
//
// torch's grouped_mm on CPU runs one matmul per expert (a profile shows an aten::mm per expert), each a parallel
// region of its own; with a decode step's few rows per expert that overhead, and the experts that get one or two
// rows, cost more than the arithmetic. Here one task is (expert, tile of kTile output columns): the tile's
// columns of the expert's matrix (in * kTile floats: 16 KB for 256 inputs at AVX2's 16-column tiles) stay in
// cache while the segment's rows go past them kRows at a time, each block's kRows x kTile sums held in
// registers over the whole input dimension. The weights are packed once so that each tile is contiguous,
// [E, out / kTile, in, kTile] (reading the tile's columns out of [in, out] rows a page apart was slower). Rows may be gathered through an index, so the tokens need not be copied into expert order first,
// and each result row may get its expert's bias, be scaled (the router's weight) and go to a row of its own
// (back in token order). Written with GCC vector extensions at the CPU's own vector width.

#include <algorithm>
#include <vector>

#include "matmul_block.h"

using kernels::any_block;
using kernels::Epilogue;
using kernels::kRows;
using kernels::kTile;

// The width of the tiles that `weight` is packed in.
extern "C" int grouped_matmul_tile() { return kTile; }

// out[to ? to[r] : r] = (x[index ? index[r] : r] @ W[e] + bias[e]) * scale[r] for the rows r in expert e's
// segment, ends[e - 1] <= r < ends[e] (ends[-1] = 0); bias (then 0), scale (then 1), index and to may each be null.
// x: [*, in]; weight: W [num_experts, in, out_dim] packed as [num_experts, out_dim / kTile, in, kTile]; bias:
// [num_experts, out_dim]; out: [ends[num_experts - 1], out_dim].
extern "C" void grouped_matmul_f32(const float* x, const long* index, const float* weight, const long* ends,
                                   int num_experts, int in, int out_dim, const float* bias, const float* scale,
                                   const long* to, float* out, int num_threads) {
  const int tiles = out_dim / kTile;
  std::vector<int> experts;  // those with rows, so no task is empty
  for (int e = 0; e < num_experts; ++e)
    if (ends[e] > (e ? ends[e - 1] : 0)) experts.push_back(e);
  const long tasks = static_cast<long>(experts.size()) * tiles;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
  for (long task = 0; task < tasks; ++task) {
    const int e = experts[task / tiles];
    const int tile = static_cast<int>(task % tiles), column = tile * kTile;
    const float* w = weight + (static_cast<long>(e) * tiles + tile) * in * kTile;
    for (long r = e ? ends[e - 1] : 0; r < ends[e]; r += kRows) {
      const float* rows[kRows];
      Epilogue end;
      end.bias = bias ? bias + static_cast<long>(e) * out_dim + column : nullptr;
      const int count = static_cast<int>(std::min<long>(kRows, ends[e] - r));
      for (int i = 0; i < count; ++i) {
        rows[i] = x + (index ? index[r + i] : r + i) * in;
        end.outs[i] = out + (to ? to[r + i] : r + i) * out_dim + column;
        end.scales[i] = scale ? scale[r + i] : 1.0f;
      }
      any_block(count, rows, w, in, end);
    }
  }
}
