/* The decode attention kernel on one KV element type, included by decode_attention.c once
 * per type with KV_T (the pool's element), KV_LOAD(p) (8 KV_T at p as 8 floats),
 * KV_LOAD16(p) (16 as 16 floats, AVX-512) and KV_FN(name) (the name with the type's
 * suffix) defined. Everything computes in fp32. */
#define ROWH(buf, t, hh) ((buf) + (sl[(t)] * Hkv + (hh)) * D)
#define ROW(buf, t) ROWH(buf, t, h)

static inline float KV_FN(dot)(const float *a, const KV_T *b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), KV_LOAD(b + i + 8), s1);
    }
    for (; i < d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD(b + i), s0);
    return hsum256(_mm256_add_ps(s0, s1));
}


/* Scores of four keys (rows k[0..3] of one KV head) for nq <= 3 of its query heads q
 * (rows D apart), stored at out[g * stride + 0..3]: nq * 4 independent FMA chains, enough
 * to hide the FMA latency; each K vector is converted once and kept in a register. */
static inline __attribute__((always_inline)) void KV_FN(qk_tile)(
    const float *q, int nq, const KV_T *k0, const KV_T *k1, const KV_T *k2, const KV_T *k3,
    int64_t D, __m128 vscale, float *out, int64_t stride) {
    __m256 a[3][4];
    for (int g = 0; g < nq; ++g)
        for (int r = 0; r < 4; ++r) a[g][r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i += 8) {
        const __m256 x0 = KV_LOAD(k0 + i), x1 = KV_LOAD(k1 + i);
        const __m256 x2 = KV_LOAD(k2 + i), x3 = KV_LOAD(k3 + i);
        for (int g = 0; g < nq; ++g) {
            const __m256 qv = _mm256_loadu_ps(q + g * D + i);
            a[g][0] = _mm256_fmadd_ps(qv, x0, a[g][0]);
            a[g][1] = _mm256_fmadd_ps(qv, x1, a[g][1]);
            a[g][2] = _mm256_fmadd_ps(qv, x2, a[g][2]);
            a[g][3] = _mm256_fmadd_ps(qv, x3, a[g][3]);
        }
    }
    /* hadd(hadd(a0, a1), hadd(a2, a3)) holds each sum's low and high halves in the two
     * 128-bit lanes; adding the lanes gives the four dot products. */
    for (int g = 0; g < nq; ++g) {
        __m256 hh = _mm256_hadd_ps(_mm256_hadd_ps(a[g][0], a[g][1]),
                                   _mm256_hadd_ps(a[g][2], a[g][3]));
        __m128 sums = _mm_add_ps(_mm256_castps256_ps128(hh), _mm256_extractf128_ps(hh, 1));
        _mm_storeu_ps(out + g * stride, _mm_mul_ps(sums, vscale));
    }
}

/* scores[g * stride + t] = scale * q_g . k_t for t < L and the nh * G query heads g of
 * KV heads h0 .. h0 + nh - 1: four keys at a time, up to three query heads of a KV head
 * per tile (`qk_tile`). */
static void KV_FN(qk_scores)(const float *qb, const KV_T *k_buf, const int64_t *sl, int64_t L,
                      int64_t Hkv, int64_t h0, int64_t nh, int64_t D, int64_t G, float scale,
                      float *scores, int64_t stride) {
    const __m128 vscale = _mm_set1_ps(scale);
    int64_t t = 0;
    for (; t + 4 <= L; t += 4) {
        for (int64_t a = t + AHEAD; a < t + AHEAD + 4 && a < L; ++a)
            prefetch_row(ROWH(k_buf, a, h0), nh * D * sizeof(KV_T));
        for (int64_t h = h0; h < h0 + nh; ++h) {
            const KV_T *k0 = ROW(k_buf, t), *k1 = ROW(k_buf, t + 1);
            const KV_T *k2 = ROW(k_buf, t + 2), *k3 = ROW(k_buf, t + 3);
            for (int64_t g = (h - h0) * G; g < (h - h0 + 1) * G; g += 3) {
                const float *qg = qb + g * D;
                float *o = scores + g * stride + t;
                const int64_t left = (h - h0 + 1) * G - g;
                if (left >= 3)
                    KV_FN(qk_tile)(qg, 3, k0, k1, k2, k3, D, vscale, o, stride);
                else if (left == 2)
                    KV_FN(qk_tile)(qg, 2, k0, k1, k2, k3, D, vscale, o, stride);
                else
                    KV_FN(qk_tile)(qg, 1, k0, k1, k2, k3, D, vscale, o, stride);
            }
        }
    }
    for (; t < L; ++t)
        for (int64_t g = 0; g < nh * G; ++g) {
            const int64_t h = h0 + g / G;
            scores[g * stride + t] = scale * KV_FN(dot)(qb + g * D, ROW(k_buf, t), D);
        }
}

