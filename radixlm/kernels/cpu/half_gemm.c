/* GEMM of a few fp32 rows against IEEE fp16 weight panels, the conversion fused into the
 * product: y[M, N] = x[M, K] @ W^T with W [N, K] stored as fp16 panels [ceil(N / 16)][K][16]
 * (the fp32 panel layout of packed_gemm.c, at 2 bytes a weight). Each weight is widened to
 * fp32 exactly (F16C `vcvtph2ps`) and multiplied and summed in fp32.
 *
 * It serves the greedy screen of the LM head (runtime/executor/layers/head_screen.py): at a few
 * rows the head's product is bound by the bytes it streams, and fp16 panels halve them.
 * The screen's error bound holds for any summation order, so the k loop keeps several
 * partial sums per column (independent FMA chains) and adds them at the end; the results
 * are not those of the fp32 GEMM over the same values, and nothing relies on that.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

#define AVX512 __attribute__((target("avx512f")))

/* y[r, 0:16] = x[r, 0:K] @ panel (fp16 [K][16]) for the rows r < mr (mr <= 2) of x (row
 * stride K); four partial sums per row and column (k mod 4). */
static AVX512 void ztile_half(int mr, const float *x, int64_t K, const uint16_t *w,
                              float *y, int64_t ldy) {
    __m512 a[2][4];
    for (int r = 0; r < 2; ++r)
        for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        for (int j = 0; j < 4; ++j) {
            __m512 wk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + (k + j) * 16)));
            a[0][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[k + j]), wk, a[0][j]);
            if (mr > 1) a[1][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[K + k + j]), wk, a[1][j]);
        }
    for (; k < K; ++k) {
        __m512 wk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k * 16)));
        a[0][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), wk, a[0][0]);
        if (mr > 1) a[1][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[K + k]), wk, a[1][0]);
    }
    for (int r = 0; r < mr; ++r)
        _mm512_storeu_ps(y + r * ldy, _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]),
                                                    _mm512_add_ps(a[r][2], a[r][3])));
}

/* The AVX2 + F16C form of ztile_half over K k rows of x (row stride ldx): each 16-column
 * row in two 8-lane halves, two partial sums per half (k mod 2); with `acc` the first
 * starts from y; with `pf` the line 32 k bytes on from pf is fetched at k (k even). */
static inline __attribute__((always_inline)) void tile_half(int mr, int acc, const float *x,
                                                            int64_t ldx, int64_t K,
                                                            const uint16_t *w, float *y,
                                                            int64_t ldy, const char *pf) {
    __m256 a[2][2][2];
    for (int r = 0; r < 2; ++r)
        for (int h = 0; h < 2; ++h) {
            a[r][h][0] = acc && r < mr ? _mm256_loadu_ps(y + r * ldy + 8 * h) : _mm256_setzero_ps();
            a[r][h][1] = _mm256_setzero_ps();
        }
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        if (pf) _mm_prefetch(pf + k * 32, _MM_HINT_T1);
        for (int j = 0; j < 2; ++j)
            for (int h = 0; h < 2; ++h) {
                __m256 wk = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(w + (k + j) * 16 + 8 * h)));
                a[0][h][j] = _mm256_fmadd_ps(_mm256_set1_ps(x[k + j]), wk, a[0][h][j]);
                if (mr > 1)
                    a[1][h][j] = _mm256_fmadd_ps(_mm256_set1_ps(x[ldx + k + j]), wk, a[1][h][j]);
            }
    }
    for (; k < K; ++k)
        for (int h = 0; h < 2; ++h) {
            __m256 wk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k * 16 + 8 * h)));
            a[0][h][0] = _mm256_fmadd_ps(_mm256_set1_ps(x[k]), wk, a[0][h][0]);
            if (mr > 1) a[1][h][0] = _mm256_fmadd_ps(_mm256_set1_ps(x[ldx + k]), wk, a[1][h][0]);
        }
    for (int r = 0; r < mr; ++r)
        for (int h = 0; h < 2; ++h)
            _mm256_storeu_ps(y + r * ldy + 8 * h, _mm256_add_ps(a[r][h][0], a[r][h][1]));
}

