/* The body of decode_attention_mla.c on one KV element type, included once per type with
 * KV_T (the pool's element), KV_LOAD(p) (8 KV_T at p as 8 floats) and KV_FN(name) (the
 * name with the type's suffix) defined. Everything computes in fp32. */

/* out[g * SROW + r] = scale * q_g . k_r for nq <= 3 query heads q_g (rows Dk apart) and
 * the four keys k[0..3]: 4 nq independent FMA chains, each K vector converted once. */
static inline __attribute__((always_inline)) void KV_FN(mla_qk_tile)(
    const float *q, int nq, const KV_T *const *k, int64_t Dk, __m128 vscale, float *out) {
    __m256 a[3][4];
    for (int g = 0; g < nq; ++g)
        for (int r = 0; r < 4; ++r) a[g][r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < Dk; i += 8) {
        const __m256 x0 = KV_LOAD(k[0] + i), x1 = KV_LOAD(k[1] + i);
        const __m256 x2 = KV_LOAD(k[2] + i), x3 = KV_LOAD(k[3] + i);
        for (int g = 0; g < nq; ++g) {
            const __m256 qv = _mm256_loadu_ps(q + g * Dk + i);
            a[g][0] = _mm256_fmadd_ps(qv, x0, a[g][0]);
            a[g][1] = _mm256_fmadd_ps(qv, x1, a[g][1]);
            a[g][2] = _mm256_fmadd_ps(qv, x2, a[g][2]);
            a[g][3] = _mm256_fmadd_ps(qv, x3, a[g][3]);
        }
    }
    for (int g = 0; g < nq; ++g) {
        const __m256 hh = _mm256_hadd_ps(_mm256_hadd_ps(a[g][0], a[g][1]),
                                         _mm256_hadd_ps(a[g][2], a[g][3]));
        const __m128 s = _mm_add_ps(_mm256_castps256_ps128(hh), _mm256_extractf128_ps(hh, 1));
        _mm_storeu_ps(out + g * SROW, _mm_mul_ps(s, vscale));
    }
}

/* acc[g][c .. c + 8 nc) += sum_r p_g[r] v_r[c ..] over the block's nb rows v[r], for nq <= 3
 * heads (p rows SROW apart, acc rows Dv apart): each V vector loaded once for all nq. */
static inline __attribute__((always_inline)) void KV_FN(mla_pv_tile)(
    const float *p, int nq, const KV_T *const *v, int64_t nb, int64_t c, int nc, float *acc,
    int64_t Dv) {
    __m256 r[3][4];
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < nc; ++j) r[g][j] = _mm256_loadu_ps(acc + g * Dv + c + 8 * j);
    for (int64_t t = 0; t < nb; ++t) {
        __m256 x[4];
        for (int j = 0; j < nc; ++j) x[j] = KV_LOAD(v[t] + c + 8 * j);
        for (int g = 0; g < nq; ++g) {
            const __m256 pt = _mm256_set1_ps(p[g * SROW + t]);
            for (int j = 0; j < nc; ++j) r[g][j] = _mm256_fmadd_ps(pt, x[j], r[g][j]);
        }
    }
    for (int g = 0; g < nq; ++g)
        for (int j = 0; j < nc; ++j) _mm256_storeu_ps(acc + g * Dv + c + 8 * j, r[g][j]);
}

/* `mla_pv_tile` over every column of nq heads: 32 columns a tile, then 8. */
static inline __attribute__((always_inline)) void KV_FN(mla_pv_heads)(
    const float *p, int nq, const KV_T *const *v, int64_t nb, float *acc, int64_t Dv) {
    int64_t c = 0;
    for (; c + 32 <= Dv; c += 32) KV_FN(mla_pv_tile)(p, nq, v, nb, c, 4, acc, Dv);
    for (; c < Dv; c += 8) KV_FN(mla_pv_tile)(p, nq, v, nb, c, 1, acc, Dv);
}