/* acc[g][c0 .. c0 + 31] += sum_t p_g[t] v_t[c0 ..] over t in [t0, t1) for nq <= 3 query
 * rows g of KV head h (p rows `stride` apart, acc rows D apart): 4 * nq accumulators, each
 * V vector loaded once for all nq rows. Three rows fill the 16 registers (12 accumulators,
 * three broadcasts, one V vector): a V load per three FMAs and 12 independent FMA chains,
 * where one row of 64 columns takes a V load per FMA and has 8 chains
 * (docs/perf-notes.md, "Decode attention"). */
static inline __attribute__((always_inline)) void KV_FN(pv_tile)(
    const float *p, int64_t stride, int nq, const KV_T *v_buf, const int64_t *sl, int64_t Hkv,
    int64_t h, int64_t D, int64_t c0, int64_t t0, int64_t t1, float *acc) {
    __m256 r[3][4];
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < 4; ++j) r[g][j] = _mm256_loadu_ps(acc + g * D + c0 + 8 * j);
    for (int64_t t = t0; t < t1; ++t) {
        const KV_T *v = ROW(v_buf, t) + c0;
        __m256 pt[3];
        for (int g = 0; g < nq; ++g) pt[g] = _mm256_set1_ps(p[g * stride + t]);
        for (int j = 0; j < 4; ++j) {
            const __m256 x = KV_LOAD(v + 8 * j);
            for (int g = 0; g < nq; ++g) r[g][j] = _mm256_fmadd_ps(pt[g], x, r[g][j]);
        }
    }
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc + g * D + c0 + 8 * j, r[g][j]);
}

/* acc[g] = sum_t p[g][t] v_t for the nh * G query heads of KV heads h0 .. h0 + nh - 1:
 * tokens in blocks of VBLOCK (their V rows stay in L1 while every query head uses them),
 * up to three query rows of a KV head a tile (`pv_tile`), 32 columns at a time; the last
 * D % 32 columns one row and eight columns at a time. */
#define VBLOCK 16
static void KV_FN(pv_sum)(const float *scores, int64_t stride, const KV_T *v_buf, const int64_t *sl,
                   int64_t L, int64_t Hkv, int64_t h0, int64_t nh, int64_t D, int64_t G,
                   float *acc) {
    const int64_t D32 = D / 32 * 32;
    for (int64_t i = 0; i < nh * G * D; ++i) acc[i] = 0.0f;
    for (int64_t t0 = 0; t0 < L; t0 += VBLOCK) {
        const int64_t t1 = t0 + VBLOCK < L ? t0 + VBLOCK : L;
        for (int64_t a = t1; a < t1 + VBLOCK && a < L; ++a)
            prefetch_row(ROWH(v_buf, a, h0), nh * D * sizeof(KV_T));
        for (int64_t h = h0; h < h0 + nh; ++h)
            for (int64_t g = (h - h0) * G; g < (h - h0 + 1) * G; g += 3) {
                const int64_t left = (h - h0 + 1) * G - g;
                const float *p = scores + g * stride;
                float *pe = acc + g * D;
                for (int64_t c = 0; c < D32; c += 32) {
                    if (left >= 3)
                        KV_FN(pv_tile)(p, stride, 3, v_buf, sl, Hkv, h, D, c, t0, t1, pe);
                    else if (left == 2)
                        KV_FN(pv_tile)(p, stride, 2, v_buf, sl, Hkv, h, D, c, t0, t1, pe);
                    else
                        KV_FN(pv_tile)(p, stride, 1, v_buf, sl, Hkv, h, D, c, t0, t1, pe);
                }
                for (int64_t gg = g; gg < g + (left < 3 ? left : 3); ++gg)
                    for (int64_t c = D32; c < D; c += 8) {
                        const float *pg = scores + gg * stride;
                        __m256 r = _mm256_loadu_ps(acc + gg * D + c);
                        for (int64_t t = t0; t < t1; ++t)
                            r = _mm256_fmadd_ps(_mm256_set1_ps(pg[t]), KV_LOAD(ROW(v_buf, t) + c), r);
                        _mm256_storeu_ps(acc + gg * D + c, r);
                    }
            }
    }
}

