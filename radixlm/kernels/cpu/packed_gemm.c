/* fp32 GEMM over column-panel-packed weights, AVX2 + FMA, or AVX-512F where the CPU has it
 * (radixlm_gemm_isa), OpenMP.
 *
 * y[M, N] = x[M, K] @ W^T, with W [N, K] stored as panels P[NB][K][16] (NB = ceil(N / 16),
 * panel b holds columns 16b..16b+15 of W^T; the last panel is zero-padded). Each panel
 * is one contiguous stream, so a decode step (M of 1 to a few rows) reads the weights
 * sequentially at memory bandwidth; the OpenMP threads split the panels
 * (prefill-sized products: the rows, SPLIT_ROWS below). Up to STREAM_ROWS rows a thread
 * reads its panels as several streams at once, a chunk of each in turn (stream_panels).
 *
 * Register tile: MR <= 6 rows x 16 columns (12 accumulators, 2 weight registers,
 * 1 broadcast), the usual AVX2 micro-kernel shape (Goto & van de Geijn 2008). Up to
 * BLOCKED_ROWS rows x is read in place and the K loop is blocked so a panel block stays
 * in L1 while every row tile uses it. From BLOCKED_ROWS rows on (prefill chunks) the
 * loops follow Goto & van de Geijn's blocking: each thread copies an MC x KC block of x
 * into micro-panels of at most 6 rows, balanced as the row tiles are (k-major, so the
 * broadcasts of a k step are adjacent), that stay in L2, and runs every row tile of it
 * against one KC x 16 panel slice. On AVX-512 CPUs every row count runs 12-row x
 * 32-column tiles instead (zblocked_panels below).
 *
 * With more than one row (on AVX-512: PF_MIN_ROWS) the products are compute-heavy enough
 * that the hardware prefetcher falls behind the weight stream, so the row tiles
 * software-prefetch the next weight block while they compute, each tile its share of the
 * block's lines (one tile fetching it all left the memory idle while the others ran).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define KBLOCK 128
/* Rows from which x is packed and blocked. The x block (MC x KC floats, 324 KB) stays in
 * L2 with the panel slice (KC x 16 floats, 36 KB); K up to KC is one block, so y is written
 * once. Sizes picked by measurement (docs/perf-notes.md, "Packed GEMM"). */
#define BLOCKED_ROWS 12
/* How far ahead (bytes) a lone row tile fetches its weight stream, into L2 (T1 hint):
 * far enough to cover the memory latency, near enough to stay in L2; it beat fetching the
 * next panel into L1 (docs/perf-notes.md, "Packed GEMM"). */
#define PF_AHEAD 8192
#define MC 144
#define KC 576
/* Rows of an x block from which the AVX-512 row tiles software-prefetch the next tile's
 * weights; with fewer rows the hardware prefetcher alone keeps up with the stream and the
 * software prefetches only slowed it (docs/perf-notes.md, "Packed GEMM"). */
#define PF_MIN_ROWS 9
/* Rows per thread from which the threads split the rows (each packs only its own rows of
 * x and runs every panel) rather than the panels (each packs every row of x and runs its
 * share of the panels). A thread packs M x K floats per product either way, against
 * M x K x N / nt FMAs over its panels, so splitting the panels costs 1 / (N / nt) of the
 * work in packing: an eighth or more of SmolLM2-135M's o and down products at 2 threads.
 * Splitting the rows streams every weight through both cores instead, so decode-sized
 * products keep the panel split; the row split wins from SPLIT_ROWS rows per thread
 * (docs/perf-notes.md, "Packed GEMM"). */
#define SPLIT_ROWS 64
/* One row (a batch-1 decode step): the threads split all but the last 1 / TAIL_SHARE of
 * the panels evenly, then take the rest two panels at a time as they come free. One
 * thread's share of a memory-bound product can finish tens of microseconds after the
 * other's, long enough for the first to fall asleep at the barrier (GOMP_SPINCOUNT=1000,
 * omp_policy.py) and be woken for the next product. From 4 rows the extra calls cost more
 * than they save, so more rows keep the even split (docs/perf-notes.md, "Packed GEMM"). */