/* y[r, 0:16] = x[r, 0:K] @ panel for the rows r < mr (3 <= mr <= 8): one sum per row and
 * column, each weight widened once for all the rows. */
static AVX512 void ztile_half_rows(int mr, const float *x, int64_t K, const uint16_t *w,
                                   float *y, int64_t ldy) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (int64_t k = 0; k < K; ++k) {
        __m512 wk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k * 16)));
        const float *xk = x + k;
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(xk[0]), wk, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(xk[K]), wk, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(xk[2 * K]), wk, a2);
        if (mr > 3) a3 = _mm512_fmadd_ps(_mm512_set1_ps(xk[3 * K]), wk, a3);
        if (mr > 4) a4 = _mm512_fmadd_ps(_mm512_set1_ps(xk[4 * K]), wk, a4);
        if (mr > 5) a5 = _mm512_fmadd_ps(_mm512_set1_ps(xk[5 * K]), wk, a5);
        if (mr > 6) a6 = _mm512_fmadd_ps(_mm512_set1_ps(xk[6 * K]), wk, a6);
        if (mr > 7) a7 = _mm512_fmadd_ps(_mm512_set1_ps(xk[7 * K]), wk, a7);
    }
    __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int r = 0; r < mr; ++r) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

/* The AVX2 + F16C form of ztile_half_rows for 3 <= mr <= 4 rows, `ldx`, `acc` and `pf` as
 * tile_half's. */
static inline __attribute__((always_inline)) void tile_half_rows(int mr, int acc,
                                                                 const float *x, int64_t ldx,
                                                                 int64_t K, const uint16_t *w,
                                                                 float *y, int64_t ldy,
                                                                 const char *pf) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00;
    if (acc) {
        a00 = _mm256_loadu_ps(y), a01 = _mm256_loadu_ps(y + 8);
        a10 = _mm256_loadu_ps(y + ldy), a11 = _mm256_loadu_ps(y + ldy + 8);
        a20 = _mm256_loadu_ps(y + 2 * ldy), a21 = _mm256_loadu_ps(y + 2 * ldy + 8);
        if (mr > 3) a30 = _mm256_loadu_ps(y + 3 * ldy), a31 = _mm256_loadu_ps(y + 3 * ldy + 8);
    }
    for (int64_t k = 0; k < K; ++k) {
        if (pf && !(k & 1)) _mm_prefetch(pf + k * 32, _MM_HINT_T1);
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k * 16)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k * 16 + 8)));
        const float *xk = x + k;
        __m256 x0 = _mm256_set1_ps(xk[0]), x1 = _mm256_set1_ps(xk[ldx]);
        __m256 x2 = _mm256_set1_ps(xk[2 * ldx]);
        a00 = _mm256_fmadd_ps(x0, w0, a00), a01 = _mm256_fmadd_ps(x0, w1, a01);
        a10 = _mm256_fmadd_ps(x1, w0, a10), a11 = _mm256_fmadd_ps(x1, w1, a11);
        a20 = _mm256_fmadd_ps(x2, w0, a20), a21 = _mm256_fmadd_ps(x2, w1, a21);
        if (mr > 3) {
            __m256 x3 = _mm256_set1_ps(xk[3 * ldx]);
            a30 = _mm256_fmadd_ps(x3, w0, a30), a31 = _mm256_fmadd_ps(x3, w1, a31);
        }
    }
    __m256 out[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int r = 0; r < mr; ++r) {
        _mm256_storeu_ps(y + r * ldy, out[r][0]);
        _mm256_storeu_ps(y + r * ldy + 8, out[r][1]);
    }
}

/* Rows of the next tile when `rest` rows remain and a tile takes at most `most`: balanced,
 * so 10 rows in tiles of 8 go as 5 + 5, not 8 + 2. */
static inline int64_t balanced_rows(int64_t rest, int64_t most) {
    const int64_t ntiles = (rest + most - 1) / most;
    return (rest + ntiles - 1) / ntiles;
}

/* Where a tile of rows m.. over the `width` columns from 16 b writes (`cols` of them real):
 * y in place (row stride N) when all are, else `tail` (row stride width), which
 * `tail_out` then copies into y's real columns. */
