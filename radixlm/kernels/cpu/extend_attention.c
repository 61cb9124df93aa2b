/* Paged extend (prefill) attention on CPU, fp32, AVX2 + FMA (products AVX-512 where the CPU
 * has it), OpenMP.
 *
 * Request b has ext_lens[b] new tokens at positions p .. seq_lens[b] - 1 (p, its cached
 * prefix); new token j attends causally over keys 0 .. p + j, read through the request's
 * slot list, or with a sliding window of W > 0 keys over p + j - W + 1 .. p + j (a task
 * then walks only the keys its tokens' windows cover). The work splits into tasks of (request, KV head, block of new tokens; a
 * request's blocks are of equal size); a task holds its G = H / Hkv query heads x its
 * tokens as one block of rows and walks the keys in blocks of KB, with the online softmax
 * of FlashAttention (Dao et al. 2022):
 *
 *   S = Q K^T (scaled); m' = max(m, rowmax S); P = exp(S - m'); l = l e^(m - m') + rowsum P;
 *   O = O e^(m - m') + P V;   finally out = O / l.
 *
 * Both products run the packed GEMM's register tiles (`radixlm_gemm_panels`): the
 * key block is copied transposed into 16-key panels [KB / 16][Dk][16] and the value block
 * into 16-column panels [Dv / 16][KB][16]. Needs Dk, Dv % 16 == 0. K rows are Dk and V rows
 * Dv elements, at strides ldk / ldv per slot: multi-head latent attention's V is the first
 * Dv elements of its K row (v_buf = k_buf, ldv = ldk). Where the CPU has AVX-512 the
 * products run 12-row x 2-panel tiles, the row max runs in vectors and O is rescaled in
 * 512-bit vectors (`zscale`); measurements in docs/perf-notes.md, "Extend attention".
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "kernels.h"
#include "simd_math.h"

#define KB 64         /* keys per block */
#define ROWS_MAX 96   /* query rows (tokens x heads of one KV head) per task, about */

typedef struct {
    int64_t b, h, j0, j1; /* request, KV head, new tokens [j0, j1) */
} task_t;

/* The D elements of a KV buffer from element `at` on, as floats: in place for float32,
 * converted into tmp [D] for the other formats (kv_fmt, fp8.h). */
