/* What the CPU benchmarks share: deterministic inputs. */
#ifndef TS_BENCH_UTIL_H
#define TS_BENCH_UTIL_H

#include <stddef.h>

#include "core/error.h"

/* n floats uniform in [-scale/2, scale/2) from a 32-bit LCG started at seed: the same
 * inputs on every run and machine, so before/after timings see the same data. */
static inline float *bench_random_floats(size_t n, float scale, unsigned seed)
{
    float *x = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = scale * ((float)(seed >> 8) / 16777216.0f - 0.5f);
    }
    return x;
}

#endif