#define TAIL_SHARE 8
/* Rows up to which (AVX2) a thread reads its share of the panels as several parts at once,
 * a chunk of k rows of each in turn (stream_panels): up to FEW_STREAM_ROWS rows four
 * streams of 16 k rows (1 KiB) with no software prefetch, up to STREAM_ROWS two streams of
 * 32 k rows whose tiles fetch PF_AHEAD bytes ahead in their own stream. One core keeps
 * more lines in flight over several sequential streams, each with its own hardware
 * prefetch, than over one: a plain read reaches about 1.5x the bandwidth from four streams
 * a thread. With more rows each line takes more instructions, the out-of-order window
 * holds fewer lines, and the software prefetch has to cover the distance; from 7 rows
 * (two row tiles) one stream with a shared next-block prefetch does as well
 * (docs/perf-notes.md, "Packed GEMM"). */
#define FEW_STREAM_ROWS 3
#define STREAM_ROWS 6

/* Accumulators are named variables, not an array: GCC keeps an array of vectors on the
 * stack and stores it every k step. */
#define ACC_DECL(R) __m256 c##R##0 = _mm256_setzero_ps(), c##R##1 = _mm256_setzero_ps();
#define ACC_LOAD(R)                                  \
    if (mr > R && acc) {                             \
        c##R##0 = _mm256_loadu_ps(y + R * ldy);      \
        c##R##1 = _mm256_loadu_ps(y + R * ldy + 8);  \
    }
#define ACC_STEP(R)                                           \
    if (mr > R) {                                             \
        __m256 xb = _mm256_broadcast_ss(x + R * ldx + k * sk);\
        c##R##0 = _mm256_fmadd_ps(xb, w0, c##R##0);           \
        c##R##1 = _mm256_fmadd_ps(xb, w1, c##R##1);           \
    }
#define ACC_STORE(R)                                 \
    if (mr > R) {                                    \
        _mm256_storeu_ps(y + R * ldy, c##R##0);      \
        _mm256_storeu_ps(y + R * ldy + 8, c##R##1);  \
    }
#define ALL_ROWS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5)

/* y[mr, 16] (+= when acc) x[mr, 0:kn] @ w[0:kn, 16]; w is a panel (row stride 16); x row
 * r, column k is x[r * ldx + k * sk] (sk 1: x in place; ldx 1, sk 6: a packed micro-panel). */
static inline __attribute__((always_inline)) void tile(int mr, int acc, const float *restrict x,
                                                       int64_t ldx, int64_t sk,
                                                       const float *restrict w, int64_t kn,
                                                       float *restrict y, int64_t ldy,
                                                       const char *pf, int64_t pstep) {
    ALL_ROWS(ACC_DECL)
    ALL_ROWS(ACC_LOAD)
    for (int64_t k = 0; k < kn; ++k) {
        if (pf) _mm_prefetch(pf + k * pstep, _MM_HINT_T1);
        __m256 w0 = _mm256_loadu_ps(w + k * 16);
        __m256 w1 = _mm256_loadu_ps(w + k * 16 + 8);
        ALL_ROWS(ACC_STEP)
    }
    ALL_ROWS(ACC_STORE)
}

/* One specialised copy per row count, so `mr` is a constant inside the k loop. */
#define TILE_N(N)                                                                          \
    static void tile##N(int acc, const float *x, int64_t ldx, const float *w, int64_t kn, \
                        float *y, int64_t ldy) {                                           \
        tile(N, acc, x, ldx, 1, w, kn, y, ldy, 0, 0);                                      \
    }                                                                                      \
    static void pftile##N(int acc, const float *x, int64_t ldx, const float *w, int64_t kn, \
                          float *y, int64_t ldy, const char *pf, int64_t pstep) {          \
        tile(N, acc, x, ldx, 1, w, kn, y, ldy, pf, pstep);                                 \
    }                                                                                      \
    static void ptile##N(int acc, const float *xp, const float *w, int64_t kn, float *y,  \
                         int64_t ldy) {                                                    \
        tile(N, acc, xp, 1, 6, w, kn, y, ldy, 0, 0);                                       \
    }                                                                                      \
    static void pfptile##N(int acc, const float *xp, const float *w, int64_t kn, float *y, \
                           int64_t ldy, const char *pf, int64_t pstep) {                   \
        tile(N, acc, xp, 1, 6, w, kn, y, ldy, pf, pstep);                                  \
    }
