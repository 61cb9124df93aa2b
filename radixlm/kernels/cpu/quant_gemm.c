/* GEMM over quantized weights kept packed (GGUF Q4_1 / Q8_0 blocks, checkpoint int4 groups,
 * fp8 e4m3 channels), computing in fp32; int8 x int8 products for W8A8 in quant_int8.c.
 *
 * y[M, N] = x[M, K] @ W^T where W [N, K] is stored as quantized panels: panel b holds
 * columns 16b..16b+15 of W^T as K / 32 groups of 32 k, each group of GROUP_BYTES[fmt]:
 *
 *   Q4_1 (320 bytes): d[16], m[16] IEEE fp16, then 16 pairs of k rows (2p, 2p + 1), 16
 *                     bytes each, byte j = q[2p][j] | q[2p + 1][j] << 4 (q in 0..15);
 *                     W = d q + m.
 *   Q8_0 (544 bytes): d[16] IEEE fp16, then 32 k rows of 16 int8; W = d q.
 *   W4G  (336 bytes): s[16] fp32, z[16] uint8 (0..15), then 16 pairs of k rows packed as
 *                     Q4_1's; W = s (q - z), the canonical W4A16 layout's value
 *                     (kernels/quant_ref.py: an exact small integer times s, one rounding).
 *   F8   (576 bytes): s[16] fp32, then 32 k rows of 16 float8_e4m3fn bytes; W = s f8(q),
 *                     one rounding. An e4m3 byte's 7 magnitude bits placed at fp32 bits
 *                     20..26 (exponent field low bits + 3 mantissa bits) read as the fp32
 *                     f8 * 2^-120, subnormal bytes as fp32 subnormals, so one exact
 *                     multiplication by 2^120 decodes every finite byte (the kernels run
 *                     without flush-to-zero / denormals-are-zero); the NaN bytes 0x7f /
 *                     0xff, which no checkpoint holds, decode as +-480.
 *
 * These are llama.cpp's block formats (ggml-quants: one d (and m) per 32 weights of a row)
 * regrouped 16 output columns wide, so the values are the GGUF file's bit for bit: d q is
 * exact in fp32 (an 11-bit by 8-bit product), and one FMA rounds d q + m once, as the
 * fp32 dequantization (`gguf` package: d * q + m in float32) does. Each thread dequantizes
 * a slice of up to QKB k rows of one or two panels into an L1-resident fp32 buffer and runs
 * the packed GEMM's own register tiles (radixlm_gemm_panels) over it, so the products and
 * their summation order equal those over fp32 panels of the same weights, while the step
 * streams 0.625 (Q4_1) or 1.0625 (Q8_0) bytes per weight from memory instead of 4.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "kernels.h"

/* Largest k slice dequantized at once: two panels of it (2 * 256 * 16 floats, 32 KiB)
 * stay in L1 while the row tiles read them. */
#define QKB 256

static const int64_t GROUP_BYTES[5] = {0, 320, 544, 336, 576};

/* AVX2: groups of the checkpoint formats (W4G, F8) into buf[ng * 32][16]; both ISAs'
 * GEMMs read the same buffer, so one dequantization serves both. */
static void dequant_ckpt(int fmt, const uint8_t *g, int64_t ng, float *restrict buf) {
    const __m256i low = _mm256_set1_epi32(15), mag = _mm256_set1_epi32(0x7f);
    const __m256i sign = _mm256_set1_epi32(0x80);
    const __m256 two120 = _mm256_set1_ps(0x1p120f);
    for (int64_t i = 0; i < ng; ++i, g += GROUP_BYTES[fmt], buf += 32 * 16) {
        for (int h = 0; h < 2; ++h) { /* columns 8h..8h+7 */
            __m256 s = _mm256_loadu_ps((const float *)g + 8 * h);
            if (fmt == 3) {
                __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + 64 + 8 * h)));
                for (int p = 0; p < 16; ++p) {
                    __m256i v = _mm256_cvtepu8_epi32(
                        _mm_loadl_epi64((const __m128i *)(g + 80 + 16 * p + 8 * h)));
                    __m256 lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, low), z));
                    __m256 hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), z));
                    _mm256_storeu_ps(buf + 2 * p * 16 + 8 * h, _mm256_mul_ps(s, lo));
                    _mm256_storeu_ps(buf + (2 * p + 1) * 16 + 8 * h, _mm256_mul_ps(s, hi));
                }
            } else {
                for (int k = 0; k < 32; ++k) {
                    __m256i v = _mm256_cvtepu8_epi32(
                        _mm_loadl_epi64((const __m128i *)(g + 64 + 16 * k + 8 * h)));
                    __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(v, mag), 20),
                                                   _mm256_slli_epi32(_mm256_and_si256(v, sign), 24));
                    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(bits), two120);
                    _mm256_storeu_ps(buf + k * 16 + 8 * h, _mm256_mul_ps(s, f));
                }
            }
        }
    }
}

