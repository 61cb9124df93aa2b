/* Paged decode attention on CPU, fp32, AVX2 + FMA, OpenMP over requests (and KV heads).
 *
 * One new token per request attends over its whole sequence, read in place from the KV
 * pool through the request's slot list (no gather copy). The G = H / Hkv query heads of
 * a KV head share every K and V row they load (grouped-query attention, Ainslie et al.
 * 2023). Softmax is the exact two-pass form: scores, max, exp, sum, then the V sum.
 *
 * A task covers nh consecutive KV heads of one request: all Hkv when there are requests
 * enough to share out (a slot's K and V rows of every head are then read in one
 * contiguous pass, 768 bytes for SmolLM2), else one (batch 1: three tasks).
 * Measurements: docs/perf-notes.md, "Decode attention".
 *
 * Where radixlm_gemm_isa says AVX-512 and D is a multiple of 64, the scores and the V
 * sum run in 512-bit vectors (`zqk_scores`, `zpv_sum`); the softmax stays AVX2.
 *
 * Cascade (shared-prefix) attention: requests whose slot lists begin with the same P >=
 * CASCADE_MIN slots (a prefix the radix cache shares) form a group. The shared keys are
 * read once for the whole group: per KV head and chunk of shared keys (`cascade_groups`
 * sizes the chunks), one task scores every query row of every member against them (the K
 * and V rows stay in L1 while all the rows use them) and keeps each row's partial softmax
 * (max, sum of exps, unnormalized V sum). Each request then attends over its own keys P .. L
 * and merges the partials by their maxima (the log-sum-exp merge of Hydragen, Juravsky
 * et al. 2024, and FlashInfer's cascade inference). Batch 16 x 300 keys sharing 200, 30
 * layers, one thread: `benchmarks/shared_prefix_attention.py`. On AVX-512 the shared
 * tasks put the rows across the vector lanes (`zcascade_part`): the queries gathered
 * transposed, each key element broadcast against 16 rows at once, so no score needs a
 * horizontal sum, and the softmax runs 16 rows a vector over the chunk's keys alone (each
 * row's own keys then go through `softmax_rows`).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "kernels.h"
#include "simd_math.h"

/* Rows are read through the slot list, so the hardware prefetcher cannot see the next
 * one: fetch every cache line of the row AHEAD tokens on, into L2 (T1 hint; the 512-bit
 * passes fetch each head's part as they reach it, decode_attention_kv.h). Fetching into
 * L1 (T0) ran out of L1 miss buffers (docs/perf-notes.md, "Decode attention"). */
#define AHEAD 16
static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch((const char *)row + i, _MM_HINT_T1);
}

#define ZW __attribute__((target("avx512f")))
#define ZW_INLINE __attribute__((target("avx512f"), always_inline)) inline

/* The sums of eight 16-lane vectors a[0..7], in order, as one 8-lane vector: halves
 * added pairwise (shuffle_f32x4), then quarters, then the four lanes of each 128-bit
 * lane; 24 instructions for eight dot products. */
static ZW_INLINE __m256 zsum8(const __m512 *a) {
    __m512 s[4];
    for (int i = 0; i < 4; ++i)
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    /* s[i]'s 128-bit lanes: two partials of a[2i], then two of a[2i + 1]. */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88),
                                   _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x88),
                                   _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
    /* Lane j of u holds four partials of a[j], of w four of a[4 + j]. */
    __m512 p = _mm512_add_ps(_mm512_unpacklo_ps(u, w), _mm512_unpackhi_ps(u, w));
    p = _mm512_add_ps(p, _mm512_permute_ps(p, 0x4E));
    /* Lane j: [sum a[j], sum a[4 + j], (the same again)]. */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, p));
}

/* The first key a query at position len - 1 sees under a sliding window of `window` keys
 * (0: no window, every key from 0). */
static inline int64_t window_start(int64_t len, int64_t window) {
    return window > 0 && len > window ? len - window : 0;
}