/* Scores of eight keys k[0..7] for nq <= 3 query heads q (rows D apart, D % 16 == 0),
 * stored at out[g * stride + 0..7]: 8 * nq accumulators of 16 lanes, each K vector
 * loaded (and converted) once for all nq heads, reduced by `zsum8`. */
static ZW_INLINE void KV_FN(zqk_tile)(const float *q, int nq, const KV_T *const *k, int64_t D,
                                      __m256 vscale, float *out, int64_t stride) {
    __m512 a[3][8];
    for (int g = 0; g < nq; ++g)
        for (int r = 0; r < 8; ++r) a[g][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
        const __m512 q0 = _mm512_loadu_ps(q + i);
        const __m512 q1 = nq > 1 ? _mm512_loadu_ps(q + D + i) : q0;
        const __m512 q2 = nq > 2 ? _mm512_loadu_ps(q + 2 * D + i) : q0;
        for (int r = 0; r < 8; ++r) {
            const __m512 x = KV_LOAD16(k[r] + i);
            a[0][r] = _mm512_fmadd_ps(q0, x, a[0][r]);
            if (nq > 1) a[1][r] = _mm512_fmadd_ps(q1, x, a[1][r]);
            if (nq > 2) a[2][r] = _mm512_fmadd_ps(q2, x, a[2][r]);
        }
    }
    for (int g = 0; g < nq; ++g)
        _mm256_storeu_ps(out + g * stride, _mm256_mul_ps(zsum8(a[g]), vscale));
}

/* `qk_scores` in 512-bit vectors (D % 16 == 0): eight keys at a time, then the last
 * L % 8 keys by `qk_scores` itself. */
static ZW void KV_FN(zqk_scores)(const float *qb, const KV_T *k_buf, const int64_t *sl, int64_t L,
                                 int64_t Hkv, int64_t h0, int64_t nh, int64_t D, int64_t G,
                                 float scale, float *scores, int64_t stride) {
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t t = 0;
    for (; t + 8 <= L; t += 8) {
        for (int64_t h = h0; h < h0 + nh; ++h) {
            /* Each head fetches its own part of the rows AHEAD on (see zpv_tile). */
            for (int64_t a = t + AHEAD; a < t + AHEAD + 8 && a < L; ++a)
                prefetch_row(ROW(k_buf, a), D * sizeof(KV_T));
            const KV_T *k[8];
            for (int r = 0; r < 8; ++r) k[r] = ROW(k_buf, t + r);
            for (int64_t g = (h - h0) * G; g < (h - h0 + 1) * G; g += 3) {
                const float *qg = qb + g * D;
                float *o = scores + g * stride + t;
                const int64_t left = (h - h0 + 1) * G - g;
                if (left >= 3)
                    KV_FN(zqk_tile)(qg, 3, k, D, vscale, o, stride);
                else if (left == 2)
                    KV_FN(zqk_tile)(qg, 2, k, D, vscale, o, stride);
                else
                    KV_FN(zqk_tile)(qg, 1, k, D, vscale, o, stride);
            }
        }
    }
    if (t < L)
        KV_FN(qk_scores)(qb, k_buf, sl + t, L - t, Hkv, h0, nh, D, G, scale, scores + t, stride);
}

/* acc[g][c0 .. c0 + 63] += sum_t p_g[t] v_t[c0 ..] over t in [t0, t1) for nq <= 3 query
 * rows g of KV head h (p rows `stride` apart, acc rows D apart): 4 * nq accumulators,
 * each V vector loaded once for all nq rows. With pf_end > 0 each token also fetches the
 * same 64 columns of the V row AHEAD tokens on (below pf_end).
 *
 * The 512-bit passes spread their prefetches over the work: a few lines per token and
 * head, not every line of a block of rows at once (which stalled on the full miss
 * queue; docs/perf-notes.md, "Decode attention"). The AVX2 passes keep the block-at-once
 * prefetch. */
