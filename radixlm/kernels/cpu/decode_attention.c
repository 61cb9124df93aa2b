/* Paged decode attention on CPU, fp32, AVX2 + FMA, OpenMP over requests (and KV heads).
 *
 * One new token per request attends over its whole sequence, read in place from the KV
 * pool through the request's slot list (no gather copy). The G = H / Hkv query heads of
 * a KV head share every K and V row they load (grouped-query attention, Ainslie et al.
 * 2023). Softmax is the exact two-pass form: scores, max, exp, sum, then the V sum.
 *
 * A task covers nh consecutive KV heads of one request: all Hkv when there are requests
 * enough to share out (a slot's K and V rows of every head are then read in one
 * contiguous pass, 768 bytes for SmolLM2; batch 16 x 300 keys, 30 layers from memory:
 * 15.7 -> 13.3 ms, batch 4 x 450: 9.1 -> 7.6 ms), else one (batch 1: three tasks).
 *
 * Where radixlm_gemm_isa says AVX-512 and D is a multiple of 64, the scores and the V
 * sum run in 512-bit vectors (`zqk_scores`, `zpv_sum`); the softmax stays AVX2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd_math.h"

/* Rows are read through the slot list, so the hardware prefetcher cannot see the next
 * one: fetch every cache line of the row AHEAD tokens on. */
#define AHEAD 8
static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch((const char *)row + i, _MM_HINT_T0);
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

#define KV_T float
#define KV_LOAD(p) _mm256_loadu_ps(p)
#define KV_LOAD16(p) _mm512_loadu_ps(p)
#define KV_FN(name) name##_f32
#include "decode_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_FN

#define KV_T uint16_t
#define KV_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KV_LOAD16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define KV_FN(name) name##_f16
#include "decode_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_LOAD16
#undef KV_FN

/* q [B, H, D] with row stride ldq (floats), out [B, H, D] contiguous; k_buf, v_buf
 * [slots, Hkv, D] of float32 (kv_f16 0) or float16 (kv_f16 1, IEEE binary16); slots
 * [B, ld_slots] (int64, the first seq_lens[b] entries valid); D a multiple of 8. Returns
 * 0, or -1 when out of memory. */
int radixlm_decode_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_f16, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                             int64_t Hkv, int64_t D, float scale, int num_threads) {
    if (kv_f16)
        return decode_attention_f16(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B, H,
                                    Hkv, D, scale, num_threads);
    return decode_attention_f32(q, ldq, k_buf, v_buf, slots, ld_slots, seq_lens, out, B, H, Hkv,
                                D, scale, num_threads);
}
