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


#define KV_T float
#define KV_LOAD(p) _mm256_loadu_ps(p)
#define KV_FN(name) name##_f32
#include "decode_attention_kv.h"
#undef KV_T
#undef KV_LOAD
#undef KV_FN

#define KV_T uint16_t
#define KV_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KV_FN(name) name##_f16
#include "decode_attention_kv.h"
#undef KV_T
#undef KV_LOAD
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
