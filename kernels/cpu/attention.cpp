// Causal attention over the paged KV cache on CPU, float32, read straight from the block tables.
//
// Every query row attends to the first `row_len[r]` tokens of its sequence (a decode row: its whole
// context; a prefill row: the positions up to its own), or under a sliding window (`window` > 0) to the
// last `window` of them. Scores may be soft-capped (cap * tanh(s / cap)) and each query head's softmax
// may count a sink: a virtual key of that logit with a zero value. One task is one (row, KV head). For each
// query head under that KV head: the scores of 16 cached tokens at a time (16 vector dot products,
// summed across lanes together) and one softmax; then the V-weighted sums of all those heads, 16
// tokens at a time. OpenMP spreads tasks over the threads torch uses. Written with GCC vector
// extensions: 16-float vectors become AVX-512 registers where the CPU has them and pairs of narrower
// ones elsewhere.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vector_math.h"

namespace {

constexpr int kLanes = 16;
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int vi __attribute__((vector_size(kLanes * sizeof(int))));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

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

// The lane sums of v[0..15], in order, as one vector.
inline vf sum_lanes(vf v[kLanes]) {
  vf w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) w[i] = fold<16>(v[i], v[i + 8]);  // lanes: v[i] x8 | v[i+8] x8
  for (int i = 0; i < 4; ++i) x[i] = fold<8>(w[i], w[i + 4]);   // v[i], v[i+4], v[i+8], v[i+12] x4
  for (int i = 0; i < 2; ++i) y[i] = fold<4>(x[i], x[i + 2]);   // v[i], v[i+2], ..., v[i+14] x2
  return fold<2>(y[0], y[1]);                                     // v[0], v[1], ..., v[15]
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

// Query heads q[0..group) (consecutive, `dim` apart) over `len` cached tokens, the k-th at
// `c.k + offsets[k]` (and `c.v + offsets[k]`); `offsets` holds `len` rounded up to 16 entries,
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
      store(row + start, sum_lanes(partial));
    }
    if (softcap > 0.0f)
      for (int i = 0; i < len; ++i) row[i] = softcap * std::tanh(row[i] / softcap);
    softmax(row, len, sinks ? sinks[g] : -INFINITY);
    std::fill(row + len, row + padded, 0.0f);
  }
  // 16 tokens at a time for every head, so each V row is read from memory once per task; four tokens
  // in flight, each with its own accumulators, so the adds do not wait on each other
  std::fill(out, out + group * dim, 0.0f);
  for (int start = 0; start < len; start += kLanes) {
    for (int g = 0; g < group; ++g) {
      const float* p = scores + g * padded + start;
      vf acc[4][chunks] = {};
      for (int t = 0; t < kLanes; t += 4) {
        for (int w = 0; w < 4; ++w) {
          const float* v = c.v + offsets[start + t + w];
          for (int j = 0; j < chunks; ++j) acc[w][j] += p[t + w] * load(v + j * kLanes);
        }
      }
      float* o = out + g * dim;
      for (int j = 0; j < chunks; ++j)
        store(o + j * kLanes, load(o + j * kLanes) + (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]));
    }
  }
}

// Where KV head `h` of tokens start..end-1 lives, padded to a multiple of 16 by repeating the last token
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
    CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(128) CASE(256)
#undef CASE
    default:
      return -1;
  }
}