TILE_N(1) TILE_N(2) TILE_N(3) TILE_N(4) TILE_N(5) TILE_N(6)
typedef void (*tile_fn)(int, const float *, int64_t, const float *, int64_t, float *, int64_t);
static const tile_fn TILES[7] = {0, tile1, tile2, tile3, tile4, tile5, tile6};
typedef void (*pftile_fn)(int, const float *, int64_t, const float *, int64_t, float *, int64_t,
                          const char *, int64_t);
static const pftile_fn PFTILES[7] = {0, pftile1, pftile2, pftile3, pftile4, pftile5, pftile6};
typedef void (*ptile_fn)(int, const float *, const float *, int64_t, float *, int64_t);
static const ptile_fn PTILES[7] = {0, ptile1, ptile2, ptile3, ptile4, ptile5, ptile6};
typedef void (*pfptile_fn)(int, const float *, const float *, int64_t, float *, int64_t,
                           const char *, int64_t);
static const pfptile_fn PFPTILES[7] = {0, pfptile1, pfptile2, pfptile3, pfptile4, pfptile5,
                                       pfptile6};

/* Rows per tile for `left` rows still to do: as even a split into <= 6-row tiles as fits. */
static inline int64_t tile_rows(int64_t left) {
    int64_t ntiles = (left + 5) / 6;
    return (left + ntiles - 1) / ntiles;
}

/* Rows m of one panel's k range [k0, k0 + kn), into y16 (row stride ldy), fetching weights
 * ahead meanwhile: one row tile fetches the line PF_AHEAD bytes ahead of each it reads;
 * several tiles share out the next block's kn lines. */
static void panel_rows(int64_t M, int64_t K, const float *x, const float *panel, int64_t k0,
                       int64_t kn, float *y16, int64_t ldy) {
    const float *w = panel + k0 * 16;
    int64_t ntiles = (M + 5) / 6, pstep = (64 + ntiles - 1) / ntiles;
    const char *next = ntiles == 1 ? (const char *)w + PF_AHEAD : (const char *)(w + kn * 16);
    for (int64_t m = 0, mr, i = 0; m < M; m += mr, ++i) {
        mr = tile_rows(M - m);
        PFTILES[mr](k0 > 0, x + m * K + k0, K, w, kn, y16 + m * ldy, ldy,
                    next + i * kn * 64 / ntiles, pstep);
    }
}

/* Panels [b0, b1) of y for M <= STREAM_ROWS rows (one thread's share, one row tile): the
 * range in `streams` equal parts, panel i of every part in turn, `chunk` k rows at a time;
 * with `ahead` > 0 each chunk's tile fetches the lines `ahead` bytes on in its stream. */
