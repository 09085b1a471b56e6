/* Megatron-LM's blending rule (blend.h), in the same double arithmetic as its
 * helpers.cpp so that a blend assigns samples as Megatron's does. */
#include "dataset/blend.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

void ts_blend_normalise(int n, const double *weights, double *out)
{
    TS_ASSERT(n >= 1 && n <= TS_MAX_DATASETS);
    double sum = 0.0, max = 0.0;
    for (int d = 0; d < n; d++) {
        TS_ASSERT(weights[d] > 0.0 && isfinite(weights[d]));
        sum += weights[d];
        max = weights[d] > max ? weights[d] : max;
    }
    /* weight / sum as Megatron divides, bit for bit (the rule's ties depend on the last
     * bit, and checkpoints record these values); only a sum past DBL_MAX (two weights of
     * 1e308: each finite) is taken over the weights scaled by the largest first, whose
     * sum is at most n, rather than dividing by infinity into zeros (probe D10). */
    if (isfinite(sum)) {
        for (int d = 0; d < n; d++) out[d] = weights[d] / sum;
        return;
    }
    double scaled[TS_MAX_DATASETS];
    sum = 0.0;
    for (int d = 0; d < n; d++) sum += scaled[d] = weights[d] / max;
    for (int d = 0; d < n; d++) out[d] = scaled[d] / sum;
}

void ts_blend_init(ts_blend *b, int n, const double *weights)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    ts_blend_normalise(n, weights, b->weight);
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

bool ts_blend_restore(ts_blend *b, uint64_t g, const uint64_t *counts)
{
    uint64_t sum = 0;
    for (int d = 0; d < b->n; d++) {
        if (counts[d] > g - sum) return false; /* the sum would pass g (or wrap) */
        sum += counts[d];
        /* Megatron's rule keeps every count within a few samples of weight * g (its
         * deficits stay below 2 in practice; n is a generous bound): a count far off
         * was not written by this rule. */
        const double off = b->weight[d] * (double)g - (double)counts[d];
        if (!(fabs(off) <= (double)b->n + 1.0)) return false;
    }
    if (sum != g) return false;
    b->g = g;
    memcpy(b->count, counts, (size_t)b->n * sizeof *counts);
    return true;
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
