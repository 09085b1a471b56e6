/* Megatron-LM's blending rule (blend.h), in the same double arithmetic as its
 * helpers.cpp so that a blend assigns samples as Megatron's does. */
#include "dataset/blend.h"

#include <string.h>

#include "core/error.h"

void ts_blend_init(ts_blend *b, int n, const double *weights)
{
    TS_ASSERT(n >= 1 && n <= TS_MAX_DATASETS);
    memset(b, 0, sizeof *b);
    b->n = n;
    double sum = 0.0;
    for (int d = 0; d < n; d++) {
        TS_ASSERT(weights[d] > 0.0);
        sum += weights[d];
    }
    for (int d = 0; d < n; d++) b->weight[d] = weights[d] / sum;
}

/* weight * at - count with the product rounded on its own, as in helpers.cpp: a fused
 * multiply-add (which -march=native and gnu11's fp-contract would emit) rounds once and
 * breaks the ties the rule depends on (0.3 * 3 - 1 is 0 only when rounded). The
 * volatile store keeps the compiler from fusing, on every machine alike. */
static double error_of(double weight, double at, uint64_t count)
{
    volatile double product = weight * at;
    return product - (double)count;
}

void ts_blend_next(ts_blend *b, int *dataset, uint64_t *sample)
{
    const double at = b->g > 1 ? (double)b->g : 1.0;
    int best = 0;
    double best_err = error_of(b->weight[0], at, b->count[0]);
    for (int d = 1; d < b->n; d++) {
        const double err = error_of(b->weight[d], at, b->count[d]);
        if (err > best_err) { /* strictly greater: a tie keeps the lower dataset */
            best_err = err;
            best = d;
        }
    }
    *dataset = best;
    *sample = b->count[best]++;
    b->g++;
}

void ts_blend_seek(ts_blend *b, uint64_t g)
{
    if (g < b->g) {
        b->g = 0;
        memset(b->count, 0, sizeof b->count);
    }
    if (b->n == 1) { /* one dataset: sample g is its sample g */
        b->count[0] = g;
        b->g = g;
        return;
    }
    int d;
    uint64_t j;
    while (b->g < g) ts_blend_next(b, &d, &j);
}
