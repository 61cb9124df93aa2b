/* Verify-row attention on one KV element type, included by decode_attention.c after
 * decode_attention_kv.h (same KV_T / KV_LOAD / KV_FN macros, same score, softmax and
 * V-sum passes).
 *
 * Request b has n = ext_lens[b] <= FEW_TOKENS new tokens after a cached prefix of
 * p = seq_lens[b] - n keys (a speculative step's root and draft rows, a jump-forward or
 * lookup draft, a decode riding in a mixed step); token j attends over keys 0 .. p + j.
 * A request's rows go together: a task takes one request, one KV head and one chunk of
 * its keys and scores all n * G query rows of that head against the chunk at once, so
 * each K and V row is read once for the request's every new token and query head; the
 * causal tail (keys p + 1 .. p + n - 1, which only the later tokens see) is masked to
 * -inf in the scores.
 *
 * Requests whose slot lists begin with the same slots (a prefix the radix cache shares:
 * forked branches, a common system prompt) form cascade groups as in the decode kernel
 * (`cascade_groups`, over each request's first p + 1 keys): one shared task per group,
 * KV head and chunk of the shared keys scores every row of every member, and each
 * request's own tasks cover only the keys after the shared prefix. Partial softmaxes
 * (max, sum of exps, unnormalized V sum) of a request's chunks and of its group's shared
 * chunks are merged by their maxima after all tasks (Hydragen, Juravsky et al. 2024);
 * a request of one chunk and no group writes its output directly.
 *
 * The decode kernel reaches the shared reads with a one-token request per row, but then
 * gives every row a task over its request's own keys: n reads of them, and n merges
 * (docs/perf-notes.md, "Decode attention"). */

/* Each thread's buffers for `verify_task`: scores [rows, stride], the gathered query
 * rows, the V sums [rows, D], the row maxima and sums (rows padded to 8 floats). */
typedef struct {
    float *scores, *qg, *acc, *rmax, *rsum;
    int64_t stride;
} KV_FN(verify_buf);

/* Scores rows [0, R) of buf->qg against keys [c0, c1) of KV head h through slot list sl
 * (sl[t] for key t), masks row r's keys from mask_from + r / G on (token r / G of a
 * request whose first token sees keys below mask_from; 0: no mask), and leaves the
 * chunk's partial softmax in buf: acc (unnormalized), rmax, rsum. */
static void KV_FN(verify_task)(const KV_FN(verify_buf) *buf, int64_t R, int64_t G,
                               const int64_t *sl, int64_t c0, int64_t c1, int64_t mask_from,
                               const KV_T *k_buf, const KV_T *v_buf, int64_t Hkv, int64_t h,
                               int64_t D, float scale, KV_FN(scores_fn) scores_of,
                               KV_FN(v_sum_fn) v_sum) {
    const int64_t L = c1 - c0, stride = buf->stride;
    float *scores = buf->scores;
    sl += c0;
    KV_FN(prefetch_first)(k_buf, sl, L, Hkv, h, 1, D);
    scores_of(buf->qg, k_buf, sl, L, Hkv, h, 1, D, R, scale, scores, stride);
    if (mask_from)
        for (int64_t r = 0; r < R; ++r)
            for (int64_t t = mask_from + r / G - c0; t < L; ++t) scores[r * stride + t] = -INFINITY;
    KV_FN(prefetch_first)(v_buf, sl, L, Hkv, h, 1, D);
    softmax_rows(scores, R, L, stride, buf->rmax, buf->rsum);
    v_sum(scores, stride, v_buf, sl, L, Hkv, h, 1, D, R, buf->acc);
}

/* Copies the partial softmax of R rows from buf into a block: R rows of D V sums, then
 * the R maxima, then the R sums. */
static inline void KV_FN(verify_store)(const KV_FN(verify_buf) *buf, int64_t R, int64_t D,
                                       float *blk) {
    memcpy(blk, buf->acc, (size_t)(R * D) * sizeof(float));
    memcpy(blk + R * D, buf->rmax, (size_t)R * sizeof(float));
    memcpy(blk + R * D + R, buf->rsum, (size_t)R * sizeof(float));
}

/* Partial c of a request's merge: its own chunks first (blocks of R rows from `own`), then
 * its group's shared chunks (blocks of Rg rows from `sh`, its rows from grow on). Returns
 * the block; *nr gets its row count, *rr row r's index in it. */
static inline const float *KV_FN(verify_partial)(const float *own, int64_t own_chunks, int64_t R,
                                                 int64_t r, const float *sh, int64_t Rg,
                                                 int64_t grow, int64_t D, int64_t c, int64_t *nr,
                                                 int64_t *rr) {
    if (c < own_chunks) {
        *nr = R, *rr = r;
        return own + c * R * (D + 2);
    }
    *nr = Rg, *rr = grow + r;
    return sh + (c - own_chunks) * Rg * (D + 2);
}

