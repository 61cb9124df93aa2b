/* The Llama decoder layers of a decode step (or of a short causal extend: a few new
 * tokens per request, as a chain-draft verify), in one call (fp32; the KV pool fp32 or
 * fp16). Each layer:
 *
 *   h = RMSNorm1(x); qkv = h W_qkv (+ b); RoPE(q, k); store k, v; a = attention(q);
 *   x += a W_o; h = RMSNorm2(x); x += (silu(h W_gate) * (h W_up)) W_down
 *
 * It runs the same kernels the layer's modules call one by one; calling them from C
 * removes a dozen Python-level calls per layer, which at one decode row cost as much as
 * a tenth of the step, and `radixlm_decode_layers` runs the whole stack of layers in one
 * call. Each projection is fp32 packed panels (packed_gemm.c) or quantized panels
 * (quant_gemm.c), as its *_fmt field says.
 */
#include <stdint.h>

#include "kernels.h"

typedef struct {
    const float *ln1, *ln2;           /* [hidden] */
    const void *qkv;                  /* panels of [(H + 2 Hkv) D, hidden] */
    const float *qkv_bias;            /* [(H + 2 Hkv) D] or NULL */
    const void *o, *gate_up, *down;   /* panels */
    int64_t hidden, inter, heads, kv_heads, head_dim;
    /* Each projection's panel format (radixlm_weight_gemm): 0 fp32, 1 Q4_1, 2 Q8_0. */
    int64_t qkv_fmt, o_fmt, gate_up_fmt, down_fmt;
    float eps, scale;
} radixlm_layer;

/* x [T, hidden] is updated in place; cos, sin [T, D]; scratch holds at least
 * T * (2 hidden + (H + 2 Hkv) D + H D + 3 inter) floats. B requests: ext_lens NULL for a
 * decode step (T == B, decode attention), else int64 [B] new tokens per request summing
 * to T (causal extend attention, D % 16 == 0). Attention is over every key (no sliding
 * window: windowed layers are not fused). Needs D % 8 == 0 and H % Hkv == 0 (checked by
 * the caller). Returns 0, -1 when attention could not allocate. */
static int decode_layer(const radixlm_layer *L, float *x, int64_t T, const float *cos,
                         const float *sin, void *k_buf, void *v_buf, int kv_f16,
                         const int64_t *loc, const int64_t *slots, int64_t ld_slots,
                         const int64_t *seq_lens, int64_t B, const int64_t *ext_lens,
                         float *scratch, int nt) {
    const int64_t hid = L->hidden, H = L->heads, Hkv = L->kv_heads, D = L->head_dim;
    const int64_t nqkv = (H + 2 * Hkv) * D;
    float *h = scratch, *qkv = h + T * hid, *attn = qkv + T * nqkv, *proj = attn + T * H * D;
    float *gu = proj + T * hid, *act = gu + 2 * T * L->inter;

    radixlm_rms_norm(x, hid, L->ln1, h, T, hid, L->eps, nt);
    radixlm_weight_gemm(L->qkv_fmt, h, L->qkv, qkv, T, hid, nqkv, nt);
    if (L->qkv_bias)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < nqkv; ++i) qkv[t * nqkv + i] += L->qkv_bias[i];
    radixlm_rope(qkv, nqkv, T, H + Hkv, D, cos, sin, nt);
    radixlm_store_kv(qkv + H * D, qkv + (H + Hkv) * D, nqkv, k_buf, v_buf, kv_f16, loc, T,
                     Hkv * D, nt);
    int rc = ext_lens ? radixlm_extend_attention(qkv, nqkv, k_buf, Hkv * D, v_buf, Hkv * D,
                                                 kv_f16, slots, ld_slots, seq_lens, ext_lens,
                                                 attn, B, H, Hkv, D, D, L->scale, 0, nt)
                      : radixlm_decode_attention(qkv, nqkv, k_buf, v_buf, kv_f16, slots, ld_slots,
                                                 seq_lens, attn, T, H, Hkv, D, L->scale, 0, nt);
    if (rc) return -1;
    radixlm_weight_gemm(L->o_fmt, attn, L->o, proj, T, H * D, hid, nt);
    for (int64_t i = 0; i < T * hid; ++i) x[i] += proj[i];

    radixlm_rms_norm(x, hid, L->ln2, h, T, hid, L->eps, nt);
    radixlm_weight_gemm(L->gate_up_fmt, h, L->gate_up, gu, T, hid, 2 * L->inter, nt);
    radixlm_silu_mul(gu, act, T, L->inter, nt);
    radixlm_weight_gemm(L->down_fmt, act, L->down, proj, T, L->inter, hid, nt);
    for (int64_t i = 0; i < T * hid; ++i) x[i] += proj[i];
    return 0;
}

/* The n layers in order, layer i on k_bufs[i] / v_bufs[i] (float32, or float16 when
 * kv_f16); arguments otherwise as decode_layer. Returns 0, or -1 when attention could not
 * allocate. */
int radixlm_decode_layers(const radixlm_layer *layers, int64_t n, void *const *k_bufs,
                          void *const *v_bufs, int kv_f16, float *x, int64_t T, const float *cos,
                          const float *sin, const int64_t *loc, const int64_t *slots,
                          int64_t ld_slots, const int64_t *seq_lens, int64_t B,
                          const int64_t *ext_lens, float *scratch, int nt) {
    for (int64_t i = 0; i < n; ++i)
        if (decode_layer(layers + i, x, T, cos, sin, k_bufs[i], v_bufs[i], kv_f16, loc, slots,
                         ld_slots, seq_lens, B, ext_lens, scratch, nt))
            return -1;
    return 0;
}