/* Cascade groups: shortest shared prefix given its own pass (keys), fewest and most
 * shared keys per task (the most bounds each thread's scores, rows x keys floats), shared
 * tasks aimed at per thread, and distinct prefixes looked for per call. */
#define CASCADE_MIN 32
#define CASCADE_CHUNK 128
#define CASCADE_CHUNK_MAX 512
#define CASCADE_TASKS 4
#define CASCADE_GROUPS 16

/* Requests sharing their first `prefix` slots: members[first .. first + count) are their
 * batch rows, in order. Their partial softmaxes are Hkv * chunks blocks, block (h, c) for
 * KV head h and shared-key chunk c, each `count` member slices of G (D + 2) floats, from
 * member slice `part` of the call's partials on (decode_attention_kv.h). */
typedef struct {
    int64_t prefix, first, count, chunks, part;
} cascade_group;

/* The batch's cascade groups (at most CASCADE_GROUPS): request b joins the group whose
 * first member's slot list starts as its own when the two agree on at least CASCADE_MIN
 * slots; a group's prefix is the shortest such agreement, and at most seq_lens[b] - 1 for
 * every member, so each keeps its own new key. Groups of one are dropped. Fills group[b]
 * (index into gs, or -1) and members (B entries: the groups' rows, group by group);
 * returns the number of groups.
 *
 * Each group's prefix is split into even chunks of at most *chunk_len keys, one task per
 * chunk and KV head: chunks of CASCADE_CHUNK keys, or longer (up to CASCADE_CHUNK_MAX)
 * where the groups' shared keys give every one of the nt threads CASCADE_TASKS tasks of
 * them anyway. Each chunk costs every member row a partial softmax to write and merge, so
 * the verify rows of a few requests (a group of a request's own draft rows each) take few
 * long chunks, while one prefix shared by a whole batch is still split among the threads. */
static int64_t cascade_groups(const int64_t *slots, int64_t ld, const int64_t *seq_lens,
                              int64_t B, int64_t Hkv, int nt, int64_t *group,
                              int64_t *members, cascade_group *gs, int64_t *chunk_len) {
    int64_t leader[CASCADE_GROUPS], ng = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t *s = slots + b * ld, own = seq_lens[b] - 1;
        group[b] = -1;
        if (own < CASCADE_MIN) continue;
        int64_t j = 0;
        while (j < ng && slots[leader[j] * ld] != s[0]) ++j;
        if (j == ng) {
            if (ng == CASCADE_GROUPS) continue;
            leader[ng] = b;
            gs[ng++] = (cascade_group){own, 0, 1, 0, 0};
            group[b] = j;
            continue;
        }
        const int64_t *l = slots + leader[j] * ld, cap = own < gs[j].prefix ? own : gs[j].prefix;
        int64_t t = 0;
        while (t < cap && l[t] == s[t]) ++t;
        if (t < CASCADE_MIN) continue;
        gs[j].prefix = t;
        gs[j].count++;
        group[b] = j;
    }
    int64_t shared = 0, chunk = CASCADE_CHUNK;
    for (int64_t j = 0; j < ng; ++j)
        if (gs[j].count >= 2) shared += Hkv * gs[j].prefix;
    const int64_t want = CASCADE_TASKS * (int64_t)(nt > 0 ? nt : 1);
    if ((shared + want - 1) / want > chunk) chunk = (shared + want - 1) / want;
    if (chunk > CASCADE_CHUNK_MAX) chunk = CASCADE_CHUNK_MAX;
    *chunk_len = chunk; /* ceil(prefix / ceil(prefix / chunk)) <= chunk */
    int64_t keep[CASCADE_GROUPS], n = 0, first = 0, part = 0;
    for (int64_t j = 0; j < ng; ++j) {
        keep[j] = -1;
        if (gs[j].count < 2) continue;
        const int64_t chunks = (gs[j].prefix + chunk - 1) / chunk;
        const int64_t count = gs[j].count;
        gs[n] = (cascade_group){gs[j].prefix, first, 0, chunks, part};  /* n <= j */
        first += count;
        part += Hkv * chunks * count;
        keep[j] = n++;
    }
    for (int64_t b = 0; b < B; ++b) {
        group[b] = group[b] < 0 ? -1 : keep[group[b]];
        if (group[b] >= 0) members[gs[group[b]].first + gs[group[b]].count++] = b;
    }
    return n;
}

