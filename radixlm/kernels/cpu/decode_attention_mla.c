/* Paged decode attention whose V is narrower than K or read through strided rows: the
 * absorbed form of multi-head latent attention (DeepSeek-V2, arXiv 2405.04434), fp32
 * compute, AVX2 + FMA, OpenMP over (request, KV head, key split).
 *
 * Request b's one new token attends over keys [lo, L) (lo = L - window with a sliding
 * window, else 0), each read in place through its slot list: the K row of slot s, KV head
 * h at k_buf + s ldk + h Dk, its V row at v_buf + s ldv + h Dv. MLA has one KV head whose K
 * row is [latent (R) ; rope key (Dr)] and whose V row is the latent itself (v_buf = k_buf,
 * ldv = ldk = R + Dr, Dv = R): a task holds all G = H / Hkv query heads of its KV head and
 * walks its keys in blocks of NB, scoring each block's K rows for every head, then summing
 * their V rows while the block is still in L2, so the pool is read from memory once per
 * step (the point of MLA's small cache). The block's scores fold into a running softmax
 * (max, sum of exps, unnormalized V sum per head: Milakov & Gimelshein 2018).
 *
 * Batch 1 has one task per KV head, too few to share out: each request's keys are split
 * into chunks (flash-decoding, Dao et al. 2023), each task keeps its partial softmax, and a
 * second pass merges a request's partials by their maxima.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fp8.h"
#include "kernels.h"
#include "simd_math.h"

/* Keys per block (their K rows stay in L2 from the score pass to the V pass: 32 latent rows
 * of 576 floats are 72 KiB), and the fewest keys a split is given. */
#define NB 32
#define SPLIT_MIN 256
/* Score rows are NB + 4 wide: a four-key tile at the end of a ragged block writes past NB. */
#define SROW (NB + 8)

static inline void prefetch_bytes(const void *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch((const char *)row + i, _MM_HINT_T1);
}

#define KV_T float
#define KV_LOAD(p) _mm256_loadu_ps(p)
#define KV_FN(name) name##_f32
#include "decode_attention_mla_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_FN

#define KV_T uint16_t
#define KV_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KV_FN(name) name##_f16
#include "decode_attention_mla_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_FN

#define KV_T uint8_t
#define KV_LOAD(p) load8_e4m3(p)
#define KV_FN(name) name##_e4m3
#include "decode_attention_mla_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_FN

#define KV_T uint8_t
#define KV_LOAD(p) load8_e5m2(p)
#define KV_FN(name) name##_e5m2
#include "decode_attention_mla_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_FN

/* Splits of request b's keys: enough tasks (B Hkv splits) for two per thread, each split at
 * least SPLIT_MIN keys. */
static inline int64_t num_splits(int64_t keys, int64_t B, int64_t Hkv, int num_threads) {
    const int64_t want = (2 * num_threads + B * Hkv - 1) / (B * Hkv);
    const int64_t most = (keys + SPLIT_MIN - 1) / SPLIT_MIN;
    return want < most ? want : most;
}

/* q [B, H, Dk] (row stride ldq floats, heads Dk apart), out [B, H, Dv] contiguous; KV rows
 * as above in the element format kv_fmt (fp8.h), element strides ldk, ldv per
 * slot; slots [B, ld_slots] (int64, the first seq_lens[b] valid, each >= 1); Dk, Dv
 * multiples of 8; window > 0: each request sees its last `window` keys, 0: all. Returns 0,
 * or -1 when out of memory. */