static inline const float *kv_row(const void *buf, int kv_fmt, int64_t at, int64_t D,
                                  float *tmp) {
    if (kv_fmt == KV_FMT_F32) return (const float *)buf + at;
    if (kv_fmt == KV_FMT_F16) {
        const uint16_t *src = (const uint16_t *)buf + at;
        for (int64_t i = 0; i < D; i += 8)
            _mm256_storeu_ps(tmp + i,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        return tmp;
    }
    const uint8_t *src = (const uint8_t *)buf + at;
    if (kv_fmt == KV_FMT_E4M3)
        for (int64_t i = 0; i < D; i += 8) _mm256_storeu_ps(tmp + i, load8_e4m3(src + i));
    else
        for (int64_t i = 0; i < D; i += 8) _mm256_storeu_ps(tmp + i, load8_e5m2(src + i));
    return tmp;
}

/* o[0:D] *= c in 512-bit vectors (D % 16 == 0): the AVX-512 GEMM tiles then read each O
 * row back as whole 64-byte vectors, which the store buffer forwards only from stores as
 * wide (from two 32-byte stores the load waits for them to retire). */
static __attribute__((target("avx512f"))) void zscale(float *o, int64_t D, float c) {
    const __m512 vc = _mm512_set1_ps(c);
    for (int64_t i = 0; i < D; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(vc, _mm512_loadu_ps(o + i)));
}

static void run_task(const task_t *tk, const float *q, int64_t ldq, const void *k_buf,
                     int64_t ldk, const void *v_buf, int64_t ldv, int kv_fmt, const int64_t *sl,
                     int64_t p, int64_t q_row0, float *out, int64_t H, int64_t Hkv, int64_t Dk,
                     int64_t Dv, float scale, int64_t window, float *buf) {
    const int64_t G = H / Hkv, h = tk->h, nq = tk->j1 - tk->j0, R = nq * G;
    const int wide = radixlm_gemm_isa(-1);
    float *Q = buf, *O = Q + R * Dk, *S = O + R * Dv, *kp = S + R * KB, *vp = kp + KB * Dk;
    float *m = vp + KB * Dv, *l = m + R, *tmp = l + R;
    /* Rows r = (j - j0) * G + g: the G heads of token j sharing KV head h. */
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t g = 0; g < G; ++g) {
            const float *src = q + (q_row0 + tk->j0 + j) * ldq + (h * G + g) * Dk;
            float *dst = Q + (j * G + g) * Dk;
            for (int64_t i = 0; i < Dk; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(vs, _mm256_loadu_ps(src + i)));
        }
    memset(O, 0, (size_t)(R * Dv) * sizeof(float));
    for (int64_t r = 0; r < R; ++r) m[r] = -INFINITY, l[r] = 0.0f;

    const int64_t kmax = p + tk->j1; /* keys the last token sees */
    /* The first key the first token sees (window > 0: p + j0 - window + 1). */
    const int64_t kmin = window > 0 && p + tk->j0 + 1 > window ? p + tk->j0 + 1 - window : 0;
    for (int64_t t0 = kmin; t0 < kmax; t0 += KB) {
        const int64_t nk = kmax - t0 < KB ? kmax - t0 : KB, npan = (nk + 15) / 16;
        /* K block transposed into key panels kp[c][d][16]; V block into column panels
         * vp[dp][t][16]; keys past nk are zero (their scores are masked below). */
        for (int64_t c = 0; c < npan; ++c)
            for (int64_t tt = 0; tt < 16; ++tt) {
                int64_t t = c * 16 + tt;
                float *col = kp + c * Dk * 16 + tt;
                if (t < nk) {
                    const float *row = kv_row(k_buf, kv_fmt, sl[t0 + t] * ldk + h * Dk, Dk, tmp);
                    for (int64_t d = 0; d < Dk; ++d) col[d * 16] = row[d];
                } else {
                    for (int64_t d = 0; d < Dk; ++d) col[d * 16] = 0.0f;
                }
            }
        for (int64_t t = 0; t < npan * 16; ++t) {
            const float *row =
                t < nk ? kv_row(v_buf, kv_fmt, sl[t0 + t] * ldv + h * Dv, Dv, tmp) : 0;
            for (int64_t dp = 0; dp < Dv / 16; ++dp) {
                float *dst = vp + (dp * npan * 16 + t) * 16;
                if (row) {
                    _mm256_storeu_ps(dst, _mm256_loadu_ps(row + dp * 16));
                    _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(row + dp * 16 + 8));
                } else {
                    _mm256_storeu_ps(dst, _mm256_setzero_ps());
                    _mm256_storeu_ps(dst + 8, _mm256_setzero_ps());
                }
            }
        }
        radixlm_gemm_panels(R, 0, Q, Dk, kp, npan, Dk * 16, Dk, S, KB);
        /* Causal mask (and window), online softmax; P overwrites S. */
        for (int64_t r = 0; r < R; ++r) {
            float *s = S + r * KB;
            int64_t last = p + tk->j0 + r / G - t0; /* last visible key of this block */
            int64_t vis = last + 1 < nk ? last + 1 : nk;
            /* First visible key of this block: the window's start (none: 0). */
            const int64_t first = window > 0 && last + 1 > window ? last + 1 - window : 0;
            if (vis <= 0 || first >= nk) { /* the block is outside this token's keys: P = 0 */
                memset(s, 0, (size_t)(npan * 16) * sizeof(float));
                continue;
            }
            for (int64_t t = 0; t < first; ++t) s[t] = -INFINITY;
            for (int64_t t = vis; t < npan * 16; ++t) s[t] = -INFINITY;
            __m256 vmax = _mm256_set1_ps(m[r]);
            for (int64_t t = 0; t < npan * 16; t += 8)
                vmax = _mm256_max_ps(_mm256_loadu_ps(s + t), vmax); /* NaN scores skipped */
            const float mx = hmax256(vmax);
            const float corr = expf(m[r] - mx);
            __m256 vmx = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
            for (int64_t t = 0; t < npan * 16; t += 8) {
                __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
                _mm256_storeu_ps(s + t, e);
                sum = _mm256_add_ps(sum, e);
            }
            l[r] = l[r] * corr + hsum256(sum);
            m[r] = mx;
            if (corr != 1.0f) {
                if (wide)
                    zscale(O + r * Dv, Dv, corr);
                else {
                    __m256 vc = _mm256_set1_ps(corr);
                    float *o = O + r * Dv;
                    for (int64_t i = 0; i < Dv; i += 8)
                        _mm256_storeu_ps(o + i, _mm256_mul_ps(vc, _mm256_loadu_ps(o + i)));
                }
            }
        }
        radixlm_gemm_panels(R, 1, S, KB, vp, Dv / 16, npan * 16 * 16, npan * 16, O, Dv);
    }
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t g = 0; g < G; ++g) {
            int64_t r = j * G + g;
            const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
            float *dst = out + (q_row0 + tk->j0 + j) * H * Dv + (h * G + g) * Dv;
            for (int64_t i = 0; i < Dv; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(inv, _mm256_loadu_ps(O + r * Dv + i)));
        }
}

