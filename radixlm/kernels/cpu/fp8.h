/* fp8 KV elements (one byte each) as floats, exactly, through IEEE binary16 and F16C.
 *
 * e5m2 (1 sign, 5 exponent bits of bias 15, 2 mantissa bits) is the high byte of a
 * binary16: b << 8. e4m3fn (4 exponent bits of bias 7, 3 mantissa bits, no infinities)
 * moved into a binary16's exponent and mantissa fields, ((b & 0x7F) << 7) | (b & 0x80)
 * << 8, reads 2^-8 of its value for normal and subnormal codes alike (bias 15 against 7;
 * a subnormal e4m3 code becomes a subnormal binary16), so the float is that times 256.
 * NaN codes (0x7F, 0xFF in e4m3fn) read as +-480: the pool never stores NaN from finite
 * input (writes clamp to +-448). Formats: OCP 8-bit floating point specification (2023);
 * Micikevicius et al. 2022, "FP8 formats for deep learning".
 *
 * The pools' format codes (kv_fmt): 0 float32, 1 float16, 2 fp8 e4m3fn, 3 fp8 e5m2. */
#ifndef RADIXLM_FP8_H
#define RADIXLM_FP8_H
#include <immintrin.h>
#include <stdint.h>

#define KV_FMT_F32 0
#define KV_FMT_F16 1
#define KV_FMT_E4M3 2
#define KV_FMT_E5M2 3

/* Eight 16-bit lanes holding e4m3fn codes as binary16 bit patterns of 2^-8 their value. */
static inline __m128i e4m3_half_bits(__m128i b) {
    const __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7);
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    return _mm_or_si128(mag, sign);
}

/* 8 e4m3fn codes at p as 8 floats. */
static inline __m256 load8_e4m3(const uint8_t *p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_mul_ps(_mm256_cvtph_ps(e4m3_half_bits(b)), _mm256_set1_ps(256.0f));
}

/* 8 e5m2 codes at p as 8 floats. */
static inline __m256 load8_e5m2(const uint8_t *p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
}

/* 16 codes at p as 16 floats (AVX-512). */
static __attribute__((target("avx512f"), always_inline)) inline __m512
load16_e4m3(const uint8_t *p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(mag, sign)), _mm512_set1_ps(256.0f));
}

static __attribute__((target("avx512f"), always_inline)) inline __m512
load16_e5m2(const uint8_t *p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(b, 8));
}

/* One code as a float. */
static inline float e4m3_to_f32(uint8_t b) {
    return _cvtsh_ss((uint16_t)(((b & 0x7F) << 7) | ((b & 0x80) << 8))) * 256.0f;
}

static inline float e5m2_to_f32(uint8_t b) { return _cvtsh_ss((uint16_t)(b << 8)); }

#endif
