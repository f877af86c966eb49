// Sampling from float32 logits on CPU, one row at a time, reading each row's logits twice: temperature, top-k,
// top-p and min-p, and one draw per row by inverse transform sampling (kernels/sampling.py gives the contract and
// the torch reference).
//
// A row's first pass finds its largest logit m (and its argmax: a greedy row ends there). The second writes each
// token's unnormalised probability e = exp((x - m) / T) to a buffer of the thread's, so e is 1 at the top and
// min-p is the cut e >= min_p. Top-k and top-p look for their cut among the buffer's values without sorting
// them: a histogram of e by its float's exponent and top four mantissa bits (buckets ordered as the values are)
// counts and weighs each bucket, the bucket where the k-th token or the p-th mass falls is found from the top,
// and only that bucket's values are gathered and ordered to place the cut exactly. Tokens tied with the cut are
// kept. The draw walks the kept probabilities' block sums to the block where u times their total falls, then
// that block's tokens, summing in double.

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "vector_math.h"

namespace {

constexpr int kBlock = 1024;  // tokens per block sum of the draw
constexpr int kShift = 19;  // a float's bits above this order the buckets: exponent and four mantissa bits
constexpr int kBuckets = (0x3F800000 >> kShift) + 1;  // the values in [0, 1]
constexpr float kTopKFloor = 1e-6f;  // top-k looks for its k tokens among those at least this likely as the top

inline int bucket_of(float e) {
  int bits;
  std::memcpy(&bits, &e, sizeof bits);
  return bits >> kShift;
}

struct Scratch {
  std::vector<float> e;  // the row's unnormalised probabilities
  std::vector<float> candidates;  // those top-k and top-p look at
  std::vector<double> blocks;  // their sums per block of kBlock tokens
  std::vector<int> counts;
  std::vector<double> masses;
  std::vector<float> bucket;  // one bucket's values

  explicit Scratch(int size)
      : e(size), candidates(size + 1), blocks((size + kBlock - 1) / kBlock), counts(kBuckets), masses(kBuckets) {}
};

// Writes e and its block sums; returns their total.
double exponentials(const float* x, int size, float m, float temperature, Scratch& s) {
  const float scale = 1.0f / temperature;
  double total = 0.0;
  for (int block = 0; block * kBlock < size; ++block) {
    const int start = block * kBlock, end = std::min(size, start + kBlock);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = start; i < end; ++i) {
      const float z = (x[i] - m) * scale;
      const float v = z < -87.0f ? 0.0f : kernels::exp_nonpositive(z);  // -inf (a masked token) is exactly 0
      s.e[i] = v;
      sum += v;
    }
    s.blocks[block] = sum;
    total += sum;
  }
  return total;
}

// Copies the values of e at least `floor` to s.candidates (branch-free); returns how many.
int gather_candidates(int size, float floor, Scratch& s) {
  int n = 0;
  for (int i = 0; i < size; ++i) {
    s.candidates[n] = s.e[i];
    n += s.e[i] >= floor;
  }
  return n;
}

// Gathers the candidates in bucket `b` that are at least `floor` into s.bucket, largest first.
void gather_bucket(int n, int b, float floor, Scratch& s) {
  s.bucket.clear();
  for (int i = 0; i < n; ++i)
    if (bucket_of(s.candidates[i]) == b && s.candidates[i] >= floor) s.bucket.push_back(s.candidates[i]);
  std::sort(s.bucket.begin(), s.bucket.end(), std::greater<float>());
}