/* Where group gr's partials for KV head h, shared-key chunk c start (floats). */
static inline int64_t cascade_block(const cascade_group *gr, int64_t h, int64_t c, int64_t G,
                                    int64_t D) {
    return (gr->part + (h * gr->chunks + c) * gr->count) * G * (D + 2);
}

/* Shared keys [c0, c1) of chunk c of a prefix of P keys in `chunks` even chunks. */
static inline void cascade_chunk(int64_t P, int64_t chunks, int64_t c, int64_t *c0,
                                 int64_t *c1) {
    *c0 = P * c / chunks;
    *c1 = P * (c + 1) / chunks;
}

/* Softmax numerators in place: rows [0, R) of s (row stride `stride`, a multiple of 8,
 * 32-byte aligned; keys [0, L) valid, L <= stride) become exp(s - row max) over their
 * first W = L rounded up to 8 columns (keys L .. W - 1 set to -inf so they add zero;
 * columns past W untouched); rmax[g] gets the row's max, rsum[g] the sum of its exps.
 * Working over W, not the whole stride (sized for the batch's longest row), matters where
 * rows are shorter than the stride: the own keys of requests sharing a prefix, and the
 * cascade's shared chunks (in a stride sized for the longest chunk). */
static void softmax_rows(float *s0, int64_t R, int64_t L, int64_t stride, float *rmax,
                         float *rsum) {
    const int64_t W = (L + 7) / 8 * 8;
    for (int64_t g = 0; g < R; ++g) {
        float *s = s0 + g * stride;
        for (int64_t t = L; t < W; ++t) s[t] = -INFINITY;
        /* A NaN score may drop out of the max; its exp is NaN all the same, and so is the
         * row's sum. */
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
        int64_t t = 0;
        for (; t + 16 <= W; t += 16) {
            m0 = _mm256_max_ps(_mm256_load_ps(s + t), m0);
            m1 = _mm256_max_ps(_mm256_load_ps(s + t + 8), m1);
        }
        if (t < W) m0 = _mm256_max_ps(_mm256_load_ps(s + t), m0);
        const float m = hmax256(_mm256_max_ps(m0, m1));
        __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
        for (int64_t t = 0; t < W; t += 8) {
            __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + t), vm));
            _mm256_store_ps(s + t, e);
            vs = _mm256_add_ps(vs, e);
        }
        rmax[g] = m;
        rsum[g] = hsum256(vs);
    }
}

/* exp(x), 16 lanes: `exp256` on each half. */
static ZW_INLINE __m512 exp512(__m512 x) {
    const __m256 lo = exp256(_mm512_castps512_ps256(x));
    const __m256 hi = exp256(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* `softmax_rows` down the columns: st [L, ld] holds row r's scores in column r (ld a
 * multiple of 16); rows [0, R) become exp(s - row max) over keys [0, L), 16 rows a
 * vector, and rmax[r], rsum[r] get each row's max and sum of exps (columns R .. ld - 1
 * are computed and dropped). */
static ZW void softmax_cols(float *st, int64_t L, int64_t ld, int64_t R, float *rmax,
                            float *rsum) {
    for (int64_t j = 0; j < R; j += 16) {
        float *c = st + j;
        __m512 m = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
        for (int64_t t = 0; t < L; ++t) m = _mm512_max_ps(_mm512_loadu_ps(c + t * ld), m);
        for (int64_t t = 0; t < L; ++t) {
            const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(c + t * ld), m));
            _mm512_storeu_ps(c + t * ld, e);
            s = _mm512_add_ps(s, e);
        }
        float mm[16], ss[16];
        _mm512_storeu_ps(mm, m), _mm512_storeu_ps(ss, s);
        for (int64_t i = 0; i < 16 && j + i < R; ++i) rmax[j + i] = mm[i], rsum[j + i] = ss[i];
    }
}