/* New tokens per request up to which a trailing run of requests goes to the decode
 * kernel (radixlm_extend_attention). */
#define FEW_TOKENS 16

/* The B requests' ext_lens[b] new tokens each (arguments as radixlm_decode_attention's,
 * slots [B, ld_slots] the requests' lists): one token each to the decode kernel; with no
 * window to the verify-row kernel; under a sliding window as sum(ext_lens) one-token rows
 * of the decode kernel, row j of request b getting b's first seq_lens[b] - ext_lens[b] +
 * j + 1 slots. Returns 0, or -1 when out of memory. */
static int few_token_rows(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                          int kv_fmt, const int64_t *slots, int64_t ld_slots,
                          const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                          int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                          int64_t window, int num_threads) {
    int64_t rows = 0, ld = 1;
    for (int64_t b = 0; b < B; ++b) {
        rows += ext_lens[b];
        ld = seq_lens[b] > ld ? seq_lens[b] : ld;
    }
    if (rows == B) /* one token each: the requests' own lists */
        return radixlm_decode_attention(q, ldq, k_buf, v_buf, kv_fmt, slots, ld_slots, seq_lens,
                                        out, B, H, Hkv, D, scale, window, num_threads);
    if (window == 0)
        return radixlm_verify_attention(q, ldq, k_buf, v_buf, kv_fmt, slots, ld_slots, seq_lens,
                                        ext_lens, out, B, H, Hkv, D, scale, num_threads);
    int64_t *lens = malloc((size_t)rows * (size_t)(ld + 1) * sizeof(int64_t));
    if (!lens) return -1;
    int64_t *rs = lens + rows, r = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < ext_lens[b]; ++j, ++r) {
            lens[r] = seq_lens[b] - ext_lens[b] + j + 1;
            memcpy(rs + r * ld, slots + b * ld_slots, (size_t)lens[r] * sizeof(int64_t));
        }
    const int rc = radixlm_decode_attention(q, ldq, k_buf, v_buf, kv_fmt, rs, ld, lens, out,
                                            rows, H, Hkv, D, scale, window, num_threads);
    free(lens);
    return rc;
}

/* q [T, H, Dk] (token row stride ldq), out [T, H, Dv] contiguous, T = sum(ext_lens), the
 * requests' new tokens in order; K row of slot s, KV head h at k_buf + s ldk + h Dk, its V
 * row at v_buf + s ldv + h Dv, in the element format kv_fmt (fp8.h); slots [B, ld_slots]
 * (int64, the first seq_lens[b] valid, the new tokens' K/V already stored);
 * 1 <= ext_lens[b] <= seq_lens[b]. Dk, Dv % 16 == 0, H % Hkv == 0. window > 0: each new
 * token sees its last `window` positions only (sliding-window attention); 0: all of them.
 * Returns 0, or -1 when out of memory. */
