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
/* KV pool buffers (k_buf, v_buf) hold float32, or IEEE float16 when kv_f16 is 1. */
int radixlm_extend_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_f16, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, const int64_t *ext_lens, float *out,
                             int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                             int num_threads);
int radixlm_decode_attention(const float *q, int64_t ldq, const void *k_buf, const void *v_buf,
                             int kv_f16, const int64_t *slots, int64_t ld_slots,
                             const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                             int64_t Hkv, int64_t D, float scale, int num_threads);
void radixlm_rms_norm(const float *x, int64_t ldx, const float *w, float *y, int64_t rows,
                      int64_t dim, float eps, int num_threads);
void radixlm_silu_mul(const float *gu, float *y, int64_t rows, int64_t n, int num_threads);
void radixlm_rope(float *x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim,
                  const float *cos, const float *sin, int num_threads);
void radixlm_store_kv(const float *k, const float *v, int64_t ld, void *k_buf, void *v_buf,
                      int kv_f16, const int64_t *loc, int64_t tokens, int64_t width,
                      int num_threads);
#endif