static ZW_INLINE void KV_FN(zpv_tile)(const float *p, int64_t stride, int64_t ts, int nq,
                                      const KV_T *v_buf,
                                      const int64_t *sl, int64_t Hkv, int64_t h, int64_t D,
                                      int64_t c0, int64_t t0, int64_t t1, float *acc,
                                      int64_t pf_end) {
    __m512 r[3][4];
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < 4; ++j) r[g][j] = _mm512_loadu_ps(acc + g * D + c0 + 16 * j);
    for (int64_t t = t0; t < t1; ++t) {
        if (t + AHEAD < pf_end) { /* not prefetch_row: GCC 12 left no prefetch of it here */
            const char *row = (const char *)(ROWH(v_buf, t + AHEAD, h) + c0);
            for (int64_t i = 0; i < 64 * (int64_t)sizeof(KV_T); i += 64)
                _mm_prefetch(row + i, _MM_HINT_T1);
        }
        const KV_T *v = ROWH(v_buf, t, h) + c0;
        const __m512 x0 = KV_LOAD16(v), x1 = KV_LOAD16(v + 16);
        const __m512 x2 = KV_LOAD16(v + 32), x3 = KV_LOAD16(v + 48);
        for (int g = 0; g < nq; ++g) {
            const __m512 pt = _mm512_set1_ps(p[g * stride + t * ts]);
            r[g][0] = _mm512_fmadd_ps(pt, x0, r[g][0]);
            r[g][1] = _mm512_fmadd_ps(pt, x1, r[g][1]);
            r[g][2] = _mm512_fmadd_ps(pt, x2, r[g][2]);
            r[g][3] = _mm512_fmadd_ps(pt, x3, r[g][3]);
        }
    }
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + g * D + c0 + 16 * j, r[g][j]);
}

/* `pv_sum` in 512-bit vectors (D % 64 == 0): per block of VBLOCK tokens, up to three
 * query rows of a KV head share each V vector. */
static ZW void KV_FN(zpv_sum)(const float *scores, int64_t stride, const KV_T *v_buf,
                              const int64_t *sl, int64_t L, int64_t Hkv, int64_t h0, int64_t nh,
                              int64_t D, int64_t G, float *acc) {
    for (int64_t i = 0; i < nh * G * D; ++i) acc[i] = 0.0f;
    for (int64_t t0 = 0; t0 < L; t0 += VBLOCK) {
        const int64_t t1 = t0 + VBLOCK < L ? t0 + VBLOCK : L;
        for (int64_t h = h0; h < h0 + nh; ++h)
            for (int64_t g = (h - h0) * G; g < (h - h0 + 1) * G; g += 3) {
                const int64_t left = (h - h0 + 1) * G - g;
                const float *p = scores + g * stride;
                float *pe = acc + g * D;
                /* The head's first query rows fetch ahead; the rest find the rows cached. */
                const int64_t pf = g == (h - h0) * G ? L : 0;
                for (int64_t c = 0; c < D; c += 64) {
                    if (left >= 3)
                        KV_FN(zpv_tile)(p, stride, 1, 3, v_buf, sl, Hkv, h, D, c, t0, t1, pe, pf);
                    else if (left == 2)
                        KV_FN(zpv_tile)(p, stride, 1, 2, v_buf, sl, Hkv, h, D, c, t0, t1, pe, pf);
                    else
                        KV_FN(zpv_tile)(p, stride, 1, 1, v_buf, sl, Hkv, h, D, c, t0, t1, pe, pf);
                }
            }
    }
}

/* The score and V-sum passes: `qk_scores` / `pv_sum`, or their 512-bit forms. */
typedef void (*KV_FN(scores_fn))(const float *, const KV_T *, const int64_t *, int64_t, int64_t,
                                 int64_t, int64_t, int64_t, int64_t, float, float *, int64_t);
typedef void (*KV_FN(v_sum_fn))(const float *, int64_t, const KV_T *, const int64_t *, int64_t,
                                int64_t, int64_t, int64_t, int64_t, int64_t, float *);