#define KV_T float
#define KV_LOAD(p) _mm256_loadu_ps(p)
#define KV_LOAD16(p) _mm512_loadu_ps(p)
#define KV_TO_F32(x) (x)
#define KV_FN(name) name##_f32
#include "decode_attention_kv.h"
#include "verify_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_TO_F32
#undef KV_FN

#define KV_T uint16_t
#define KV_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KV_LOAD16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define KV_TO_F32(x) _cvtsh_ss(x)
#define KV_FN(name) name##_f16
#include "decode_attention_kv.h"
#include "verify_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_TO_F32
#undef KV_FN

#define KV_T uint8_t
#define KV_LOAD(p) load8_e4m3(p)
#define KV_LOAD16(p) load16_e4m3(p)
#define KV_TO_F32(x) e4m3_to_f32(x)
#define KV_FN(name) name##_e4m3
#include "decode_attention_kv.h"
#include "verify_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_TO_F32
#undef KV_FN

#define KV_T uint8_t
#define KV_LOAD(p) load8_e5m2(p)
#define KV_LOAD16(p) load16_e5m2(p)
#define KV_TO_F32(x) e5m2_to_f32(x)
#define KV_FN(name) name##_e5m2
#include "decode_attention_kv.h"
#include "verify_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_TO_F32
#undef KV_FN

/* q [B, H, D] with row stride ldq (floats), out [B, H, D] contiguous; k_buf, v_buf
 * [slots, Hkv, D] of the element format kv_fmt (fp8.h: float32, IEEE binary16, fp8 e4m3fn
 * or e5m2); slots [B, ld_slots] (int64, the first seq_lens[b] entries valid); D a multiple
 * of 8. window > 0: request b attends over its last `window` keys only, [max(0,
 * seq_lens[b] - window), seq_lens[b]) (sliding-window attention); 0: over all of them.
 * Returns 0, or -1 when out of memory. */
int radixlm_decode_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_fmt, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                             int64_t Hkv, int64_t D, float scale, int64_t window,
                             int num_threads) {
    switch (kv_fmt) {
    case KV_FMT_F16:
        return decode_attention_f16(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B, H,
                                    Hkv, D, scale, window, num_threads);
    case KV_FMT_E4M3:
        return decode_attention_e4m3(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B,
                                     H, Hkv, D, scale, window, num_threads);
    case KV_FMT_E5M2:
        return decode_attention_e5m2(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B,
                                     H, Hkv, D, scale, window, num_threads);
    default:
        return decode_attention_f32(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B, H,
                                    Hkv, D, scale, window, num_threads);
    }
}

/* The few new tokens of each of B requests (ext_lens[b] <= FEW_TOKENS, at most
 * seq_lens[b]) attending causally over their request's keys, no sliding window
 * (verify_attention_kv.h); q [T, H, D] (token row stride ldq), out [T, H, D] contiguous,
 * T = sum(ext_lens); other arguments as radixlm_decode_attention's. Returns 0, or -1
 * when out of memory. */
int radixlm_verify_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_fmt, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                             int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                             int num_threads) {
    switch (kv_fmt) {
    case KV_FMT_F16:
        return verify_attention_f16(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, ext_lens,
                                    out, B, H, Hkv, D, scale, num_threads);
    case KV_FMT_E4M3:
        return verify_attention_e4m3(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, ext_lens,
                                     out, B, H, Hkv, D, scale, num_threads);
    case KV_FMT_E5M2:
        return verify_attention_e5m2(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, ext_lens,
                                     out, B, H, Hkv, D, scale, num_threads);
    default:
        return verify_attention_f32(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, ext_lens,
                                    out, B, H, Hkv, D, scale, num_threads);
    }
}