static inline float *tile_dst(float *y, int64_t N, int64_t m, int64_t b, int64_t width,
                              int64_t cols, float *tail, int64_t *ldy) {
    *ldy = cols == width ? N : width;
    return cols == width ? y + m * N + b * 16 : tail;
}

static inline void tail_out(float *y, int64_t N, int64_t m, int64_t b, int64_t width,
                            int64_t cols, const float *tail, int64_t mr) {
    if (cols < width)
        for (int64_t r = 0; r < mr; ++r)
            memcpy(y + (m + r) * N + b * 16, tail + r * width, cols * sizeof(float));
}

/* Rows of x one pass over a panel serves: two (with split sums) for one or two rows, else
 * up to ZROWS (AVX-512) or 4 (AVX2). */
#define ZROWS 8
/* How far ahead (bytes) a 3- or 4-row AVX2 tile fetches in its stream (half_streams). */
#define HALF_AHEAD 8192

/* One AVX2 row tile over kn k rows, fetching from `pf` on (0: none) meanwhile; `mr` a
 * constant in each call site, so the tiles specialise. */
static void half_tile(int64_t mr, int acc, const float *x, int64_t ldx, int64_t kn,
                      const uint16_t *w, float *y, int64_t ldy, const char *pf) {
    switch (mr) {
    case 1: tile_half(1, acc, x, ldx, kn, w, y, ldy, pf); break;
    case 2: tile_half(2, acc, x, ldx, kn, w, y, ldy, pf); break;
    case 3: tile_half_rows(3, acc, x, ldx, kn, w, y, ldy, pf); break;
    default: tile_half_rows(4, acc, x, ldx, kn, w, y, ldy, pf);
    }
}

/* Panels [b0, b1) of y for M <= 4 rows on AVX2 (one thread's share, one row tile), read
 * as packed_gemm.c's stream_panels reads fp32 panels: the range in `streams` equal parts,
 * panel i of every part in turn, `chunk` k rows at a time, with `ahead` > 0 each chunk's
 * tile fetching the lines `ahead` bytes on in its part. One or two rows take four parts
 * of 16 k rows without prefetch, three or four two parts of 32 with it (each the faster
 * measured; docs/perf-notes.md, "The LM head's greedy screen"). */
static void half_streams(const float *x, const uint16_t *panels, float *y, int64_t M,
                         int64_t K, int64_t N, int64_t b0, int64_t b1, int64_t streams,
                         int64_t chunk, int64_t ahead) {
    const int64_t n = b1 - b0, L = (n + streams - 1) / streams;
    float tail[4 * 16];
    for (int64_t i = 0; i < L; ++i)
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
            const int64_t kn = K - k0 < chunk ? K - k0 : chunk;
            for (int64_t s = 0; s < streams && s * L + i < n; ++s) {
                const int64_t b = b0 + s * L + i, cols = N - b * 16 < 16 ? N - b * 16 : 16;
                int64_t ldy;
                float *dst = tile_dst(y, N, 0, b, 16, cols, tail, &ldy);
                const uint16_t *w = panels + (b * K + k0) * 16;
                half_tile(M, k0 > 0, x + k0, K, kn, w, dst, ldy,
                          ahead ? (const char *)w + ahead : 0);
                if (k0 + kn == K) tail_out(y, N, 0, b, 16, cols, tail, M);
            }
        }
}

/* x [M, K] row-major; panels fp16 [ceil(N / 16), K, 16]; y [M, N] row-major. Each panel
 * is widened once per tile of rows (the panel stays in L1 / L2 for the next tile); the
 * threads split the panels evenly, and on AVX2 up to 4 rows read their share as several
 * streams (half_streams). */
