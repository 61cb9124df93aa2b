/* The exported CPU kernels, for the fused decode layer to call one another. */
#ifndef RADIXLM_KERNELS_H
#define RADIXLM_KERNELS_H
#include <stdint.h>

void radixlm_packed_gemm(const float *x, const float *panels, float *y, int64_t M, int64_t K,
                         int64_t N, int num_threads);
/* The packed GEMM's instruction set for the process: request -1 asks, 0 keeps to AVX2, 1
 * uses AVX-512 where the CPU has AVX-512F (the default). Returns 1 when the AVX-512 path is
 * in use, else 0. */
int radixlm_gemm_isa(int request);
/* y[0:M, 0:16 npan] (+= when acc) x[0:M, 0:kn] @ [w_0 | ... | w_{npan-1}]: x rows of stride
 * ldx, w_c = w + c * wstride one panel slice (row stride 16) giving columns 16c..16c+15,
 * y rows of stride ldy. One thread; AVX-512 tiles where radixlm_gemm_isa says so. */
void radixlm_gemm_panels(int64_t M, int acc, const float *x, int64_t ldx, const float *w,
                         int64_t npan, int64_t wstride, int64_t kn, float *y, int64_t ldy);
/* Where the blocked GEMM reads its weight panels: fp32 panels [N / 16][K][16] (fmt 0), or
 * quantized panels (fmt 1 Q4_1, 2 Q8_0, 3 W4G, 4 F8; quant_gemm.c) of panel_bytes each, in groups of
 * group_bytes per 32 k rows. */
typedef struct {
    const void *w;
    int fmt;
    int64_t panel_bytes, group_bytes;
} radixlm_wsrc;
/* Panels [b0, b1) of y[M, N] = x[M, K] @ W^T (x contiguous) on the calling thread, x
 * packed into L2-sized blocks: the prefill-sized path of radixlm_packed_gemm. */
void radixlm_gemm_blocked(const float *x, const radixlm_wsrc *src, float *y, int64_t M,
                          int64_t K, int64_t N, int64_t b0, int64_t b1);
/* y[M, N] = W8A8 int8 product of x[M, K] (row stride ldx) and the int8 weight buffer w
 * (quant_int8.c); needs N % 16 == 0 and K % 32 == 0. */
void radixlm_int8_gemm(const float *x, int64_t ldx, const uint8_t *w, float *y, int64_t M,
                       int64_t K, int64_t N, int num_threads);
/* ng groups of one quantized panel (format fmt) into buf[ng * 32][16] fp32. */
void radixlm_quant_dequant(int fmt, const uint8_t *groups, int64_t ng, float *buf);
/* y[M, N] = x[M, K] @ W^T over IEEE fp16 panels [ceil(N / 16)][K][16] (half_gemm.c). */
void radixlm_half_gemm(const float *x, const uint16_t *panels, float *y, int64_t M, int64_t K,
                       int64_t N, int num_threads);
/* y = x @ W^T over bf16 pair panels, x bf16 pairs (half_gemm.c); -1 without AVX-512 BF16. */
int radixlm_bf16_gemm(const uint32_t *x, const uint32_t *panels, float *y, int64_t M,
                      int64_t K2, int64_t N, int num_threads);
int radixlm_has_bf16(void);
/* The LM head screen's candidates (half_gemm.c): returns their count, -1 when undecided. */
int64_t radixlm_screen_select(const float *approx, const float *c1, const float *c2, const float *n1,
                              const float *n2, float pad, int64_t M, int64_t V, int64_t *ids,
                              int num_threads);
/* KV pool buffers (k_buf, v_buf) hold the element format kv_fmt: 0 float32, 1 IEEE
 * float16, 2 fp8 e4m3fn, 3 fp8 e5m2 (fp8.h; radixlm_store_kv: 0 or 1 only); window
 * > 0 is a sliding window (each query sees its last `window` positions), 0 none. The
 * extend kernel reads K rows of Dk and V rows of Dv elements, ldk / ldv elements apart
 * per slot (V may alias K: multi-head latent attention). */
int radixlm_extend_attention(const float *q, int64_t ldq, const void *k_buf, int64_t ldk,
                             const void *v_buf, int64_t ldv, int kv_fmt, const int64_t *slots,
                             int64_t ld_slots, const int64_t *seq_lens, const int64_t *ext_lens,
                             float *out, int64_t B, int64_t H, int64_t Hkv, int64_t Dk,
                             int64_t Dv, float scale, int64_t window, int num_threads);
/* Decode attention with V rows of Dv (possibly != Dk) at their own stride
 * (decode_attention_mla.c). */
int radixlm_decode_attention_mla(const float *q, int64_t ldq, const void *k_buf, int64_t ldk,
                                 const void *v_buf, int64_t ldv, int kv_fmt,
                                 const int64_t *slots, int64_t ld_slots,
                                 const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                                 int64_t Hkv, int64_t Dk, int64_t Dv, float scale,
                                 int64_t window, int num_threads);
int radixlm_decode_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_fmt, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                             int64_t Hkv, int64_t D, float scale, int64_t window,
                             int num_threads);
/* The few new tokens of each request over its own keys, causally (decode_attention.c). */
int radixlm_verify_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_fmt, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                             int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                             int num_threads);
/* y = x W^T for a weight in format fmt: 0 fp32 panels (radixlm_packed_gemm), 1 Q4_1 or
 * 2 Q8_0 quantized panels (radixlm_quant_gemm, quant_gemm.c). */
void radixlm_weight_gemm(int fmt, const float *x, const void *w, float *y, int64_t M,
                         int64_t K, int64_t N, int num_threads);
void radixlm_rms_norm(const float *x, int64_t ldx, const float *w, float *y, int64_t rows,
                      int64_t dim, float eps, int num_threads);
void radixlm_silu_mul(const float *gu, float *y, int64_t rows, int64_t n, int num_threads);
void radixlm_rope(float *x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim,
                  const float *cos, const float *sin, int num_threads);
void radixlm_store_kv(const float *k, const float *v, int64_t ld, void *k_buf, void *v_buf,
                      int kv_f16, const int64_t *loc, int64_t tokens, int64_t width,
                      int num_threads);
#endif