/* The partial softmax of G query heads (q, rows Dk apart) over keys [t0, t1) of one KV
 * head, whose rows are k + sl[t] ldk and v + sl[t] ldv: part gets the G unnormalized V sums
 * [G][Dv], then the G maxima, then the G sums of exps. scores: G * SROW floats, 32-byte
 * aligned. */
static void KV_FN(split_part)(const float *q, const KV_T *k, int64_t ldk, const KV_T *v,
                              int64_t ldv, const int64_t *sl, int64_t t0, int64_t t1, int64_t G,
                              int64_t Dk, int64_t Dv, float scale, float *scores, float *part) {
    float *acc = part, *m = part + G * Dv, *l = m + G;
    for (int64_t i = 0; i < G * Dv; ++i) acc[i] = 0.0f;
    for (int64_t g = 0; g < G; ++g) m[g] = -INFINITY, l[g] = 0.0f;
    const __m128 vscale = _mm_set1_ps(scale);
    for (int64_t b0 = t0; b0 < t1; b0 += NB) {
        const int64_t nb = t1 - b0 < NB ? t1 - b0 : NB, w8 = (nb + 7) / 8 * 8;
        /* The next block's K rows (the V rows too, where they are not the same rows). */
        for (int64_t t = b0 + NB; t < b0 + 2 * NB && t < t1; ++t) {
            prefetch_bytes(k + sl[t] * ldk, Dk * (int64_t)sizeof(KV_T));
            if (v != k || ldv != ldk) prefetch_bytes(v + sl[t] * ldv, Dv * (int64_t)sizeof(KV_T));
        }
        const KV_T *kr[NB + 3], *vr[NB];
        for (int64_t t = 0; t < nb; ++t) kr[t] = k + sl[b0 + t] * ldk, vr[t] = v + sl[b0 + t] * ldv;
        for (int64_t t = nb; t < nb + 3; ++t) kr[t] = kr[0]; /* a ragged last tile's spares */
        for (int64_t t = 0; t < nb; t += 4)
            for (int64_t g = 0; g < G; g += 3) {
                float *o = scores + g * SROW + t;
                if (G - g >= 3)
                    KV_FN(mla_qk_tile)(q + g * Dk, 3, kr + t, Dk, vscale, o);
                else if (G - g == 2)
                    KV_FN(mla_qk_tile)(q + g * Dk, 2, kr + t, Dk, vscale, o);
                else
                    KV_FN(mla_qk_tile)(q + g * Dk, 1, kr + t, Dk, vscale, o);
            }
        /* Online softmax: each row's scores become exp(s - new max); acc rescaled. */
        for (int64_t g = 0; g < G; ++g) {
            float *s = scores + g * SROW;
            for (int64_t t = nb; t < w8; ++t) s[t] = -INFINITY;
            __m256 vm = _mm256_set1_ps(m[g]);
            for (int64_t t = 0; t < w8; t += 8) vm = _mm256_max_ps(_mm256_load_ps(s + t), vm);
            const float mx = hmax256(vm), corr = expf(m[g] - mx);
            const __m256 vmx = _mm256_set1_ps(mx);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t t = 0; t < w8; t += 8) {
                const __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + t), vmx));
                _mm256_store_ps(s + t, e);
                sum = _mm256_add_ps(sum, e);
            }
            l[g] = l[g] * corr + hsum256(sum);
            m[g] = mx;
            if (corr != 1.0f) {
                const __m256 vc = _mm256_set1_ps(corr);
                for (int64_t e = 0; e < Dv; e += 8)
                    _mm256_storeu_ps(acc + g * Dv + e,
                                     _mm256_mul_ps(vc, _mm256_loadu_ps(acc + g * Dv + e)));
            }
        }
        for (int64_t g = 0; g < G; g += 3) {
            if (G - g >= 3)
                KV_FN(mla_pv_heads)(scores + g * SROW, 3, vr, nb, acc + g * Dv, Dv);
            else if (G - g == 2)
                KV_FN(mla_pv_heads)(scores + g * SROW, 2, vr, nb, acc + g * Dv, Dv);
            else
                KV_FN(mla_pv_heads)(scores + g * SROW, 1, vr, nb, acc + g * Dv, Dv);
        }
    }
}
