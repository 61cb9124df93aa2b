/* Paged decode attention on CPU, fp32, AVX2 + FMA, OpenMP over (request, KV head).
 *
 * One new token per request attends over its whole sequence, read in place from the KV
 * pool through the request's slot list (no gather copy). The G = H / Hkv query heads of
 * a KV head share every K and V row they load (grouped-query attention, Ainslie et al.
 * 2023). Softmax is the exact two-pass form: scores, max, exp, sum, then the V sum.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd_math.h"

static inline float dot(const float *a, const float *b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return hsum256(_mm256_add_ps(s0, s1));
}

/* q, out [B, H, D]; k_buf, v_buf [slots, Hkv, D]; slots [B, ld_slots] (int64, the first
 * seq_lens[b] entries valid); D a multiple of 8. Returns 0, or -1 when out of memory. */
int radixlm_decode_attention(const float *q, const float *k_buf, const float *v_buf,
                             const int64_t *slots, int64_t ld_slots, const int64_t *seq_lens,
                             float *out, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                             float scale, int num_threads) {
    const int64_t G = H / Hkv;
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; ++b) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        /* Per thread: G score rows (padded to 8) and G accumulators of D floats. */
        int64_t stride = (max_len + 7) / 8 * 8;
        float *scores = aligned_alloc(32, (size_t)(G * stride + G * D) * sizeof(float));
        if (!scores) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; ++task) {
            if (!scores) continue;
            const int64_t b = task / Hkv, h = task % Hkv, L = seq_lens[b];
            const int64_t *sl = slots + b * ld_slots;
            const float *qb = q + (b * H + h * G) * D;
            float *acc = scores + G * stride;
            float inv_sum[64];
            for (int64_t g = 0; g < G; ++g) {
                float *s = scores + g * stride;
                for (int64_t t = 0; t < L; ++t)
                    s[t] = scale * dot(qb + g * D, k_buf + (sl[t] * Hkv + h) * D, D);
                float m = -INFINITY;
                for (int64_t t = 0; t < L; ++t) m = s[t] > m ? s[t] : m;
                for (int64_t t = L; t < stride; ++t) s[t] = -INFINITY;
                __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
                for (int64_t t = 0; t < stride; t += 8) {
                    __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + t), vm));
                    _mm256_store_ps(s + t, e);
                    vs = _mm256_add_ps(vs, e);
                }
                inv_sum[g % 64] = 1.0f / hsum256(vs);
                for (int64_t i = 0; i < D; ++i) acc[g * D + i] = 0.0f;
            }
            for (int64_t t = 0; t < L; ++t) {
                const float *vrow = v_buf + (sl[t] * Hkv + h) * D;
                for (int64_t g = 0; g < G; ++g) {
                    __m256 p = _mm256_set1_ps(scores[g * stride + t]);
                    float *a = acc + g * D;
                    for (int64_t i = 0; i < D; i += 8)
                        _mm256_storeu_ps(a + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(vrow + i),
                                                                _mm256_loadu_ps(a + i)));
                }
            }
            for (int64_t g = 0; g < G; ++g) {
                float *o = out + (b * H + h * G + g) * D;
                __m256 inv = _mm256_set1_ps(inv_sum[g % 64]);
                for (int64_t i = 0; i < D; i += 8)
                    _mm256_storeu_ps(o + i, _mm256_mul_ps(inv, _mm256_loadu_ps(acc + g * D + i)));
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