/* Fetch rows [0, AHEAD) of KV heads h .. h + nh - 1 (of the L a pass reads) into L2: the
 * rows before the pass's own prefetches (AHEAD on) reach. Called before the score pass for
 * K and before the softmax for V, so the V rows arrive while it runs (docs/perf-notes.md,
 * "Decode attention"). */
static inline void KV_FN(prefetch_first)(const KV_T *buf, const int64_t *sl, int64_t L,
                                         int64_t Hkv, int64_t h, int64_t nh, int64_t D) {
    for (int64_t t = 0; t < AHEAD && t < L; ++t)
        prefetch_row(ROWH(buf, t, h), nh * D * sizeof(KV_T));
}

/* The shared part of cascade group gr for KV head h, chunk c (decode_attention.c):
 * gathers the members' G query rows of head h into qg (R = count * G rows of D), scores
 * them against the chunk's shared keys (read through the first member's slot list) and
 * writes the partial softmax into its block (`cascade_block`): R rows of D unnormalized
 * V sums, then the R row maxima, then the R sums of exps. scores: R * stride floats
 * (stride >= the chunk's length rounded up to 8), 32-byte aligned. */
static void KV_FN(cascade_part)(const cascade_group *gr, const int64_t *members, int64_t h,
                                int64_t c, const float *q, int64_t ldq, const KV_T *k_buf,
                                const KV_T *v_buf, const int64_t *slots, int64_t ld_slots,
                                int64_t Hkv, int64_t D, int64_t G, float scale,
                                KV_FN(scores_fn) scores_of, KV_FN(v_sum_fn) v_sum,
                                float *scores, int64_t stride, float *qg, float *part) {
    const int64_t R = gr->count * G;
    int64_t c0, c1;
    cascade_chunk(gr->prefix, gr->chunks, c, &c0, &c1);
    for (int64_t i = 0; i < gr->count; ++i)
        for (int64_t j = 0; j < G * D; ++j)
            qg[i * G * D + j] = q[members[gr->first + i] * ldq + h * G * D + j];
    const int64_t *sl = slots + members[gr->first] * ld_slots + c0;
    float *acc = part + cascade_block(gr, h, c, G, D);
    KV_FN(prefetch_first)(k_buf, sl, c1 - c0, Hkv, h, 1, D);
    scores_of(qg, k_buf, sl, c1 - c0, Hkv, h, 1, D, R, scale, scores, stride);
    KV_FN(prefetch_first)(v_buf, sl, c1 - c0, Hkv, h, 1, D);
    softmax_rows(scores, R, c1 - c0, stride, acc + R * D, acc + R * D + R);
    v_sum(scores, stride, v_buf, sl, c1 - c0, Hkv, h, 1, D, R, acc);
}

/* The cascade's shared part in 512-bit vectors (D % 64 == 0), its R query rows across
 * the lanes: scored against one key at a time with no horizontal sums, where `zqk_tile`
 * spends 24 shuffles and adds per eight keys of each row reducing its 16-lane partials.
 * Queries are gathered transposed (qt[d * ld + r], rows R .. ld - 1 zero), scores come
 * out transposed (st[t * ld + r]), and the softmax runs down the columns, 16 rows a
 * vector. */

/* st[i * ld + 16 j + lane] = scale * (q row 16 j + lane) . k_i for the keys i < NK and
 * row vectors j < NV: each key element is broadcast once for all 16 NV rows, 4 NV
 * independent FMA chains. */
static ZW_INLINE void KV_FN(zqkt_tile)(const float *qt, int64_t ld, int nv,
                                       const KV_T *const *k, int nk, int64_t D, __m512 vscale,
                                       float *st) {
    __m512 a[4][3];
    for (int i = 0; i < nk; ++i)
        for (int j = 0; j < nv; ++j) a[i][j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        __m512 qv[3];
        for (int j = 0; j < nv; ++j) qv[j] = _mm512_loadu_ps(qt + d * ld + 16 * j);
        for (int i = 0; i < nk; ++i) {
            const __m512 kb = _mm512_set1_ps(KV_TO_F32(k[i][d]));
            for (int j = 0; j < nv; ++j) a[i][j] = _mm512_fmadd_ps(kb, qv[j], a[i][j]);
        }
    }
    for (int i = 0; i < nk; ++i)
        for (int j = 0; j < nv; ++j)
            _mm512_storeu_ps(st + i * ld + 16 * j, _mm512_mul_ps(a[i][j], vscale));
}