/* AVX2 + F16C: groups [g0, g0 + ng) of one panel into buf[ng * 32][16]. */
static void dequant_avx2(int fmt, const uint8_t *g, int64_t ng, float *restrict buf) {
    const __m256i low = _mm256_set1_epi32(15);
    for (int64_t i = 0; i < ng; ++i, g += GROUP_BYTES[fmt], buf += 32 * 16) {
        for (int h = 0; h < 2; ++h) { /* columns 8h..8h+7 */
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
            if (fmt == 1) {
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 32 + 16 * h)));
                for (int p = 0; p < 16; ++p) {
                    __m256i v = _mm256_cvtepu8_epi32(
                        _mm_loadl_epi64((const __m128i *)(g + 64 + 16 * p + 8 * h)));
                    __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low));
                    __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
                    _mm256_storeu_ps(buf + 2 * p * 16 + 8 * h, _mm256_fmadd_ps(d, lo, m));
                    _mm256_storeu_ps(buf + (2 * p + 1) * 16 + 8 * h, _mm256_fmadd_ps(d, hi, m));
                }
            } else {
                for (int k = 0; k < 32; ++k) {
                    __m256i v = _mm256_cvtepi8_epi32(
                        _mm_loadl_epi64((const __m128i *)(g + 32 + 16 * k + 8 * h)));
                    _mm256_storeu_ps(buf + k * 16 + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
                }
            }
        }
    }
}

#define AVX512 __attribute__((target("avx512f")))

/* AVX-512F: as dequant_avx2, 16 columns per vector. */
static AVX512 void dequant_avx512(int fmt, const uint8_t *g, int64_t ng, float *restrict buf) {
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t i = 0; i < ng; ++i, g += GROUP_BYTES[fmt], buf += 32 * 16) {
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        if (fmt == 1) {
            __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 32)));
            for (int p = 0; p < 16; ++p) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + 64 + 16 * p)));
                __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, low));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
                _mm512_storeu_ps(buf + 2 * p * 16, _mm512_fmadd_ps(d, lo, m));
                _mm512_storeu_ps(buf + (2 * p + 1) * 16, _mm512_fmadd_ps(d, hi, m));
            }
        } else {
            for (int k = 0; k < 32; ++k) {
                __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 32 + 16 * k)));
                _mm512_storeu_ps(buf + k * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
            }
        }
    }
}

/* groups (ng consecutive groups of one panel) into buf[ng * 32][16] fp32, in the ISA the
 * GEMM uses (the blocked path reads slices through it). */
void radixlm_quant_dequant(int fmt, const uint8_t *groups, int64_t ng, float *buf) {
    if (fmt >= 3)
        dequant_ckpt(fmt, groups, ng, buf);
    else if (radixlm_gemm_isa(-1))
        dequant_avx512(fmt, groups, ng, buf);
    else
        dequant_avx2(fmt, groups, ng, buf);
}

/* Rows from which the threads run the packed GEMM's blocked path (radixlm_gemm_blocked: x
 * packed into L2 blocks, each panel slice dequantized once per block of rows); below,
 * slices of one or two panels go through the in-place row tiles. */
#define QBLOCKED_ROWS 24

/* Rows [0, M) of panels [b0, b1), slice by slice through the in-place row tiles. */
static void quant_slices(const float *x, int64_t ldx, const uint8_t *w, int fmt, float *y,
                         int64_t M, int64_t K, int64_t N, int64_t b0, int64_t b1) {
    const int64_t G = K / 32, gb = GROUP_BYTES[fmt], pbytes = G * gb;
    /* Equal k slices of whole groups, at most QKB rows. */
    const int64_t nk = (K + QKB - 1) / QKB, sg = (G + nk - 1) / nk;
    float buf[2 * QKB * 16] __attribute__((aligned(64)));
    for (int64_t b = b0, np; b < b1; b += np) {
        np = b + 1 < b1 ? 2 : 1;
        for (int64_t g0 = 0; g0 < G; g0 += sg) {
            int64_t ng = G - g0 < sg ? G - g0 : sg, kn = ng * 32;
            for (int64_t c = 0; c < np; ++c)
                radixlm_quant_dequant(fmt, w + (b + c) * pbytes + g0 * gb, ng, buf + c * kn * 16);
            radixlm_gemm_panels(M, g0 > 0, x + g0 * 32, ldx, buf, np, kn * 16, kn, y + b * 16, N);
        }
    }
}

/* y [M, N] row-major; x [M, K] (row stride ldx; contiguous from QBLOCKED_ROWS rows); w
 * [N / 16][K / 32][group] in format fmt (1 Q4_1, 2 Q8_0, 3 W4G, 4 F8); needs N % 16 == 0 and
 * K % 32 == 0 (the caller checks). The threads split the panels. */
void radixlm_quant_gemm(const float *x, int64_t ldx, const uint8_t *w, int fmt, float *y,
                        int64_t M, int64_t K, int64_t N, int num_threads) {
    const int64_t NB = N / 16;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t b0 = NB * t / nt, b1 = NB * (t + 1) / nt;
        if (M >= QBLOCKED_ROWS && ldx == K) {
            radixlm_wsrc src = {w, fmt, K / 32 * GROUP_BYTES[fmt], GROUP_BYTES[fmt]};
            radixlm_gemm_blocked(x, &src, y, M, K, N, b0, b1);
        } else {
            quant_slices(x, ldx, w, fmt, y, M, K, N, b0, b1);
        }
    }
}

/* y = x W^T for a weight in format fmt: 0 fp32 panels (radixlm_packed_gemm, x contiguous),
 * 1 to 4 quantized panels (radixlm_quant_gemm), 5 W8A8 int8 (radixlm_int8_gemm). */
void radixlm_weight_gemm(int fmt, const float *x, const void *w, float *y, int64_t M,
                         int64_t K, int64_t N, int num_threads) {
    if (fmt == 0)
        radixlm_packed_gemm(x, (const float *)w, y, M, K, N, num_threads);
    else if (fmt == 5)
        radixlm_int8_gemm(x, K, (const uint8_t *)w, y, M, K, N, num_threads);
    else
        radixlm_quant_gemm(x, K, (const uint8_t *)w, fmt, y, M, K, N, num_threads);
}
