/* Helpers for the CUDA tests of the bf16 tables: bf16 values on the host (rounding as
 * the device does), bf16 device buffers filled from floats or poisoned with NaN, and a
 * bf16 device result against an fp32 reference. Header-only, for tests/test_cuda_*.c;
 * the memory goes through the table under test (its dev_alloc and copies). */
#ifndef TS_TEST_GPU_BF16_H
#define TS_TEST_GPU_BF16_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "test_util.h"

/* x's bf16 bits, rounded to nearest even (what __float2bfloat16_rn does on the device);
 * a NaN stays a NaN (the quiet bit set, so truncating its payload cannot make it inf). */
static inline uint16_t ts_bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ts_bf16_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to bf16, as a float. */
static inline float ts_bf16_round(float x) { return ts_bf16_float(ts_bf16_bits(x)); }

/* x[0..n) rounded to bf16 in place: inputs both precisions can hold exactly, so a bf16
 * kernel and the fp32 reference start from the same values. */
static inline void ts_bf16_round_all(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = ts_bf16_round(x[i]);
}

/* h[0..n) as bf16 in k's memory (at least one element, so n = 0 still has a pointer). */
static inline void *ts_bf16_to_dev(const ts_kernels *k, const float *h, size_t n)
{
    size_t m = n ? n : 1;
    uint16_t *b = ts_malloc(m * sizeof(uint16_t));
    for (size_t i = 0; i < m; i++) b[i] = i < n ? ts_bf16_bits(h[i]) : 0;
    void *d = k->dev_alloc(m * sizeof(uint16_t));
    k->memcpy_h2d(d, b, m * sizeof(uint16_t));
    free(b);
    return d;
}

/* `bytes` of k's memory with every byte 0xff: NaN as fp32 and as bf16, so an element a
 * kernel fails to write (or scratch it reads before writing) shows in either type. */
static inline void *ts_gpu_dev_poison(const ts_kernels *k, size_t bytes)
{
    if (bytes == 0) bytes = 4;
    unsigned char *h = ts_malloc(bytes);
    memset(h, 0xff, bytes);
    void *d = k->dev_alloc(bytes);
    k->memcpy_h2d(d, h, bytes);
    free(h);
    return d;
}

/* n bf16 values of k's memory as host floats (free them with free). */
static inline float *ts_bf16_from_dev(const ts_kernels *k, const void *d, size_t n)
{
    uint16_t *b = ts_malloc((n ? n : 1) * sizeof(uint16_t));
    k->memcpy_d2h(b, d, n * sizeof(uint16_t));
    float *x = ts_alloc_floats(n ? n : 1);
    for (size_t i = 0; i < n; i++) x[i] = ts_bf16_float(b[i]);
    free(b);
    return x;
}

/* k's bf16 d[0..n) against the fp32 reference want[0..n). */
static inline void ts_bf16_expect_close(const ts_kernels *k, const char *who, const char *what,
                                        const void *d, const float *want, size_t n, double tol,
                                        double floor_frac)
{
    float *got = ts_bf16_from_dev(k, d, n);
    ts_test_expect_close(who, what, k->name, got, want, n, tol, floor_frac);
    free(got);
}

/* Whether two device buffers of k hold the same `bytes`. */
static inline int ts_gpu_dev_same_bytes(const ts_kernels *k, const void *a, const void *b,
                                        size_t bytes)
{
    unsigned char *ha = ts_malloc(bytes ? bytes : 1), *hb = ts_malloc(bytes ? bytes : 1);
    k->memcpy_d2h(ha, a, bytes);
    k->memcpy_d2h(hb, b, bytes);
    int same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

#endif