static void stream_panels(const float *x, const float *panels, float *y, int64_t M, int64_t K,
                          int64_t N, int64_t b0, int64_t b1, int64_t streams, int64_t chunk,
                          int64_t ahead) {
    const int64_t n = b1 - b0, L = (n + streams - 1) / streams;
    float tail[STREAM_ROWS * 16];
    for (int64_t i = 0; i < L; ++i)
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
            const int64_t kn = K - k0 < chunk ? K - k0 : chunk;
            for (int64_t s = 0; s < streams && s * L + i < n; ++s) {
                /* The zero-padded last panel accumulates in `tail`; its real columns are
                 * copied out after its last chunk. */
                const int64_t b = b0 + s * L + i, cols = N - b * 16 < 16 ? N - b * 16 : 16;
                float *dst = cols == 16 ? y + b * 16 : tail;
                const int64_t ldy = cols == 16 ? N : 16;
                const float *w = panels + (b * K + k0) * 16;
                if (ahead)
                    PFTILES[M](k0 > 0, x + k0, K, w, kn, dst, ldy, (const char *)w + ahead, 64);
                else
                    TILES[M](k0 > 0, x + k0, K, w, kn, dst, ldy);
                if (cols < 16 && k0 + kn == K)
                    for (int64_t r = 0; r < M; ++r)
                        memcpy(y + r * N + b * 16, tail + r * 16, cols * sizeof(float));
            }
        }
}

/* Copies x[0:mn, 0:kn] (row stride ldx) into micro-panels of at most `width` rows, k-major
 * at a stride of `width`: micro-panel i at xp + i width kn holds its row r, column k at
 * xp[i width kn + width k + r]. Each micro-panel takes `width` rows (a last one fewer), or
 * with `balanced` (width 6) the rows of `tile_rows`' even split: balanced tiles give every
 * tile enough independent accumulators (2 per row) to cover the FMA latency, 13 rows
 * running as 5 + 4 + 4 where 6 + 6 + 1 would leave a one-row tile whose two FMA chains
 * wait on that latency. */
static void pack_x(const float *x, int64_t ldx, int64_t mn, int64_t kn, float *restrict xp,
                   int64_t width, int balanced) {
    for (int64_t m0 = 0, i = 0, mr; m0 < mn; m0 += mr, ++i) {
        mr = balanced ? tile_rows(mn - m0) : (mn - m0 < width ? mn - m0 : width);
        float *dst = xp + i * width * kn;
        for (int64_t r = 0; r < mr; ++r) {
            const float *src = x + (m0 + r) * ldx;
            for (int64_t k = 0; k < kn; ++k) dst[k * width + r] = src[k];
        }
    }
}

/* Each thread's packed x block (MC x KC floats) for the blocked paths, and its buffer for
 * two dequantized panel slices (KC x 16 floats each). */
static __thread float xpack[MC * KC] __attribute__((aligned(64)));
static __thread float wslices[2 * KC * 16] __attribute__((aligned(64)));

/* The [kn][16] slice of rows k0..k0+kn of panel b: in place for fp32 panels, else
 * dequantized into buf (k0 and kn whole 32-row groups). */
static inline const float *panel_slice(const radixlm_wsrc *src, int64_t K, int64_t b,
                                       int64_t k0, int64_t kn, float *buf) {
    if (src->fmt == 0) return (const float *)src->w + (b * K + k0) * 16;
    radixlm_quant_dequant(src->fmt, (const uint8_t *)src->w + b * src->panel_bytes +
                                        k0 / 32 * src->group_bytes, kn / 32, buf);
    return buf;
}

/* Equal K blocks of at most KC, whole 32-row groups for quantized panels. */
static inline int64_t k_block(const radixlm_wsrc *src, int64_t K) {
    int64_t nk = (K + KC - 1) / KC, kb = (K + nk - 1) / nk;
    return src->fmt ? (kb + 31) / 32 * 32 : kb;
}