/* `zqkt_tile` over all nvec row vectors for the keys k[0 .. nk): tiles of up to three. */
static ZW_INLINE void KV_FN(zqkt_keys)(const float *qt, int64_t ld, int64_t nvec,
                                       const KV_T *const *k, int nk, int64_t D, __m512 vscale,
                                       float *st) {
    for (int64_t j = 0; j < nvec; j += 3) {
        const int64_t left = nvec - j;
        if (left >= 3)
            KV_FN(zqkt_tile)(qt + 16 * j, ld, 3, k, nk, D, vscale, st + 16 * j);
        else if (left == 2)
            KV_FN(zqkt_tile)(qt + 16 * j, ld, 2, k, nk, D, vscale, st + 16 * j);
        else
            KV_FN(zqkt_tile)(qt + 16 * j, ld, 1, k, nk, D, vscale, st + 16 * j);
    }
}

/* Transposed scores of the ld / 16 row vectors against keys [0, L) of KV head h: four
 * keys a tile (then one at a time). */
static ZW void KV_FN(zqkt_scores)(const float *qt, int64_t ld, const KV_T *k_buf,
                                  const int64_t *sl, int64_t L, int64_t Hkv, int64_t h,
                                  int64_t D, float scale, float *st) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t t = 0; t < L;) {
        const int nk = L - t >= 4 ? 4 : 1;
        for (int64_t a = t + AHEAD; a < t + AHEAD + nk && a < L; ++a)
            prefetch_row(ROWH(k_buf, a, h), D * sizeof(KV_T));
        const KV_T *k[4];
        for (int i = 0; i < nk; ++i) k[i] = ROWH(k_buf, t + i, h);
        if (nk == 4)
            KV_FN(zqkt_keys)(qt, ld, ld / 16, k, 4, D, vscale, st + t * ld);
        else
            KV_FN(zqkt_keys)(qt, ld, ld / 16, k, 1, D, vscale, st + t * ld);
        t += nk;
    }
}

/* acc[r] = sum_t p_r[t] v_t for the R rows of the transposed numerators st (st[t * ld +
 * r]) over keys [0, L) of KV head h: `zpv_tile`'s blocks and tiles with p read down the
 * columns. */
static ZW void KV_FN(zpvt_sum)(const float *st, int64_t ld, const KV_T *v_buf,
                               const int64_t *sl, int64_t L, int64_t Hkv, int64_t h, int64_t D,
                               int64_t R, float *acc) {
    for (int64_t i = 0; i < R * D; ++i) acc[i] = 0.0f;
    for (int64_t t0 = 0; t0 < L; t0 += VBLOCK) {
        const int64_t t1 = t0 + VBLOCK < L ? t0 + VBLOCK : L;
        for (int64_t g = 0; g < R; g += 3) {
            const int64_t left = R - g, pf = g == 0 ? L : 0;
            for (int64_t c = 0; c < D; c += 64) {
                if (left >= 3)
                    KV_FN(zpv_tile)(st + g, 1, ld, 3, v_buf, sl, Hkv, h, D, c, t0, t1,
                                    acc + g * D, pf);
                else if (left == 2)
                    KV_FN(zpv_tile)(st + g, 1, ld, 2, v_buf, sl, Hkv, h, D, c, t0, t1,
                                    acc + g * D, pf);
                else
                    KV_FN(zpv_tile)(st + g, 1, ld, 1, v_buf, sl, Hkv, h, D, c, t0, t1,
                                    acc + g * D, pf);
            }
        }
    }
}

/* `cascade_part` in 512-bit vectors with the rows across the lanes (above). qt: D * ld
 * floats, st: the chunk's length * ld floats, ld = R rounded up to 16. */