void radixlm_half_gemm(const float *x, const uint16_t *panels, float *y, int64_t M, int64_t K,
                       int64_t N, int num_threads) {
    const int64_t NB = (N + 15) / 16;
    const int z = radixlm_gemm_isa(-1), most = M <= 2 ? 2 : z ? ZROWS : 4;
    if (M == 0) return;
    if (!z && M <= 4) {
#pragma omp parallel num_threads(num_threads)
        {
            const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int few = M <= 2;
            half_streams(x, panels, y, M, K, N, NB * t / nt, NB * (t + 1) / nt, few ? 4 : 2,
                         few ? 16 : 32, few ? 0 : HALF_AHEAD);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < NB; ++b) {
        const uint16_t *w = panels + b * K * 16;
        const int64_t cols = N - b * 16 < 16 ? N - b * 16 : 16;
        float tail[ZROWS * 16];
        for (int64_t m = 0, mr; m < M; m += mr) {
            mr = balanced_rows(M - m, most);
            int64_t ldy;
            float *dst = tile_dst(y, N, m, b, 16, cols, tail, &ldy);
            const float *xm = x + m * K;
            if (z)
                (mr <= 2 ? ztile_half : ztile_half_rows)((int)mr, xm, K, w, dst, ldy);
            else
                half_tile(mr, 0, xm, K, K, w, dst, ldy, 0);
            tail_out(y, N, m, b, 16, cols, tail, mr);
        }
    }
}

/* bf16 pair panels [ceil(N / 16)][K2][16] of uint32, each the pair (w[n][2j], w[n][2j + 1])
 * of one column n (low half first), against x as bf16 pairs [M][K2]: AVX-512 BF16's
 * `vdpbf16ps` multiplies each pair exactly and adds the two products into an fp32 lane
 * (round to nearest even; bf16 and fp32 subnormals taken as zero, which the screen's
 * inputs avoid). Each weight pair is loaded once for up to BF_ROWS rows and two panels;
 * one or two rows keep two partial sums per column (j even / odd). */
/* AVX-512 BF16 intrinsics need GCC 10 or clang 9; older compilers build without this
 * form (radixlm_has_bf16 says 0). */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define AVX512BF16 __attribute__((target("avx512f,avx512bf16")))
#define BF_ROWS 8

static inline AVX512BF16 __attribute__((always_inline)) void
bf16_tile(const int mr, const int np, const int split, const uint32_t *x, int64_t K2,
          const uint32_t *w0, const uint32_t *w1, float *y, int64_t ldy) {
    __m512 a[BF_ROWS][2][2];
    for (int r = 0; r < BF_ROWS; ++r)
        for (int p = 0; p < 2; ++p) a[r][p][0] = a[r][p][1] = _mm512_setzero_ps();
    /* Sums h = 0 and (split) 1 take the pairs j = 0, 2, ... and 1, 3, ... */
    const int64_t step = split ? 2 : 1;
    int64_t j = 0;
    for (; j + step <= K2; j += step)
        for (int h = 0; h < step; ++h) {
            const __m512bh p0 = (__m512bh)_mm512_loadu_si512(w0 + (j + h) * 16);
            const __m512bh p1 = np > 1 ? (__m512bh)_mm512_loadu_si512(w1 + (j + h) * 16) : p0;
            for (int r = 0; r < BF_ROWS; ++r) {
                if (r >= mr) break;
                const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * K2 + j + h]);
                a[r][0][h] = _mm512_dpbf16_ps(a[r][0][h], xr, p0);
                if (np > 1) a[r][1][h] = _mm512_dpbf16_ps(a[r][1][h], xr, p1);
            }
        }
    for (; j < K2; ++j) { /* split only: the odd last pair */
        const __m512bh p0 = (__m512bh)_mm512_loadu_si512(w0 + j * 16);
        const __m512bh p1 = np > 1 ? (__m512bh)_mm512_loadu_si512(w1 + j * 16) : p0;
        for (int r = 0; r < BF_ROWS; ++r) {
            if (r >= mr) break;
            const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * K2 + j]);
            a[r][0][0] = _mm512_dpbf16_ps(a[r][0][0], xr, p0);
            if (np > 1) a[r][1][0] = _mm512_dpbf16_ps(a[r][1][0], xr, p1);
        }
    }
    for (int r = 0; r < mr; ++r)
        for (int p = 0; p < np; ++p)
            _mm512_storeu_ps(y + r * ldy + 16 * p,
                             split ? _mm512_add_ps(a[r][p][0], a[r][p][1]) : a[r][p][0]);
}

/* One copy per (rows, panels), so both are constants inside the k loop; j alternates
 * between two sums only where one or two rows give too few independent chains. */