/* Panels [b0, b1) of y for M >= BLOCKED_ROWS rows (one thread's share). */
static void blocked_panels(const float *x, const radixlm_wsrc *src, float *y, int64_t M,
                           int64_t K, int64_t N, int64_t b0, int64_t b1) {
    float *xp = xpack, tail[MC * 16];
    const int64_t kb = k_block(src, K);
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        int64_t mn = M - m0 < MC ? M - m0 : MC;
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            int64_t kn = K - k0 < kb ? K - k0 : kb;
            int64_t ntiles = (mn + 5) / 6, pstep = (64 + ntiles - 1) / ntiles;
            pack_x(x + m0 * K + k0, K, mn, kn, xp, 6, 1);
            for (int64_t b = b0; b < b1; ++b) {
                const float *w = panel_slice(src, K, b, k0, kn, wslices);
                int64_t cols = N - b * 16 < 16 ? N - b * 16 : 16;
                float *dst = cols == 16 ? y + m0 * N + b * 16 : tail;
                int64_t ldy = cols == 16 ? N : 16;
                /* The row tiles fetch the next fp32 panel's slice meanwhile, each its share. */
                int pf = b + 1 < b1 && src->fmt == 0;
                const char *next = (const char *)(w + K * 16);
                for (int64_t r = 0, i = 0, mr; r < mn; r += mr, ++i) {
                    mr = tile_rows(mn - r);
                    if (pf)
                        PFPTILES[mr](k0 > 0, xp + i * 6 * kn, w, kn, dst + r * ldy, ldy,
                                     next + i * kn * 64 / ntiles, pstep);
                    else
                        PTILES[mr](k0 > 0, xp + i * 6 * kn, w, kn, dst + r * ldy, ldy);
                }
                if (cols < 16 && k0 + kn == K)
                    for (int64_t r = 0; r < mn; ++r)
                        memcpy(y + (m0 + r) * N + b * 16, tail + r * 16, cols * sizeof(float));
            }
        }
    }
}

/* ---- AVX-512 (AVX-512F CPUs, chosen at run time): the blocked path with 512-bit
 * registers and a tile of up to ZMR rows x 32 columns (two panels side by side: 2 * ZMR
 * accumulators, two weight registers, one broadcast per row shared by both panels). Per
 * k step: 2 weight loads and ZMR broadcasts feed 2 * ZMR FMAs, so the loads (two per
 * cycle) keep up with the FMA units; a 16-row x 1-panel tile needs 17 loads per 16 FMAs.
 * x micro-panels are as wide as the block's row tiles (balanced, at most ZMR). An odd or
 * zero-padded last panel runs the same tile with one panel.
 *
 * On AVX-512 CPUs this path serves every row count: it was faster than the AVX2 tiles and
 * than 16-row x 1-panel AVX-512 tiles at every size measured, one row included (two panel
 * streams per tile); figures in docs/perf-notes.md, "Packed GEMM". */
#define AVX512 __attribute__((target("avx512f")))
#define ZMR 12

#define Z_DECL(R) __m512 a##R = _mm512_setzero_ps(), b##R = _mm512_setzero_ps();
#define Z_LOAD(R)                                                  \
    if (mr > R && acc) {                                           \
        a##R = _mm512_loadu_ps(y + R * ldy);                       \
        if (np == 2) b##R = _mm512_loadu_ps(y + R * ldy + 16);     \
    }
#define Z_STEP(R)                                                  \
    if (mr > R) {                                                  \
        __m512 xb = _mm512_set1_ps(xp[R * ldx + k * sk]);          \
        a##R = _mm512_fmadd_ps(xb, w0, a##R);                      \
        if (np == 2) b##R = _mm512_fmadd_ps(xb, w1, b##R);         \
    }