// The smallest e top-k and top-p keep (0: they keep everything). `total` is the sum of every e. Only candidates
// are looked at: with top-k, the tokens of e >= kTopKFloor when there are k of them (else every token); without,
// those of e >= (1 - p) / size, below top-p's cut (the tokens under it weigh at most 1 - p of the total, which is
// at least 1).
float top_k_top_p_cut(int size, long top_k, float top_p, double total, Scratch& s) {
  const bool cuts_k = top_k > 0 && top_k < size;
  int n = gather_candidates(size, cuts_k ? kTopKFloor : (1.0f - top_p) / size, s);
  if (n < top_k) n = gather_candidates(size, 0.0f, s);
  std::fill(s.counts.begin(), s.counts.end(), 0);
  std::fill(s.masses.begin(), s.masses.end(), 0.0);
  for (int i = 0; i < n; ++i) {
    const int b = bucket_of(s.candidates[i]);
    ++s.counts[b];
    s.masses[b] += s.candidates[i];
  }
  float cut = 0.0f;
  int k_bucket = -1;  // the bucket holding the k-th value
  double kept = total, k_bucket_mass = 0.0;
  if (cuts_k) {
    long above = 0;
    int b = kBuckets - 1;
    while (above + s.counts[b] < top_k) above += s.counts[b--];
    gather_bucket(n, b, 0.0f, s);
    cut = s.bucket[top_k - above - 1];
    k_bucket = b;
    kept = 0.0;
    for (int c = kBuckets - 1; c > b; --c) kept += s.masses[c];
    for (float v : s.bucket) k_bucket_mass += v >= cut ? v : 0.0f;  // ties with the k-th are kept
    kept += k_bucket_mass;
  }
  if (top_p >= 1.0f) return cut;
  const double target = top_p * kept;  // the fewest most likely tokens whose mass reaches it
  double mass = 0.0;
  for (int b = kBuckets - 1; b >= 0 && b >= k_bucket; --b) {
    const double here = b == k_bucket ? k_bucket_mass : s.masses[b];
    if (mass + here < target) {
      mass += here;
      continue;
    }
    gather_bucket(n, b, cut, s);
    for (float v : s.bucket) {
      mass += v;
      if (mass >= target) return std::max(cut, v);
    }
    return std::max(cut, s.bucket.empty() ? cut : s.bucket.back());  // rounding: the bucket is kept whole
  }
  return cut;
}

// The token where u times the kept mass falls (keeping e >= cut; every token when `cut` is 0).
long draw(int size, float cut, double u, Scratch& s) {
  const int blocks = (size + kBlock - 1) / kBlock;
  if (cut > 0.0f) {
    for (int block = 0; block < blocks; ++block) {
      const int start = block * kBlock, end = std::min(size, start + kBlock);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int i = start; i < end; ++i) sum += s.e[i] >= cut ? s.e[i] : 0.0f;
      s.blocks[block] = sum;
    }
  }
  double total = 0.0;
  for (int block = 0; block < blocks; ++block) total += s.blocks[block];
  const double target = u * total;
  double mass = 0.0;
  int block = 0;
  while (block < blocks - 1 && mass + s.blocks[block] <= target) mass += s.blocks[block++];
  long last = -1;
  for (int i = block * kBlock; i < size; ++i) {
    if (s.e[i] < cut || s.e[i] == 0.0f) continue;
    mass += s.e[i];
    last = i;
    if (mass > target) return i;
  }
  if (last >= 0) return last;  // rounding put the target past the block's sum: its last kept token
  for (int i = size - 1; i >= 0; --i)
    if (s.e[i] >= cut && s.e[i] > 0.0f) return i;
  return 0;
}

long sample_row(const float* x, int size, float temperature, long top_k, float top_p, float min_p, double u,
                Scratch& s) {
  const int best = kernels::first_argmax(x, size);
  const float m = x[best];
  if (temperature <= 0.0f || m != m || m == -__builtin_inff()) return best;  // greedy, a NaN, nothing finite
  const double total = exponentials(x, size, m, temperature, s);
  float cut = 0.0f;
  if ((top_k > 0 && top_k < size) || top_p < 1.0f) cut = top_k_top_p_cut(size, top_k, top_p, total, s);
  cut = std::max(cut, min_p);  // the largest e is 1
  return draw(size, cut, u, s);
}

}  // namespace

// out[r] = row r's token. temperature 0: the argmax; top_k 0 or >= size, top_p 1, min_p 0: no cut; u in [0, 1).
extern "C" void sample_f32(const float* logits, const float* temperatures, const long* top_ks, const float* top_ps,
                           const float* min_ps, const double* uniforms, long* out, int rows, int size,
                           int num_threads) {
#pragma omp parallel num_threads(num_threads) if (rows > 1 && static_cast<long>(rows) * size >= (1L << 16))
  {
    Scratch scratch(size);
#pragma omp for schedule(dynamic)
    for (int r = 0; r < rows; ++r)
      out[r] = sample_row(logits + static_cast<long>(r) * size, size, temperatures[r], top_ks[r], top_ps[r],
                          min_ps[r], uniforms[r], scratch);
  }
}