static ZW void KV_FN(zcascade_part)(const cascade_group *gr, const int64_t *members, int64_t h,
                                    int64_t c, const float *q, int64_t ldq, const KV_T *k_buf,
                                    const KV_T *v_buf, const int64_t *slots, int64_t ld_slots,
                                    int64_t Hkv, int64_t D, int64_t G, float scale, float *st,
                                    float *qt, float *part) {
    const int64_t R = gr->count * G, ld = (R + 15) / 16 * 16;
    int64_t c0, c1;
    cascade_chunk(gr->prefix, gr->chunks, c, &c0, &c1);
    for (int64_t i = 0; i < gr->count; ++i)
        for (int64_t g = 0; g < G; ++g) {
            const float *qr = q + members[gr->first + i] * ldq + (h * G + g) * D;
            for (int64_t d = 0; d < D; ++d) qt[d * ld + i * G + g] = qr[d];
        }
    for (int64_t d = 0; d < D; ++d)
        for (int64_t r = R; r < ld; ++r) qt[d * ld + r] = 0.0f;
    const int64_t *sl = slots + members[gr->first] * ld_slots + c0;
    float *acc = part + cascade_block(gr, h, c, G, D);
    KV_FN(prefetch_first)(k_buf, sl, c1 - c0, Hkv, h, 1, D);
    KV_FN(zqkt_scores)(qt, ld, k_buf, sl, c1 - c0, Hkv, h, D, scale, st);
    KV_FN(prefetch_first)(v_buf, sl, c1 - c0, Hkv, h, 1, D);
    softmax_cols(st, c1 - c0, ld, R, acc + R * D, acc + R * D + R);
    KV_FN(zpvt_sum)(st, ld, v_buf, sl, c1 - c0, Hkv, h, D, R, acc);
}

