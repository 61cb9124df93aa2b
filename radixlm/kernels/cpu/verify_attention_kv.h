/* Verify-row attention on one KV element type, included by decode_attention.c after
 * decode_attention_kv.h (same KV_T / KV_LOAD / KV_FN macros, same score, softmax and
 * V-sum passes).
 *
 * Request b has n = ext_lens[b] <= FEW_TOKENS new tokens after a cached prefix of
 * p = seq_lens[b] - n keys (a speculative step's root and draft rows, a jump-forward or
 * lookup draft, a decode riding in a mixed step); token j attends over keys 0 .. p + j.
 * A task takes one request, one KV head and one chunk of its keys, and scores all n * G
 * query rows of that head against the chunk at once: each K and V row is read once for
 * the request's every new token and query head, and the causal tail (keys p + 1 ..
 * p + n - 1, which only the later tokens see) is masked to -inf in the scores. Where a
 * request's keys span several chunks (few requests: the keys are split so the threads
 * share them), each chunk keeps its rows' partial softmax (max, sum of exps, unnormalized
 * V sum) and the partials are merged by their maxima after all tasks, as the cascade's
 * are (decode_attention.c).
 *
 * The decode kernel's cascade groups reach the same reads with a group per request and a
 * one-token request per row, but then give every row its own task over its own tail keys
 * and a merge: at a few rows per request over a few hundred keys those tasks cost as much
 * as the shared pass (docs/perf-notes.md, "Decode attention"). */