#define BF16_TILE(R)                                                                       \
    static AVX512BF16 void bf16_tile##R(int np, const uint32_t *x, int64_t K2,             \
                                        const uint32_t *w0, const uint32_t *w1, float *y,   \
                                        int64_t ldy) {                                      \
        if (np > 1)                                                                         \
            bf16_tile(R, 2, R <= 2, x, K2, w0, w1, y, ldy);                                 \
        else                                                                                \
            bf16_tile(R, 1, R <= 2, x, K2, w0, w0, y, ldy);                                 \
    }
BF16_TILE(1) BF16_TILE(2) BF16_TILE(3) BF16_TILE(4) BF16_TILE(5) BF16_TILE(6) BF16_TILE(7)
BF16_TILE(8)
typedef void (*bf16_tile_fn)(int, const uint32_t *, int64_t, const uint32_t *, const uint32_t *,
                             float *, int64_t);
static const bf16_tile_fn BF16_TILES[BF_ROWS + 1] = {
    0, bf16_tile1, bf16_tile2, bf16_tile3, bf16_tile4, bf16_tile5, bf16_tile6, bf16_tile7,
    bf16_tile8};

int radixlm_has_bf16(void) { return __builtin_cpu_supports("avx512bf16") != 0; }

/* y [M, N] = x @ W^T over bf16 pair panels (above); x bf16 pairs [M, K2]. The threads take
 * the panels two at a time, evenly. Returns -1 where the CPU lacks AVX-512 BF16, else 0. */
int radixlm_bf16_gemm(const uint32_t *x, const uint32_t *panels, float *y, int64_t M,
                      int64_t K2, int64_t N, int num_threads) {
    if (!radixlm_has_bf16()) return -1;
    const int64_t NB = (N + 15) / 16, pairs = (NB + 1) / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t c = 0; c < pairs; ++c) {
        const int64_t b = 2 * c;
        const int np = b + 1 < NB ? 2 : 1;
        const int64_t cols = N - b * 16 < 32 ? N - b * 16 : 32;
        float tail[BF_ROWS * 32];
        for (int64_t m = 0, mr; m < M; m += mr) {
            mr = balanced_rows(M - m, BF_ROWS);
            int64_t ldy;
            float *dst = tile_dst(y, N, m, b, 32, cols, tail, &ldy);
            const uint32_t *w1 = np > 1 ? panels + (b + 1) * K2 * 16 : panels;
            BF16_TILES[mr](np, x + m * K2, K2, panels + b * K2 * 16, w1, dst, ldy);
            tail_out(y, N, m, b, 32, cols, tail, mr);
        }
    }
    return 0;
}
#else
int radixlm_has_bf16(void) { return 0; }

int radixlm_bf16_gemm(const uint32_t *x, const uint32_t *panels, float *y, int64_t M,
                      int64_t K2, int64_t N, int num_threads) {
    (void)x, (void)panels, (void)y, (void)M, (void)K2, (void)N, (void)num_threads;
    return -1;
}
#endif

/* Most rows radixlm_screen_select takes. */
#define SELECT_ROWS 16

/* approx[b, i] - (n1 c1[i] + n2 c2[i] + pad) over 8 vocabulary rows, and its upper twin. */
static inline __m256 radius8(__m256 m1, __m256 m2, const float *c1, const float *c2,
                             __m256 pad) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m1, _mm256_loadu_ps(c1)),
                                       _mm256_mul_ps(m2, _mm256_loadu_ps(c2))),
                         pad);
}

/* The greedy screen's candidates (runtime/executor/layers/head_screen.py): approx [M, V] logits;
 * each one's error radius is n1[b] c1[i] + n2[b] c2[i] + pad (c1, c2 [V] per vocabulary row,
 * n1, n2 [M] per row of x). Row b's floor is max_i (approx[b, i] - radius); vocabulary row
 * i is a candidate when approx[b, i] + radius >= floor_b for some b. Writes the candidates
 * in increasing order to ids (room for V) and returns how many, or -1 when M > SELECT_ROWS
 * or a norm, an approximate logit or a floor is not finite. The threads split the rows,
 * then the vocabulary. */
