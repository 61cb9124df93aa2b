/* Row-wise fp32 kernels around the GEMMs of a decoder layer (AVX2 + FMA): RMSNorm,
 * SwiGLU's silu(gate) * up, RoPE in place, and the KV-pool store (into an fp32 or fp16
 * pool). Each replaces several torch ops whose per-call cost dominates at decode sizes.
 * Rows split across OpenMP threads only when a call is large enough (prefill) to pay for
 * the fork.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd_math.h"

#define PARALLEL_MIN (1 << 16) /* elements per call below which one thread does it all */

/* y[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) (Zhang & Sennrich 2019). */
void radixlm_rms_norm(const float *x, int64_t ldx, const float *w, float *y, int64_t rows,
                      int64_t dim, float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * ldx;
        float *yr = y + r * dim;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum256(acc);
        for (; i < dim; ++i) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        __m256 vinv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                                   _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv)));
        for (; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
}

/* y[r, :n] = silu(gu[r, :n]) * gu[r, n:2n], silu(g) = g / (1 + exp(-g)) (Shazeer 2020). */
void radixlm_silu_mul(const float *gu, float *y, int64_t rows, int64_t n, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * n >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *yr = y + r * n;
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv)));
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
        }
        for (; i < n; ++i) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* RoPE in place, rotate-half layout (Su et al. 2021): for the `heads` heads of each row,
 * x[:h] <- x[:h] cos[:h] - x[h:] sin[:h], x[h:] <- x[h:] cos[h:] + x[:h] sin[h:],
 * h = head_dim / 2; cos, sin [rows, head_dim]. */
void radixlm_rope(float *x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim,
                  const float *cos, const float *sin, int num_threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (rows * heads * head_dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t hd = 0; hd < heads; ++hd) {
            float *a = x + r * ldx + hd * head_dim, *b = a + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 av = _mm256_loadu_ps(a + i), bv = _mm256_loadu_ps(b + i);
                __m256 na = _mm256_fnmadd_ps(bv, _mm256_loadu_ps(s + i),
                                             _mm256_mul_ps(av, _mm256_loadu_ps(c + i)));
                __m256 nb = _mm256_fmadd_ps(av, _mm256_loadu_ps(s + half + i),
                                            _mm256_mul_ps(bv, _mm256_loadu_ps(c + half + i)));
                _mm256_storeu_ps(a + i, na);
                _mm256_storeu_ps(b + i, nb);
            }
            for (; i < half; ++i) {
                float av = a[i], bv = b[i];
                a[i] = av * c[i] - bv * s[i];
                b[i] = bv * c[half + i] + av * s[half + i];
            }
        }
    }
}

/* float32 -> IEEE binary16, round to nearest even, `n` a multiple of 8 (F16C). */
static inline void to_half(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
}

/* k_buf[loc[t]] = k[t], v_buf[loc[t]] = v[t]; rows of `width` floats (a multiple of 8),
 * source row stride ld; the buffers hold float32, or float16 when kv_f16 (converted here). */
void radixlm_store_kv(const float *k, const float *v, int64_t ld, void *k_buf, void *v_buf,
                      int kv_f16, const int64_t *loc, int64_t tokens, int64_t width,
                      int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (tokens * width >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; ++t) {
        if (kv_f16) {
            to_half((uint16_t *)k_buf + loc[t] * width, k + t * ld, width);
            to_half((uint16_t *)v_buf + loc[t] * width, v + t * ld, width);
        } else {
            memcpy((float *)k_buf + loc[t] * width, k + t * ld, width * sizeof(float));
            memcpy((float *)v_buf + loc[t] * width, v + t * ld, width * sizeof(float));
        }
    }
}