int radixlm_decode_attention_mla(const float *q, int64_t ldq, const void *k_buf, int64_t ldk,
                                 const void *v_buf, int64_t ldv, int kv_fmt,
                                 const int64_t *slots, int64_t ld_slots,
                                 const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                                 int64_t Hkv, int64_t Dk, int64_t Dv, float scale,
                                 int64_t window, int num_threads) {
    const int64_t G = H / Hkv;
    /* Task ranges: request b's tasks are first[b] .. first[b + 1), Hkv per split. */
    int64_t *first = malloc((size_t)(B + 1) * sizeof(int64_t));
    if (!first) return -1;
    first[0] = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t lo = window > 0 && seq_lens[b] > window ? seq_lens[b] - window : 0;
        first[b + 1] = first[b] + Hkv * num_splits(seq_lens[b] - lo, B, Hkv, num_threads);
    }
    const int64_t ntasks = first[B], part_floats = G * (Dv + 2);
    float *part = malloc((size_t)(ntasks * part_floats) * sizeof(float));
    if (!part) {
        free(first);
        return -1;
    }
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scores = aligned_alloc(32, (size_t)(G * SROW) * sizeof(float));
        if (!scores) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntasks; ++task) {
            if (!scores) continue;
            int64_t b = 0;
            while (first[b + 1] <= task) ++b;
            const int64_t rest = task - first[b], ns = (first[b + 1] - first[b]) / Hkv;
            const int64_t h = rest % Hkv, split = rest / Hkv;
            const int64_t L = seq_lens[b];
            const int64_t lo = window > 0 && L > window ? L - window : 0;
            const int64_t t0 = lo + (L - lo) * split / ns, t1 = lo + (L - lo) * (split + 1) / ns;
            const float *qh = q + b * ldq + h * G * Dk;
            const int64_t *sl = slots + b * ld_slots;
            float *pt = part + task * part_floats;
            if (kv_fmt == KV_FMT_F16)
                split_part_f16(qh, (const uint16_t *)k_buf + h * Dk, ldk,
                               (const uint16_t *)v_buf + h * Dv, ldv, sl, t0, t1, G, Dk, Dv,
                               scale, scores, pt);
            else if (kv_fmt == KV_FMT_E4M3)
                split_part_e4m3(qh, (const uint8_t *)k_buf + h * Dk, ldk,
                                (const uint8_t *)v_buf + h * Dv, ldv, sl, t0, t1, G, Dk, Dv,
                                scale, scores, pt);
            else if (kv_fmt == KV_FMT_E5M2)
                split_part_e5m2(qh, (const uint8_t *)k_buf + h * Dk, ldk,
                                (const uint8_t *)v_buf + h * Dv, ldv, sl, t0, t1, G, Dk, Dv,
                                scale, scores, pt);
            else
                split_part_f32(qh, (const float *)k_buf + h * Dk, ldk,
                               (const float *)v_buf + h * Dv, ldv, sl, t0, t1, G, Dk, Dv, scale,
                               scores, pt);
        }
        free(scores);
        /* Merge each (request, KV head)'s splits by their maxima. */
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * Hkv; ++bh) {
            const int64_t b = bh / Hkv, h = bh % Hkv, ns = (first[b + 1] - first[b]) / Hkv;
            const float *p0 = part + (first[b] + h) * part_floats;
            const int64_t ps = Hkv * part_floats; /* split s's partial is s ps floats on */
            for (int64_t g = 0; g < G; ++g) {
                float m = -INFINITY, den = 0.0f;
                for (int64_t s = 0; s < ns; ++s) {
                    const float ms = p0[s * ps + G * Dv + g];
                    m = ms > m ? ms : m;
                }
                float *o = out + (b * H + h * G + g) * Dv;
                for (int64_t e = 0; e < Dv; ++e) o[e] = 0.0f;
                for (int64_t s = 0; s < ns; ++s) {
                    const float *ps_ = p0 + s * ps;
                    const float w = expf(ps_[G * Dv + g] - m);
                    den += ps_[G * Dv + G + g] * w;
                    const __m256 vw = _mm256_set1_ps(w);
                    for (int64_t e = 0; e < Dv; e += 8)
                        _mm256_storeu_ps(o + e, _mm256_fmadd_ps(vw, _mm256_loadu_ps(ps_ + g * Dv + e),
                                                                _mm256_loadu_ps(o + e)));
                }
                const __m256 inv = _mm256_set1_ps(1.0f / den);
                for (int64_t e = 0; e < Dv; e += 8)
                    _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(o + e)));
            }
        }
    }
    free(part);
    free(first);
    return failed ? -1 : 0;
}