/* radixlm_decode_attention on KV_T buffers. */
static int KV_FN(decode_attention)(const float *q, int64_t ldq, const KV_T *k_buf,
                                    const KV_T *v_buf, const int64_t *slots, int64_t ld_slots,
                                    const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                                    int64_t Hkv, int64_t D, float scale, int64_t window,
                                    int num_threads) {
    const int64_t G = H / Hkv;
    /* Cascade groups (decode_attention.c): group[b], the groups' rows, their partials. A
     * sliding window (window > 0) starts each request's keys at its own place, so no
     * prefix is shared: no groups. */
    int64_t *group = malloc((size_t)(2 * B) * sizeof(int64_t)), *members = group + B;
    if (!group) return -1;
    cascade_group gs[CASCADE_GROUPS];
    int64_t ng = 0, chunk_len = 0;
    if (window > 0)
        for (int64_t b = 0; b < B; ++b) group[b] = -1;
    else
        ng = cascade_groups(slots, ld_slots, seq_lens, B, Hkv, num_threads, group, members, gs,
                            &chunk_len);
    int64_t shared_tasks = 0, part_floats = 0, max_rows = 0, max_len = 1;
    for (int64_t j = 0; j < ng; ++j) {
        shared_tasks += Hkv * gs[j].chunks;
        part_floats += Hkv * gs[j].chunks * gs[j].count * G * (D + 2);
        max_rows = gs[j].count * G > max_rows ? gs[j].count * G : max_rows;
    }
    for (int64_t b = 0; b < B; ++b) {
        const int64_t own =
            seq_lens[b] - (group[b] < 0 ? window_start(seq_lens[b], window) : gs[group[b]].prefix);
        max_len = own > max_len ? own : max_len;
    }
    float *part = ng ? malloc((size_t)part_floats * sizeof(float)) : NULL;
    if (ng && !part) {
        free(group);
        return -1;
    }
    /* A task per request and KV head; with requests enough to share out, a task per
     * request that reads each K / V row of all the KV heads in one pass. */
    const int64_t nh = B >= 2 * num_threads ? Hkv : 1;
    /* The 512-bit score and V-sum tiles where the CPU has AVX-512 and D % 64 == 0. */
    const int wide = D % 64 == 0 && radixlm_gemm_isa(-1);
    const KV_FN(scores_fn) scores_of = wide ? KV_FN(zqk_scores) : KV_FN(qk_scores);
    const KV_FN(v_sum_fn) v_sum = wide ? KV_FN(zpv_sum) : KV_FN(pv_sum);
    const int64_t cstride = (chunk_len + 7) / 8 * 8;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        /* Per thread: score rows (padded to 8), accumulators of D floats, row maxima and
         * sums (each padded to 8 so the parts stay 32-byte aligned); for the shared tasks
         * also the gathered query rows. */
        const int64_t stride = (max_len + 7) / 8 * 8, R = nh * G;
        const int64_t own_floats = R * stride + R * D + 2 * ((R + 7) / 8 * 8);
        const int64_t rows16 = (max_rows + 15) / 16 * 16;  /* zcascade_part pads rows */
        const int64_t shared_floats = rows16 * (cstride + D);
        float *scores = aligned_alloc(
            32, (size_t)(own_floats > shared_floats ? own_floats : shared_floats) * sizeof(float));
        if (!scores) failed = 1;
        /* The groups' shared keys, once per group, KV head and chunk. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < shared_tasks; ++task) {
            if (!scores) continue;
            int64_t j = 0, rest = task;
            while (rest >= Hkv * gs[j].chunks) rest -= Hkv * gs[j++].chunks;
            if (wide)
                KV_FN(zcascade_part)(gs + j, members, rest / gs[j].chunks, rest % gs[j].chunks, q,
                                     ldq, k_buf, v_buf, slots, ld_slots, Hkv, D, G, scale, scores,
                                     scores + rows16 * cstride, part);
            else
                KV_FN(cascade_part)(gs + j, members, rest / gs[j].chunks, rest % gs[j].chunks, q,
                                    ldq, k_buf, v_buf, slots, ld_slots, Hkv, D, G, scale,
                                    scores_of, v_sum, scores, cstride, scores + rows16 * cstride,
                                    part);
        }
        /* Each request's own keys (all of them outside a group), merged with its group's
         * partials. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv / nh; ++task) {
            if (!scores) continue;
            const int64_t b = task / (Hkv / nh), h = task % (Hkv / nh) * nh;
            const cascade_group *gr = group[b] < 0 ? NULL : gs + group[b];
            const int64_t P = gr ? gr->prefix : window_start(seq_lens[b], window);
            const int64_t L = seq_lens[b] - P;
            const int64_t *sl = slots + b * ld_slots + P;
            const float *qb = q + b * ldq + h * G * D;
            float *acc = scores + R * stride, *rmax = acc + R * D;
            float *rsum = rmax + (R + 7) / 8 * 8;
            KV_FN(prefetch_first)(k_buf, sl, L, Hkv, h, nh, D);
            scores_of(qb, k_buf, sl, L, Hkv, h, nh, D, G, scale, scores, stride);
            KV_FN(prefetch_first)(v_buf, sl, L, Hkv, h, nh, D);
            softmax_rows(scores, R, L, stride, rmax, rsum);
            v_sum(scores, stride, v_buf, sl, L, Hkv, h, nh, D, G, acc);
            int64_t i = 0; /* b's index among its group's members */
            while (gr && members[gr->first + i] != b) ++i;
            for (int64_t g = 0; g < R; ++g) {
                float *o = out + (b * H + h * G + g) * D, *a = acc + g * D;
                if (!gr) {
                    __m256 inv = _mm256_set1_ps(1.0f / rsum[g]);
                    for (int64_t e = 0; e < D; e += 8)
                        _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(a + e)));
                    continue;
                }
                /* Merge: each partial's sums scaled by exp(its max - the overall max). */
                const int64_t Rg = gr->count * G, row = i * G + g % G, hh = h + g / G;
                const float *blk = part + cascade_block(gr, hh, 0, G, D);
                const int64_t bs = Rg * (D + 2); /* chunk c's block is c blocks on */
                float m = rmax[g];
                for (int64_t c = 0; c < gr->chunks; ++c) {
                    const float mc = blk[c * bs + Rg * D + row];
                    m = mc > m ? mc : m;
                }
                float w = expf(rmax[g] - m), den = rsum[g] * w;
                for (int64_t e = 0; e < D; ++e) o[e] = a[e] * w;
                for (int64_t c = 0; c < gr->chunks; ++c) {
                    const float *pc = blk + c * bs;
                    const float wc = expf(pc[Rg * D + row] - m);
                    den += pc[Rg * D + Rg + row] * wc;
                    for (int64_t e = 0; e < D; ++e) o[e] += pc[row * D + e] * wc;
                }
                const float inv = 1.0f / den;
                for (int64_t e = 0; e < D; ++e) o[e] *= inv;
            }
        }
        free(scores);
    }
    free(part);
    free(group);
    return failed ? -1 : 0;
}

#undef ROW
#undef ROWH
