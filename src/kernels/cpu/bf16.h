/* bf16 <-> fp32 for the CPU's bf16 kernels. A bf16 is the upper 16 bits of an IEEE
 * fp32 (sign, 8 exponent bits, 7 mantissa bits), so widening is a shift and exact;
 * narrowing rounds to nearest even.
 *
 * One rounding, the same bits on every path: the AVX-512 BF16 instruction
 * (VCVTNEPS2BF16, _mm512_cvtneps_pbh) treats fp32 denormals as zero and quiets NaNs,
 * so the scalar version does too. Array tails and CPUs without the instruction then
 * give exactly what the vector loop gives; no fp32 denormal survives a bf16 store
 * (below 1.2e-38: nothing training produces that matters). */
#ifndef TS_KERNELS_CPU_BF16_H
#define TS_KERNELS_CPU_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

typedef uint16_t ts_bf16;

#define TS_BF16_QNAN ((ts_bf16)0x7fc0)

/* Exact. */
static inline float ts_bf16_to_f32(ts_bf16 h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; zero and denormals -> zero of the same sign; NaN -> a quiet
 * NaN with the same sign and top payload bits; overflow rounds to infinity. Written
 * without branches so the array fallback below vectorises. */
static inline ts_bf16 ts_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u : rounded;
    r = (u & 0x7f800000u) == 0 ? (u >> 16) & 0x8000u : r;
    return (ts_bf16)r;
}

/* The value f would have after a bf16 store and load. */
static inline float ts_bf16_round(float f) { return ts_bf16_to_f32(ts_f32_to_bf16(f)); }

/* dst[i] = src[i] widened, i < n. gcc vectorises this (a zero-extend and a shift). */
static inline void ts_bf16_to_f32_array(float *dst, const ts_bf16 *src, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) dst[i] = ts_bf16_to_f32(src[i]);
}

/* dst[i] = src[i] rounded, i < n. */
static inline void ts_f32_to_bf16_array(ts_bf16 *dst, const float *src, size_t n)
{
    size_t i = 0;
#ifdef __AVX512BF16__
    for (; i + 16 <= n; i += 16) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), (__m256i)h);
    }
    if (i < n) { /* the tail masked, so every element takes the one instruction */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16((void *)(dst + i), m, (__m256i)h);
    }
#else
    /* An OpenMP simd loop must declare its own index. */
#pragma omp simd
    for (size_t j = i; j < n; j++) dst[j] = ts_f32_to_bf16(src[j]);
#endif
}

#endif