/* radixlm_verify_attention (decode_attention.c) on KV_T buffers. */
static int KV_FN(verify_attention)(const float *q, int64_t ldq, const KV_T *k_buf,
                                   const KV_T *v_buf, const int64_t *slots, int64_t ld_slots,
                                   const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                                   int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                                   int num_threads) {
    const int64_t G = H / Hkv, nt = num_threads > 0 ? num_threads : 1;
    /* Per request: first keys (p + 1, those every row sees), group, own-part start P,
     * own chunks, first own task, first output row, first row in its group's block,
     * first float of its own partials (-1: one chunk and no group, written to out);
     * `members` as cascade_groups fills. */
    int64_t *info = malloc((size_t)(9 * B + 1) * sizeof(int64_t));
    if (!info) return -1;
    int64_t *first = info, *group = first + B, *members = group + B, *own0 = members + B;
    int64_t *chunks = own0 + B, *row0 = chunks + B, *grow = row0 + B, *part0 = grow + B;
    int64_t *task0 = part0 + B;
    for (int64_t b = 0, r = 0; b < B; ++b) {
        first[b] = seq_lens[b] - ext_lens[b] + 1;
        row0[b] = r;
        r += ext_lens[b];
    }
    cascade_group gs[CASCADE_GROUPS];
    int64_t shared_chunk = 0;
    const int64_t ng = cascade_groups(slots, ld_slots, first, B, Hkv, (int)nt, group, members, gs,
                                      &shared_chunk);
    /* Shared partials: group g's block for KV head h, chunk c holds its R_g rows, member
     * by member (grow), each member's n tokens x G heads. */
    int64_t part_floats = 0, shared_tasks = 0, max_rows = 1, stride = 8;
    int64_t gpart[CASCADE_GROUPS], grows[CASCADE_GROUPS];
    for (int64_t g = 0; g < ng; ++g) {
        int64_t R = 0;
        for (int64_t i = 0; i < gs[g].count; ++i) {
            const int64_t b = members[gs[g].first + i];
            grow[b] = R;
            R += ext_lens[b] * G;
        }
        grows[g] = R;
        gpart[g] = part_floats;
        part_floats += Hkv * gs[g].chunks * R * (D + 2);
        shared_tasks += Hkv * gs[g].chunks;
        max_rows = R > max_rows ? R : max_rows;
        const int64_t longest = (gs[g].prefix + gs[g].chunks - 1) / gs[g].chunks;
        stride = (longest + 7) / 8 * 8 > stride ? (longest + 7) / 8 * 8 : stride;
    }
    /* Own chunks: the cascade's sizing rule (CASCADE_TASKS tasks per thread where the keys
     * allow, CASCADE_CHUNK .. CASCADE_CHUNK_MAX keys) over the own parts. Request b's
     * keys own0[b] .. first[b] - 1 split into even chunks; its last chunk also takes the
     * n - 1 tail keys, so every row has a key in every chunk. */
    int64_t own_keys = 0;
    for (int64_t b = 0; b < B; ++b) {
        own0[b] = group[b] < 0 ? 0 : gs[group[b]].prefix;
        own_keys += Hkv * (seq_lens[b] - own0[b]);
    }
    const int64_t want = CASCADE_TASKS * nt;
    int64_t chunk = (own_keys + want - 1) / want;
    if (chunk < CASCADE_CHUNK) chunk = CASCADE_CHUNK;
    if (chunk > CASCADE_CHUNK_MAX) chunk = CASCADE_CHUNK_MAX;
    int64_t ntasks = shared_tasks, merge = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = ext_lens[b], seen = first[b] - own0[b], R = n * G;
        chunks[b] = (seen + chunk - 1) / chunk;
        task0[b] = ntasks;
        ntasks += Hkv * chunks[b];
        part0[b] = -1;
        if (chunks[b] > 1 || group[b] >= 0) {
            part0[b] = part_floats;
            part_floats += Hkv * chunks[b] * R * (D + 2);
            merge = 1;
        }
        max_rows = R > max_rows ? R : max_rows;
        const int64_t longest = (seen + chunks[b] - 1) / chunks[b] + n - 1;
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
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        const int64_t R8 = (max_rows + 7) / 8 * 8;
        KV_FN(verify_buf) buf = {NULL, NULL, NULL, NULL, NULL, stride};
        buf.scores = aligned_alloc(32, (size_t)(R8 * stride + 2 * R8 * D + 2 * R8) * sizeof(float));
        if (!buf.scores) failed = 1;
        else {
            buf.qg = buf.scores + R8 * stride;
            buf.acc = buf.qg + R8 * D;
            buf.rmax = buf.acc + R8 * D;
            buf.rsum = buf.rmax + R8;
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t task = 0; task < ntasks; ++task) {
            if (!buf.scores) continue;
            if (task < shared_tasks) { /* group g, KV head h, shared chunk c */
                int64_t g = 0, rest = task;
                while (rest >= Hkv * gs[g].chunks) rest -= Hkv * gs[g++].chunks;
                const int64_t h = rest / gs[g].chunks, c = rest % gs[g].chunks;
                for (int64_t i = 0; i < gs[g].count; ++i) {
                    const int64_t b = members[gs[g].first + i];
                    for (int64_t j = 0; j < ext_lens[b]; ++j)
                        memcpy(buf.qg + (grow[b] + j * G) * D, q + (row0[b] + j) * ldq + h * G * D,
                               (size_t)(G * D) * sizeof(float));
                }
                int64_t c0, c1;
                cascade_chunk(gs[g].prefix, gs[g].chunks, c, &c0, &c1);
                KV_FN(verify_task)(&buf, grows[g], G, slots + members[gs[g].first] * ld_slots, c0,
                                   c1, 0, k_buf, v_buf, Hkv, h, D, scale, scores_of, v_sum);
                KV_FN(verify_store)(&buf, grows[g], D,
                                    part + gpart[g] + (h * gs[g].chunks + c) * grows[g] * (D + 2));
                continue;
            }
            int64_t b = 0; /* request b, KV head h, own chunk c */
            while (task0[b + 1] <= task) ++b;
            const int64_t n = ext_lens[b], R = n * G, seen = first[b] - own0[b];
            const int64_t h = (task - task0[b]) / chunks[b], c = (task - task0[b]) % chunks[b];
            const int64_t c0 = own0[b] + seen * c / chunks[b];
            const int64_t c1 =
                c + 1 == chunks[b] ? seq_lens[b] : own0[b] + seen * (c + 1) / chunks[b];
            for (int64_t j = 0; j < n; ++j)
                memcpy(buf.qg + j * G * D, q + (row0[b] + j) * ldq + h * G * D,
                       (size_t)(G * D) * sizeof(float));
            /* Only the last chunk holds keys a row must not see. */
            const int64_t mf = c + 1 == chunks[b] && n > 1 ? first[b] : 0;
            KV_FN(verify_task)(&buf, R, G, slots + b * ld_slots, c0, c1, mf, k_buf, v_buf, Hkv, h,
                               D, scale, scores_of, v_sum);
            if (part0[b] >= 0) {
                float *blk = part + part0[b] + (h * chunks[b] + c) * R * (D + 2);
                KV_FN(verify_store)(&buf, R, D, blk);
                continue;
            }
            for (int64_t r = 0; r < R; ++r) {
                float *o = out + (row0[b] + r / G) * H * D + (h * G + r % G) * D;
                const float *a = buf.acc + r * D;
                const __m256 inv = _mm256_set1_ps(1.0f / buf.rsum[r]);
                for (int64_t e = 0; e < D; e += 8)
                    _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(a + e)));
            }
        }
        if (merge) {
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
            for (int64_t bh = 0; bh < B * Hkv; ++bh) {
                const int64_t b = bh / Hkv, h = bh % Hkv;
                if (part0[b] < 0) continue;
                /* Partial blocks of this request and head: its own chunks (R rows each,
                 * from row 0), then its group's shared chunks (R_g rows, from grow[b]). */
                const int64_t R = ext_lens[b] * G, gi = group[b];
                const int64_t nsh = gi < 0 ? 0 : gs[gi].chunks, Rg = gi < 0 ? 0 : grows[gi];
                const float *own = part + part0[b] + h * chunks[b] * R * (D + 2);
                const float *sh = gi < 0 ? NULL : part + gpart[gi] + h * nsh * Rg * (D + 2);
                for (int64_t r = 0; r < R; ++r) {
                    float m = -INFINITY;
                    for (int64_t c = 0, nr, rr; c < chunks[b] + nsh; ++c) {
                        const float *blk = KV_FN(verify_partial)(own, chunks[b], R, r, sh, Rg,
                                                                 grow[b], D, c, &nr, &rr);
                        m = blk[nr * D + rr] > m ? blk[nr * D + rr] : m;
                    }
                    float *o = out + (row0[b] + r / G) * H * D + (h * G + r % G) * D, den = 0.0f;
                    for (int64_t e = 0; e < D; ++e) o[e] = 0.0f;
                    for (int64_t c = 0, nr, rr; c < chunks[b] + nsh; ++c) {
                        const float *blk = KV_FN(verify_partial)(own, chunks[b], R, r, sh, Rg,
                                                                 grow[b], D, c, &nr, &rr);
                        const float w = expf(blk[nr * D + rr] - m);
                        den += blk[nr * D + nr + rr] * w;
                        for (int64_t e = 0; e < D; ++e) o[e] += blk[rr * D + e] * w;
                    }
                    const float inv = 1.0f / den;
                    for (int64_t e = 0; e < D; ++e) o[e] *= inv;
                }
            }
        }
        free(buf.scores);
    }
    free(part);
    free(info);
    return failed ? -1 : 0;
}