#define Z_STORE(R)                                                 \
    if (mr > R) {                                                  \
        _mm512_storeu_ps(y + R * ldy, a##R);                       \
        if (np == 2) _mm512_storeu_ps(y + R * ldy + 16, b##R);     \
    }
#define Z_ROWS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

/* y[mr, 16 * np] (+= when acc) x[mr, 0:kn] @ [w0 | w1] (panel slices, row stride 16);
 * x row r, column k is xp[r * ldx + k * sk] (ldx 1, sk width: a packed micro-panel `width`
 * rows wide; sk 1: rows in place). When pf0 is set, fetches one line of pf0 and of pf1 per
 * pstep bytes of k meanwhile. */
static inline __attribute__((always_inline)) AVX512 void ztile(
    int mr, int np, int acc, const float *restrict xp, int64_t ldx, int64_t sk,
    const float *restrict wp0, const float *restrict wp1, int64_t kn, float *restrict y,
    int64_t ldy, const char *pf0, const char *pf1, int64_t pstep) {
    Z_ROWS(Z_DECL)
    Z_ROWS(Z_LOAD)
    for (int64_t k = 0; k < kn; ++k) {
        if (pf0) {
            _mm_prefetch(pf0 + k * pstep, _MM_HINT_T0);
            _mm_prefetch(pf1 + k * pstep, _MM_HINT_T0);
        }
        __m512 w0 = _mm512_loadu_ps(wp0 + k * 16), w1 = w0;
        if (np == 2) w1 = _mm512_loadu_ps(wp1 + k * 16);
        Z_ROWS(Z_STEP)
    }
    Z_ROWS(Z_STORE)
}

/* One copy per row count and layout: ztileN reads a packed micro-panel (x row stride 1,
 * k stride `width`), zitileN rows in place (row stride ldx, k stride 1). */
#define ZTILE_N(N)                                                                          \
    static AVX512 void ztile##N(int np, int acc, const float *xp, int64_t width,             \
                                const float *w0, const float *w1, int64_t kn, float *y,     \
                                int64_t ldy, const char *pf0, const char *pf1,              \
                                int64_t pstep) {                                            \
        if (np == 2)                                                                        \
            ztile(N, 2, acc, xp, 1, width, w0, w1, kn, y, ldy, pf0, pf1, pstep);            \
        else                                                                                \
            ztile(N, 1, acc, xp, 1, width, w0, w1, kn, y, ldy, pf0, pf1, pstep);            \
    }                                                                                       \
    static AVX512 void zitile##N(int np, int acc, const float *x, int64_t ldx,              \
                                 const float *w0, const float *w1, int64_t kn, float *y,    \
                                 int64_t ldy, const char *pf0, const char *pf1,             \
                                 int64_t pstep) {                                           \
        if (np == 2)                                                                        \
            ztile(N, 2, acc, x, ldx, 1, w0, w1, kn, y, ldy, 0, 0, 0);                       \
        else                                                                                \
            ztile(N, 1, acc, x, ldx, 1, w0, w1, kn, y, ldy, 0, 0, 0);                       \
    }
ZTILE_N(1) ZTILE_N(2) ZTILE_N(3) ZTILE_N(4) ZTILE_N(5) ZTILE_N(6) ZTILE_N(7) ZTILE_N(8)
ZTILE_N(9) ZTILE_N(10) ZTILE_N(11) ZTILE_N(12)
typedef void (*ztile_fn)(int, int, const float *, int64_t, const float *, const float *,
                         int64_t, float *, int64_t, const char *, const char *, int64_t);
static const ztile_fn ZTILES[ZMR + 1] = {0,      ztile1, ztile2, ztile3,  ztile4,  ztile5, ztile6,
                                         ztile7, ztile8, ztile9, ztile10, ztile11, ztile12};
static const ztile_fn ZITILES[ZMR + 1] = {
    0, zitile1, zitile2, zitile3, zitile4, zitile5, zitile6, zitile7, zitile8, zitile9, zitile10,
    zitile11, zitile12};

/* blocked_panels with AVX-512 tiles of two panels (same blocking; each tile prefetches its
 * share of the next tile's two panel slices). */