int radixlm_extend_attention(const float *q, int64_t ldq, const void *k_buf, int64_t ldk,
                             const void *v_buf, int64_t ldv, int kv_fmt, const int64_t *slots,
                             int64_t ld_slots, const int64_t *seq_lens, const int64_t *ext_lens,
                             float *out, int64_t B, int64_t H, int64_t Hkv, int64_t Dk,
                             int64_t Dv, float scale, int64_t window, int num_threads) {
    /* A trailing run of few-token requests (the decodes that ride along in a mixed step,
     * a speculative step's root + draft rows) goes to the decode kernels, which read each
     * K / V row once for all query heads of a KV head; the verify-row kernel scores all
     * of a request's rows together and reads keys that requests share once for all of
     * them (cascade groups). Under a sliding window, token j of a request with cached
     * prefix p goes to the decode kernel as a one-token request over keys 0 .. p + j. Here
     * each task would pack the request's whole key range per KV head for a few query rows
     * (docs/perf-notes.md, "Extend attention"). Where K and V rows differ (latent
     * attention) only one-token requests go, to the latent decode kernel. */
    const int plain = Dk == Dv && ldk == Hkv * Dk && ldv == Hkv * Dv;
    const int64_t few = plain ? FEW_TOKENS : 1;
    int64_t B1 = B, rows1 = 0;
    while (B1 > 0 && ext_lens[B1 - 1] <= few) --B1;
    for (int64_t b = 0; b < B1; ++b) rows1 += ext_lens[b];
    if (B1 < B) {
        int rc = plain ? few_token_rows(q + rows1 * ldq, ldq, k_buf, v_buf, kv_fmt,
                                        slots + B1 * ld_slots, ld_slots, seq_lens + B1,
                                        ext_lens + B1, out + rows1 * H * Dv, B - B1, H, Hkv, Dk,
                                        scale, window, num_threads)
                       : radixlm_decode_attention_mla(
                             q + rows1 * ldq, ldq, k_buf, ldk, v_buf, ldv, kv_fmt,
                             slots + B1 * ld_slots, ld_slots, seq_lens + B1, out + rows1 * H * Dv,
                             B - B1, H, Hkv, Dk, Dv, scale, window, num_threads);
        if (rc != 0 || B1 == 0) return rc;
        B = B1;
    }
    const int64_t G = H / Hkv, qb = ROWS_MAX / G > 0 ? ROWS_MAX / G : 1;
    int64_t ntasks = 0;
    for (int64_t b = 0; b < B; ++b) ntasks += Hkv * ((ext_lens[b] + qb - 1) / qb);
    task_t *tasks = malloc((size_t)(ntasks > 0 ? ntasks : 1) * sizeof(task_t));
    int64_t *row0 = malloc((size_t)(B > 0 ? B : 1) * sizeof(int64_t));
    if (!tasks || !row0) {
        free(tasks), free(row0);
        return -1;
    }
    /* Longest key ranges first (the last token blocks of each request), so the dynamic
     * schedule ends with short tasks. */
    int64_t n = 0, start = 0;
    for (int64_t b = 0; b < B; ++b) {
        row0[b] = start;
        start += ext_lens[b];
    }
    for (int64_t b = 0; b < B; ++b) {
        /* Equal blocks (33 tokens: 17 + 16, not 32 + 1: every task packs all its keys). */
        const int64_t nb = (ext_lens[b] + qb - 1) / qb;
        for (int64_t i = nb; i > 0; --i)
            for (int64_t h = 0; h < Hkv; ++h)
                tasks[n++] = (task_t){b, h, ext_lens[b] * (i - 1) / nb, ext_lens[b] * i / nb};
    }
    const int64_t R = qb * G;
    const int64_t Dmax = Dk > Dv ? Dk : Dv;
    const size_t floats = (size_t)(R * (Dk + Dv) + R * KB + KB * (Dk + Dv) + 2 * R + Dmax);
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *buf = aligned_alloc(32, (floats * sizeof(float) + 31) / 32 * 32);
        if (!buf) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; ++i) {
            if (!buf) continue;
            const task_t *tk = tasks + i;
            const int64_t p = seq_lens[tk->b] - ext_lens[tk->b];
            run_task(tk, q, ldq, k_buf, ldk, v_buf, ldv, kv_fmt, slots + tk->b * ld_slots, p,
                     row0[tk->b], out, H, Hkv, Dk, Dv, scale, window, buf);
        }
        free(buf);
    }
    free(tasks), free(row0);
    return failed ? -1 : 0;
}
