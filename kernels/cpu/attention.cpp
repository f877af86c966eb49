// Causal attention over the paged KV cache on CPU, float32, read straight from the block tables.
//
// Every query row attends to the first `row_len[r]` tokens of its sequence (a decode row: its whole
// context; a prefill row: the positions up to its own), or under a sliding window (`window` > 0) to the
// last `window` of them. Scores may be soft-capped (cap * tanh(s / cap)) and each query head's softmax
// may count a sink: a virtual key of that logit with a zero value. One task is one (row, KV head). For each
// query head under that KV head: the scores of kLanes cached tokens at a time (kLanes vector dot products,
// summed across lanes together) and one softmax; then each head's V-weighted sum, up to 8 vectors of
// output columns at a time held in registers over all the tokens. OpenMP spreads tasks over the threads
// torch uses. Written with GCC vector extensions at the CPU's own vector width (kLanes floats: 16 with
// AVX-512, 8 with AVX, else 4): wider vectors than the CPU has are split by GCC into slow generic code,
// which made this kernel several times slower on AVX2 machines.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vector_math.h"

namespace {

using kernels::kLanes;
using kernels::load;
using kernels::store;
using kernels::vf;

typedef int vi __attribute__((vector_size(kLanes * sizeof(int))));

// Combine two vectors that each hold `width`-lane partial sums of several dot products into one
// holding half as many partials of twice as many: pairs of lanes are added, interleaving a and b.
template <int width>
inline vf fold(vf a, vf b) {
  vi first, second;
  for (int i = 0; i < kLanes; ++i) {
    const int half = width / 2, group = i / half, lane = i % half;
    const int source = (group % 2) * kLanes + (group / 2) * width + lane;
    first[i] = source;
    second[i] = source + half;
  }
  return __builtin_shuffle(a, b, first) + __builtin_shuffle(a, b, second);
}

// Leaves in v[0] the lane sums of v[0..width), in order. Each level folds pairs of vectors, halving both
// their number and the lanes each sum spans: log2(kLanes) levels of kLanes - 1 folds in all.
template <int width = kLanes>
inline void sum_lanes(vf* v) {
  for (int i = 0; i < width / 2; ++i) v[i] = fold<width>(v[i], v[i + width / 2]);
  if constexpr (width > 2) sum_lanes<width / 2>(v);
}

struct Cache {
  const float* k;
  const float* v;
  int num_kv_heads, block_size;
};

// Softmax of `len` scores in place, over them and a `sink` logit (-inf: none) whose share is dropped.
void softmax(float* row, int len, float sink) {
  const float top = std::max(*std::max_element(row, row + len), sink);
  float total = std::exp(sink - top);
#pragma omp simd reduction(+ : total)
  for (int i = 0; i < len; ++i) {
    row[i] = kernels::exp_nonpositive(row[i] - top);
    total += row[i];
  }
  const float inv = 1.0f / total;
#pragma omp simd
  for (int i = 0; i < len; ++i) row[i] *= inv;
}

// Adds to o[col..col + C * kLanes) the sum over tokens t < `padded` of p[t] times columns col.. of V row t.
// The C output vectors stay in registers across all the tokens; with fewer than 8 of them, T tokens are
// in flight, each with its own accumulators, so about 8 independent FMA chains hide the FMA latency.
template <int C>
inline void weighted_sum(const float* p, const float* v, const long* offsets, int padded, int col, float* o) {
  constexpr int T = C >= 8 ? 1 : 8 / C;
  static_assert(kLanes % T == 0, "token steps must divide the padding");
  vf acc[T][C] = {};
  for (int t = 0; t < padded; t += T)
    for (int w = 0; w < T; ++w) {
      const float* row = v + offsets[t + w] + col;
      for (int j = 0; j < C; ++j) acc[w][j] += p[t + w] * load(row + j * kLanes);
    }
  for (int j = 0; j < C; ++j) {
    vf total = acc[0][j];
    for (int w = 1; w < T; ++w) total += acc[w][j];
    store(o + col + j * kLanes, total);
  }
}

// weighted_sum over `chunks` vectors of columns from `col` on, 8 vectors (what the registers hold) at a time.
template <int chunks>
inline void weighted_sums(const float* p, const float* v, const long* offsets, int padded, int col, float* o) {
  constexpr int C = std::min(chunks, 8);
  weighted_sum<C>(p, v, offsets, padded, col, o);
  if constexpr (chunks > C) weighted_sums<chunks - C>(p, v, offsets, padded, col + C * kLanes, o);
}

// Query heads q[0..group) (consecutive, `dim` apart) over `len` cached tokens, the k-th at
// `c.k + offsets[k]` (and `c.v + offsets[k]`); `offsets` holds `len` rounded up to kLanes entries,
// `scores` room for `group` rows of that many; `sinks` (or null) the heads' sink logits.
template <int dim>
void attend(const float* q, int group, const Cache& c, const long* offsets, int len, float scale, float softcap,
            const float* sinks, float* scores, float* out) {
  constexpr int chunks = dim / kLanes;
  const int padded = (len + kLanes - 1) / kLanes * kLanes;
  for (int g = 0; g < group; ++g) {
    float* row = scores + g * padded;
    vf qv[chunks];
    for (int j = 0; j < chunks; ++j) qv[j] = load(q + g * dim + j * kLanes) * scale;
    for (int start = 0; start < len; start += kLanes) {
      vf partial[kLanes];
      for (int t = 0; t < kLanes; ++t) {
        const float* k = c.k + offsets[start + t];
        vf acc = qv[0] * load(k);
        for (int j = 1; j < chunks; ++j) acc += qv[j] * load(k + j * kLanes);
        partial[t] = acc;
      }
      sum_lanes(partial);
      store(row + start, partial[0]);
    }
    if (softcap > 0.0f)
      for (int i = 0; i < len; ++i) row[i] = softcap * std::tanh(row[i] / softcap);
    softmax(row, len, sinks ? sinks[g] : -INFINITY);
    std::fill(row + len, row + padded, 0.0f);  // the padding tokens' weights
    weighted_sums<chunks>(row, c.v, offsets, padded, 0, out + g * dim);
  }
}

// Where KV head `h` of tokens start..end-1 lives, padded to a multiple of kLanes by repeating the last token
// (whose scores past the end are discarded). Blocks before `start` are never read.
void token_offsets(const int* table, int start, int end, int h, int dim, const Cache& c,
                   std::vector<long>& offsets) {
  const int len = end - start;
  offsets.resize(len + kLanes);
  const long token_stride = static_cast<long>(c.num_kv_heads) * dim;
  for (int pos = start; pos < end;) {
    const int b = pos / c.block_size;
    const long first = static_cast<long>(table[b]) * c.block_size * token_stride + h * dim;
    for (int i = pos % c.block_size; i < c.block_size && pos < end; ++i, ++pos)
      offsets[pos - start] = first + i * token_stride;
  }
  std::fill(offsets.begin() + len, offsets.end(), offsets[len - 1]);
}

template <int dim>
void run(const float* q, const Cache& c, const int* block_tables, int table_width, const int* row_seq,
         const int* row_len, int num_rows, int num_heads, float scale, int window, float softcap,
         const float* sinks, float* out, int num_threads) {
  const int group = num_heads / c.num_kv_heads;
  const long tasks = static_cast<long>(num_rows) * c.num_kv_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores;
    std::vector<long> offsets;
#pragma omp for schedule(dynamic, 1)
    for (long task = 0; task < tasks; ++task) {
      const long r = task / c.num_kv_heads;
      const int h = static_cast<int>(task % c.num_kv_heads);
      const int end = row_len[r];
      const int start = window > 0 ? std::max(0, end - window) : 0;
      scores.resize(static_cast<size_t>(group) * (end - start + kLanes));
      token_offsets(block_tables + row_seq[r] * static_cast<long>(table_width), start, end, h, dim, c, offsets);
      const long offset = (r * num_heads + h * group) * dim;
      attend<dim>(q + offset, group, c, offsets.data(), end - start, scale, softcap,
                  sinks ? sinks + h * group : nullptr, scores.data(), out + offset);
    }
  }
}

}  // namespace

// Returns 0, or -1 for a head size it has no instance for (HEAD_DIMS in attention.py lists them).
extern "C" int paged_attention_f32(const float* q, const float* k_cache, const float* v_cache,
                                   const int* block_tables, int table_width, const int* row_seq, const int* row_len,
                                   int num_rows, int num_heads, int num_kv_heads, int head_dim, int block_size,
                                   float scale, int window, float softcap, const float* sinks, float* out,
                                   int num_threads) {
  const Cache c{k_cache, v_cache, num_kv_heads, block_size};
  switch (head_dim) {
#define CASE(dim) \
  case dim:       \
    run<dim>(q, c, block_tables, table_width, row_seq, row_len, num_rows, num_heads, scale, window, softcap, sinks, \
             out, num_threads);                                                                                      \
    return 0;
    CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(128) CASE(256) CASE(576)
#undef CASE
    default:
      return -1;
  }
}