static AVX512 void zblocked_panels(const float *x, const radixlm_wsrc *src, float *y,
                                   int64_t M, int64_t K, int64_t N, int64_t b0, int64_t b1) {
    float *xp = xpack, tail[MC * 16];
    const float *panels = src->w; /* fp32 panels; quantized ones go through panel_slice */
    const int64_t kb = k_block(src, K);
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
        int64_t mn = M - m0 < MC ? M - m0 : MC;
        int64_t ntiles = (mn + ZMR - 1) / ZMR, width = (mn + ntiles - 1) / ntiles;
        int64_t pstep = (64 + ntiles - 1) / ntiles;
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            int64_t kn = K - k0 < kb ? K - k0 : kb;
            pack_x(x + m0 * K + k0, K, mn, kn, xp, width, 0);
            for (int64_t b = b0, np; b < b1; b += np) {
                /* Two panels when both are full (the padded last one goes alone). */
                np = b + 1 < b1 && N - (b + 1) * 16 >= 16 ? 2 : 1;
                const float *w0 = panel_slice(src, K, b, k0, kn, wslices), *w1 = w0;
                if (np == 2) w1 = panel_slice(src, K, b + 1, k0, kn, wslices + kn * 16);
                int64_t cols = N - b * 16 < 16 ? N - b * 16 : 16;
                float *dst = cols == 16 ? y + m0 * N + b * 16 : tail;
                int64_t ldy = cols == 16 ? N : 16;
                /* The next tile's fp32 panels: b + np and the one after it, within the
                 * share (none for quantized panels: their dequantization reads ahead). */
                int64_t nb = b + np < b1 ? b + np : b, nb1 = nb + 1 < b1 ? nb + 1 : nb;
                const char *pf0 = (const char *)(panels + (nb * K + k0) * 16);
                const char *pf1 = (const char *)(panels + (nb1 * K + k0) * 16);
                for (int64_t r = 0, i = 0; r < mn; r += width, ++i) {
                    int64_t mr = mn - r < width ? mn - r : width, off = i * kn * 64 / ntiles;
                    ZTILES[mr](np, k0 > 0, xp + r * kn, width, w0, w1, kn, dst + r * ldy, ldy,
                               src->fmt || mn < PF_MIN_ROWS ? 0 : pf0 + off, pf1 + off, pstep);
                }
                if (cols < 16 && k0 + kn == K)
                    for (int64_t r = 0; r < mn; ++r)
                        memcpy(y + (m0 + r) * N + b * 16, tail + r * 16, cols * sizeof(float));
            }
        }
    }
}

/* -1 until the first GEMM (or radixlm_gemm_isa) looks at the CPU; then 1 to run the
 * AVX-512 path, 0 for AVX2 only. */
static int use_avx512 = -1;

/* radixlm_gemm_panels on AVX-512: balanced row tiles of up to ZMR rows, two panels each. */
static AVX512 void zgemm_panels(int64_t M, int acc, const float *x, int64_t ldx,
                                const float *w, int64_t npan, int64_t wstride, int64_t kn,
                                float *y, int64_t ldy) {
    int64_t ntiles = (M + ZMR - 1) / ZMR, rows = ntiles ? (M + ntiles - 1) / ntiles : 0;
    for (int64_t c = 0, np; c < npan; c += np) {
        np = c + 1 < npan ? 2 : 1;
        const float *w0 = w + c * wstride, *w1 = w0 + wstride;
        for (int64_t m = 0; m < M; m += rows) {
            int64_t mr = M - m < rows ? M - m : rows;
            ZITILES[mr](np, acc, x + m * ldx, ldx, w0, w1, kn, y + m * ldy + c * 16, ldy, 0, 0,
                        0);
        }
    }
}

void radixlm_gemm_panels(int64_t M, int acc, const float *x, int64_t ldx, const float *w,
                         int64_t npan, int64_t wstride, int64_t kn, float *y, int64_t ldy) {
    if (use_avx512 < 0 ? radixlm_gemm_isa(-1) : use_avx512) {
        zgemm_panels(M, acc, x, ldx, w, npan, wstride, kn, y, ldy);
        return;
    }
    for (int64_t c = 0; c < npan; ++c)
        for (int64_t m = 0, mr; m < M; m += mr) {
            mr = tile_rows(M - m);
            TILES[mr](acc, x + m * ldx, ldx, w + c * wstride, kn, y + m * ldy + c * 16, ldy);
        }
}

