// The gated delta rule (kernels/gated_delta.py) over a step's sequences on CPU, float32: each (sequence, value
// head) pair runs its tokens in order against its state [dk, dv] in the pool, in place. Pairs are spread over torch's
// threads; each token is two passes over the state: decay while reading k S, then the update while reading q S.

#include <cmath>
#include <vector>

extern "C" void gated_delta_rule_f32(const float* q, const float* k, const float* v, const float* g,
                                     const float* beta, float* states, const long* slots, const long* cu_seqlens,
                                     float* out, int num_seqs, int num_k_heads, int num_v_heads, int dk, int dv,
                                     int num_threads) {
  const int group = num_v_heads / num_k_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> delta(dv);
#pragma omp for schedule(dynamic)
    for (long pair = 0; pair < static_cast<long>(num_seqs) * num_v_heads; ++pair) {
      const long seq = pair / num_v_heads;
      const int h = static_cast<int>(pair % num_v_heads);
      const int kh = h / group;
      float* s = states + (slots[seq] * num_v_heads + h) * static_cast<long>(dk) * dv;
      for (long t = cu_seqlens[seq]; t < cu_seqlens[seq + 1]; ++t) {
        const float* qt = q + (t * num_k_heads + kh) * dk;
        const float* kt = k + (t * num_k_heads + kh) * dk;
        const float* vt = v + (t * num_v_heads + h) * dv;
        const float decay = std::exp(g[t * num_v_heads + h]);
        const float b = beta[t * num_v_heads + h];
        float* d = delta.data();
#pragma omp simd
        for (int j = 0; j < dv; ++j) d[j] = 0.0f;
        for (int i = 0; i < dk; ++i) {  // S *= decay; d = k S
          float* row = s + static_cast<long>(i) * dv;
          const float ki = kt[i];
#pragma omp simd
          for (int j = 0; j < dv; ++j) {
            row[j] *= decay;
            d[j] += ki * row[j];
          }
        }
#pragma omp simd
        for (int j = 0; j < dv; ++j) d[j] = b * (vt[j] - d[j]);
        float* o = out + (t * num_v_heads + h) * dv;
#pragma omp simd
        for (int j = 0; j < dv; ++j) o[j] = 0.0f;
        for (int i = 0; i < dk; ++i) {  // S += k d; o = q S
          float* row = s + static_cast<long>(i) * dv;
          const float ki = kt[i], qi = qt[i];
#pragma omp simd
          for (int j = 0; j < dv; ++j) {
            row[j] += ki * d[j];
            o[j] += qi * row[j];
          }
        }
      }
    }
  }
}