/* radixlm_verify_attention (decode_attention.c) on KV_T buffers. */
static int KV_FN(verify_attention)(const float *q, int64_t ldq, const KV_T *k_buf,
                                   const KV_T *v_buf, const int64_t *slots, int64_t ld_slots,
                                   const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                                   int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                                   int num_threads) {
    const int64_t G = H / Hkv;
    /* Chunk length: the cascade's rule (CASCADE_TASKS tasks per thread where the keys
     * allow, chunks of CASCADE_CHUNK .. CASCADE_CHUNK_MAX keys). Request b's first p + 1
     * keys (those every row sees) split into chunks[b] even chunks; its last chunk also
     * takes the n - 1 tail keys, so every row has a key in every chunk. */
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) total += Hkv * seq_lens[b];
    const int64_t want = CASCADE_TASKS * (int64_t)(num_threads > 0 ? num_threads : 1);
    int64_t chunk = (total + want - 1) / want;
    if (chunk < CASCADE_CHUNK) chunk = CASCADE_CHUNK;
    if (chunk > CASCADE_CHUNK_MAX) chunk = CASCADE_CHUNK_MAX;
    /* Per request: chunks, first task, first output row, first partial float (-1: one
     * chunk, written straight to out). */
    int64_t *info = malloc((size_t)(4 * B + 1) * sizeof(int64_t));
    if (!info) return -1;
    int64_t *chunks = info, *task0 = info + B, *row0 = task0 + B + 1, *part0 = row0 + B;
    int64_t ntasks = 0, rows = 0, part_floats = 0, max_rows = 1, stride = 8;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = ext_lens[b], first = seq_lens[b] - n + 1;
        chunks[b] = (first + chunk - 1) / chunk;
        task0[b] = ntasks;
        row0[b] = rows;
        part0[b] = chunks[b] > 1 ? part_floats : -1;
        if (chunks[b] > 1) part_floats += Hkv * chunks[b] * n * G * (D + 2);
        ntasks += Hkv * chunks[b];
        rows += n;
        max_rows = n * G > max_rows ? n * G : max_rows;
        const int64_t longest = (first + chunks[b] - 1) / chunks[b] + n - 1;
        stride = (longest + 7) / 8 * 8 > stride ? (longest + 7) / 8 * 8 : stride;
    }
    task0[B] = ntasks;
    float *part = part_floats ? malloc((size_t)part_floats * sizeof(float)) : NULL;
    if (part_floats && !part) {
        free(info);
        return -1;
    }
    const int wide = D % 64 == 0 && radixlm_gemm_isa(-1);
    const KV_FN(scores_fn) scores_of = wide ? KV_FN(zqk_scores) : KV_FN(qk_scores);
    const KV_FN(v_sum_fn) v_sum = wide ? KV_FN(zpv_sum) : KV_FN(pv_sum);
    const int merge = part_floats > 0;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        /* Per thread: the scores, the gathered query rows, the V sums, and the row maxima
         * and sums (each padded to 8 floats, so the parts stay 32-byte aligned). */
        const int64_t R8 = (max_rows + 7) / 8 * 8;
        float *scores = aligned_alloc(
            32, (size_t)(R8 * stride + 2 * R8 * D + 2 * R8) * sizeof(float));
        if (!scores) failed = 1;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t task = 0; task < ntasks; ++task) {
            if (!scores) continue;
            int64_t b = 0;
            while (task0[b + 1] <= task) ++b;
            const int64_t n = ext_lens[b], R = n * G, p = seq_lens[b] - n;
            const int64_t h = (task - task0[b]) / chunks[b], c = (task - task0[b]) % chunks[b];
            const int64_t c0 = (p + 1) * c / chunks[b];
            const int64_t c1 = c + 1 == chunks[b] ? p + n : (p + 1) * (c + 1) / chunks[b];
            const int64_t L = c1 - c0;
            float *qg = scores + R8 * stride, *acc = qg + R8 * D, *rmax = acc + R8 * D;
            float *rsum = rmax + R8;
            /* Row r = j G + g: query head h G + g of new token j. */
            for (int64_t j = 0; j < n; ++j)
                memcpy(qg + j * G * D, q + (row0[b] + j) * ldq + h * G * D,
                       (size_t)(G * D) * sizeof(float));
            const int64_t *sl = slots + b * ld_slots + c0;
            KV_FN(prefetch_first)(k_buf, sl, L, Hkv, h, 1, D);
            scores_of(qg, k_buf, sl, L, Hkv, h, 1, D, R, scale, scores, stride);
            /* Token j sees keys up to p + j: its scores past that are masked. */
            for (int64_t j = 0; j < n; ++j)
                for (int64_t t = p + j + 1 - c0; t < L; ++t)
                    for (int64_t g = 0; g < G; ++g) scores[(j * G + g) * stride + t] = -INFINITY;
            KV_FN(prefetch_first)(v_buf, sl, L, Hkv, h, 1, D);
            softmax_rows(scores, R, L, stride, rmax, rsum);
            v_sum(scores, stride, v_buf, sl, L, Hkv, h, 1, D, R, acc);
            if (part0[b] < 0) {
                for (int64_t r = 0; r < R; ++r) {
                    float *o = out + (row0[b] + r / G) * H * D + (h * G + r % G) * D;
                    const __m256 inv = _mm256_set1_ps(1.0f / rsum[r]);
                    const float *a = acc + r * D;
                    for (int64_t e = 0; e < D; e += 8)
                        _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(a + e)));
                }
                continue;
            }
            /* Partial block (h, c): R rows of D V sums, R maxima, R sums. */
            float *blk = part + part0[b] + (h * chunks[b] + c) * R * (D + 2);
            memcpy(blk, acc, (size_t)(R * D) * sizeof(float));
            memcpy(blk + R * D, rmax, (size_t)R * sizeof(float));
            memcpy(blk + R * D + R, rsum, (size_t)R * sizeof(float));
        }
        if (merge) {
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
            for (int64_t bh = 0; bh < B * Hkv; ++bh) {
                const int64_t b = bh / Hkv, h = bh % Hkv;
                if (part0[b] < 0) continue;
                const int64_t R = ext_lens[b] * G, bs = R * (D + 2);
                const float *blk = part + part0[b] + h * chunks[b] * bs;
                for (int64_t r = 0; r < R; ++r) {
                    float m = -INFINITY;
                    for (int64_t c = 0; c < chunks[b]; ++c)
                        m = blk[c * bs + R * D + r] > m ? blk[c * bs + R * D + r] : m;
                    float *o = out + (row0[b] + r / G) * H * D + (h * G + r % G) * D;
                    float den = 0.0f;
                    for (int64_t e = 0; e < D; ++e) o[e] = 0.0f;
                    for (int64_t c = 0; c < chunks[b]; ++c) {
                        const float *pc = blk + c * bs, w = expf(pc[R * D + r] - m);
                        den += pc[R * D + R + r] * w;
                        for (int64_t e = 0; e < D; ++e) o[e] += pc[r * D + e] * w;
                    }
                    const float inv = 1.0f / den;
                    for (int64_t e = 0; e < D; ++e) o[e] *= inv;
                }
            }
        }
        free(scores);
    }
    free(part);
    free(info);
    return failed ? -1 : 0;
}