void radixlm_gemm_blocked(const float *x, const radixlm_wsrc *src, float *y, int64_t M,
                          int64_t K, int64_t N, int64_t b0, int64_t b1) {
    if (use_avx512 < 0 ? radixlm_gemm_isa(-1) : use_avx512)
        zblocked_panels(x, src, y, M, K, N, b0, b1);
    else
        blocked_panels(x, src, y, M, K, N, b0, b1);
}

int radixlm_gemm_isa(int request) {
    int have = __builtin_cpu_supports("avx512f") != 0;
    if (request >= 0)
        use_avx512 = request && have;
    else if (use_avx512 < 0)
        use_avx512 = have;
    return use_avx512;
}

/* y [M, N] row-major; x [M, K] row-major; panels [NB, K, 16]. */
void radixlm_packed_gemm(const float *x, const float *panels, float *y, int64_t M, int64_t K,
                         int64_t N, int num_threads) {
    if (M == 0) return;
    const int64_t NB = (N + 15) / 16;
    int z = use_avx512 < 0 ? radixlm_gemm_isa(-1) : use_avx512;
    if (z || M >= BLOCKED_ROWS) {
#pragma omp parallel num_threads(num_threads)
        {
            int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            radixlm_wsrc src = {panels, 0, 0, 0};
            if (nt > 1 && M >= SPLIT_ROWS * nt) {
                int64_t m0 = M * t / nt, m1 = M * (t + 1) / nt;
                radixlm_gemm_blocked(x + m0 * K, &src, y + m0 * N, m1 - m0, K, N, 0, NB);
            } else if (nt > 1 && M == 1) {
                /* The last 1 / TAIL_SHARE of the panels go two at a time to whichever
                 * thread is free first. */
                const int64_t tail = NB / TAIL_SHARE & ~(int64_t)1, S = NB - tail;
                radixlm_gemm_blocked(x, &src, y, M, K, N, S * t / nt, S * (t + 1) / nt);
#pragma omp for schedule(dynamic, 1) nowait
                for (int64_t c = 0; c < tail / 2; ++c)
                    radixlm_gemm_blocked(x, &src, y, M, K, N, S + 2 * c, S + 2 * c + 2);
            } else {
                radixlm_gemm_blocked(x, &src, y, M, K, N, NB * t / nt, NB * (t + 1) / nt);
            }
        }
        return;
    }
    if (M <= STREAM_ROWS) {
#pragma omp parallel num_threads(num_threads)
        {
            int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int few = M <= FEW_STREAM_ROWS;
            stream_panels(x, panels, y, M, K, N, NB * t / nt, NB * (t + 1) / nt, few ? 4 : 2,
                          few ? 16 : 32, few ? 0 : PF_AHEAD);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < NB; ++b) {
        const float *panel = panels + b * K * 16;
        int64_t cols = N - b * 16 < 16 ? N - b * 16 : 16;
        float tail[6 * 16];
        for (int64_t m0 = 0; m0 < M; m0 += (cols == 16 ? M : 6)) {
            /* A full panel writes y in place; the padded last panel goes through `tail`,
             * 6 rows at a time, and only its real columns are copied out. */
            int64_t mn = cols == 16 ? M : (M - m0 < 6 ? M - m0 : 6);
            float *dst = cols == 16 ? y + b * 16 : tail;
            int64_t ldy = cols == 16 ? N : 16;
            const float *xm = x + m0 * K;
            for (int64_t k0 = 0; k0 < K; k0 += KBLOCK) {
                int64_t kn = K - k0 < KBLOCK ? K - k0 : KBLOCK;
                panel_rows(mn, K, xm, panel, k0, kn, dst, ldy);
            }
            if (cols < 16)
                for (int64_t r = 0; r < mn; ++r)
                    memcpy(y + (m0 + r) * N + b * 16, tail + r * 16, cols * sizeof(float));
        }
    }
}