int64_t radixlm_screen_select(const float *approx, const float *c1, const float *c2, const float *n1,
                              const float *n2, float pad, int64_t M, int64_t V, int64_t *ids,
                              int num_threads) {
    float floor[SELECT_ROWS];
    int bad = M > SELECT_ROWS;
    for (int64_t b = 0; b < M && !bad; ++b) bad = !isfinite(n1[b]) || !isfinite(n2[b]);
    if (bad) return -1;
    const int64_t V8 = V & ~(int64_t)7;
    const __m256 vpad = _mm256_set1_ps(pad);
#pragma omp parallel for schedule(static) num_threads(num_threads) reduction(|| : bad)
    for (int64_t b = 0; b < M; ++b) {
        const float *a = approx + b * V;
        const __m256 m1 = _mm256_set1_ps(n1[b]), m2 = _mm256_set1_ps(n2[b]);
        __m256 best = _mm256_set1_ps(-INFINITY), nf = _mm256_setzero_ps();
        for (int64_t i = 0; i < V8; i += 8) {
            __m256 ai = _mm256_loadu_ps(a + i);
            /* a - a is NaN exactly where a is NaN or +-inf. */
            nf = _mm256_or_ps(nf, _mm256_cmp_ps(_mm256_sub_ps(ai, ai), _mm256_setzero_ps(),
                                                _CMP_NEQ_UQ));
            best = _mm256_max_ps(best, _mm256_sub_ps(ai, radius8(m1, m2, c1 + i, c2 + i, vpad)));
        }
        float lanes[8], f = -INFINITY;
        _mm256_storeu_ps(lanes, best);
        for (int j = 0; j < 8; ++j) f = lanes[j] > f ? lanes[j] : f;
        int row_bad = _mm256_movemask_ps(nf) != 0;
        for (int64_t i = V8; i < V; ++i) {
            row_bad |= !isfinite(a[i]);
            float lo = a[i] - ((n1[b] * c1[i] + n2[b] * c2[i]) + pad);
            f = lo > f ? lo : f;
        }
        floor[b] = f;
        bad = bad || row_bad || !isfinite(f);
    }
    if (bad) return -1;
    /* Each thread marks its share of the vocabulary (8-row blocks; the tail goes to the
     * last thread) and lists its candidates at its share's start in ids; the lists are
     * then moved together in order. */
    int64_t starts[64], counts[64];
    int used = 1;
#pragma omp parallel num_threads(num_threads < 64 ? num_threads : 64)
    {
        const int64_t t = omp_get_thread_num(), T = omp_get_num_threads(), blocks = V8 / 8;
        const int64_t i0 = blocks * t / T * 8, i1 = t == T - 1 ? V : blocks * (t + 1) / T * 8;
        int64_t count = 0;
        for (int64_t i = i0; i < i1; i += 8) {
            const int64_t w = i1 - i < 8 ? i1 - i : 8;
            int mask = 0;
            if (w == 8) {
                __m256 keep = _mm256_setzero_ps();
                for (int64_t b = 0; b < M; ++b) {
                    __m256 hi = _mm256_add_ps(
                        _mm256_loadu_ps(approx + b * V + i),
                        radius8(_mm256_set1_ps(n1[b]), _mm256_set1_ps(n2[b]), c1 + i, c2 + i,
                                vpad));
                    keep = _mm256_or_ps(keep, _mm256_cmp_ps(hi, _mm256_set1_ps(floor[b]),
                                                            _CMP_GE_OQ));
                }
                mask = _mm256_movemask_ps(keep);
            } else {
                for (int64_t j = 0; j < w; ++j)
                    for (int64_t b = 0; b < M; ++b) {
                        const float r = (n1[b] * c1[i + j] + n2[b] * c2[i + j]) + pad;
                        if (approx[b * V + i + j] + r >= floor[b]) mask |= 1 << j;
                    }
            }
            for (; mask; mask &= mask - 1) ids[i0 + count++] = i + __builtin_ctz(mask);
        }
        starts[t] = i0;
        counts[t] = count;
        if (t == 0) used = (int)T;
    }
    int64_t total = 0;
    for (int t = 0; t < used; ++t) {
        memmove(ids + total, ids + starts[t], counts[t] * sizeof(int64_t));
        total += counts[t];
    }
    return total;
}
