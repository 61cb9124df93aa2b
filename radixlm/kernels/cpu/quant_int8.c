/* W8A8 int8 GEMM: int8 activations (quantized here, per token or with a static scale)
 * times int8 weights, accumulated exactly in int32, scaled back in fp32.
 *
 * Weight buffer w (kernels/cpu/quant.py `pack_int8`): a 64-byte header whose first float
 * is the static activation scale (0: dynamic per-token scales), then w_scale fp32 [N], then
 * q int8 [N, K] row-major: W = w_scale[n] q[n, k] (the canonical W8A8 int8 layout of
 * kernels/quant_ref.py). Each activation row is quantized as quant_ref's `quant_act_int8`:
 * scale = absmax / 127 (1 for an all-zero row), xq = round-half-even(x / scale) clamped to
 * [-127, 127], every step the same IEEE fp32 operation, so xq and the int32 sums equal
 * quant_ref's and y = ((float)acc * x_scale) * w_scale is bit for bit `w8a8_int8_ref`.
 *
 * Dot products: AVX2 has no signed x signed byte product, so |w| (unsigned, <= 128: a
 * checkpoint's weights may hold -128) meets sign(x, w) (x is in [-127, 127], so negating it
 * never overflows) in vpmaddubsw (pair sums <= 2 * 128 * 127 < 2^15, never saturating) and
 * vpmaddwd with ones widens to int32 (the llama.cpp trick); where the CPU has AVX-512 VNNI
 * (with VL) and the AVX-512 path is on (radixlm_gemm_isa), vpdpbusd does both steps on
 * 256-bit vectors. Threads split the output columns.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* Row r of x -> xq[r][0:K] int8 and its scale xs[r] (see the header comment). */
static void quantize_rows(const float *x, int64_t ldx, int64_t M, int64_t K, float act,
                          int8_t *xq, float *xs) {
    for (int64_t r = 0; r < M; ++r) {
        const float *xr = x + r * ldx;
        float s = act;
        if (act <= 0.0f) {
            float amax = 0.0f;
            for (int64_t k = 0; k < K; ++k)
                amax = fmaxf(amax, fabsf(xr[k]));
            s = amax / 127.0f;
            if (!(s > 0.0f))
                s = 1.0f;
        }
        xs[r] = s;
        for (int64_t k = 0; k < K; ++k) {
            float v = nearbyintf(xr[k] / s);
            xq[r * K + k] = (int8_t)fminf(fmaxf(v, -127.0f), 127.0f);
        }
    }
}

static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Int32 sums acc[i][j] = xq[i] . q[n + j] for i < mr (1 or 2) rows and 4 columns. DOT(acc,
 * u, s) adds the products of unsigned bytes u and signed bytes s in groups of four. */
#define INT8_TILE(NAME, ATTR, DOT)                                                               \
    static ATTR void NAME(const int8_t *xq, int64_t mr, const int8_t *q, int64_t K,            \
                          int32_t out[2][4]) {                                                  \
        __m256i acc[2][4];                                                                      \
        for (int i = 0; i < 2; ++i)                                                             \
            for (int j = 0; j < 4; ++j)                                                         \
                acc[i][j] = _mm256_setzero_si256();                                             \
        for (int64_t k = 0; k < K; k += 32) {                                                   \
            __m256i w[4], u[4];                                                                 \
            for (int j = 0; j < 4; ++j) {                                                       \
                w[j] = _mm256_loadu_si256((const __m256i *)(q + j * K + k));                    \
                u[j] = _mm256_abs_epi8(w[j]);                                                   \
            }                                                                                   \
            for (int i = 0; i < mr; ++i) {                                                      \
                __m256i a = _mm256_loadu_si256((const __m256i *)(xq + i * K + k));              \
                for (int j = 0; j < 4; ++j)                                                     \
                    acc[i][j] = DOT(acc[i][j], u[j], _mm256_sign_epi8(a, w[j]));                \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < mr; ++i)                                                            \
            for (int j = 0; j < 4; ++j)                                                         \
                out[i][j] = hsum(acc[i][j]);                                                    \
    }

static inline __m256i dot_avx2(__m256i acc, __m256i u, __m256i s) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
}
INT8_TILE(tile_avx2, , dot_avx2)

#define VNNI __attribute__((target("avx2,avx512f,avx512vl,avx512vnni")))
static inline VNNI __m256i dot_vnni(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
}
INT8_TILE(tile_vnni, VNNI, dot_vnni)

void radixlm_int8_gemm(const float *x, int64_t ldx, const uint8_t *w, float *y, int64_t M,
                       int64_t K, int64_t N, int num_threads) {
    float act;
    memcpy(&act, w, sizeof act);
    const float *ws = (const float *)(w + 64);
    const int8_t *q = (const int8_t *)(w + 64 + 4 * N);
    int8_t *xq = malloc((size_t)(M * K) + 64);
    float *xs = malloc((size_t)M * sizeof(float) + 64);
    quantize_rows(x, ldx, M, K, act, xq, xs);
    const int vnni = radixlm_gemm_isa(-1) && __builtin_cpu_supports("avx512vnni") &&
                     __builtin_cpu_supports("avx512vl");
    const int64_t NB = N / 16;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t n0 = 16 * (NB * t / nt), n1 = 16 * (NB * (t + 1) / nt);
        int32_t acc[2][4];
        for (int64_t n = n0; n < n1; n += 4) {
            for (int64_t m = 0; m < M; m += 2) {
                int64_t mr = M - m < 2 ? M - m : 2;
                if (vnni)
                    tile_vnni(xq + m * K, mr, q + n * K, K, acc);
                else
                    tile_avx2(xq + m * K, mr, q + n * K, K, acc);
                for (int64_t i = 0; i < mr; ++i)
                    for (int j = 0; j < 4; ++j)
                        y[(m + i) * N + n + j] = ((float)acc[i][j] * xs[m + i]) * ws[n + j];
            }
        }
    }
    free(xq);
    free(xs);
}
