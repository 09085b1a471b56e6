#include "model/sample.h"

#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/rng.h"

void ts_sampler_init(ts_sampler *s, int vocab, double temperature, int top_k, uint64_t seed)
{
    TS_ASSERT(vocab > 0 && temperature >= 0.0 && top_k >= 0);
    s->vocab = vocab;
    s->temperature = temperature;
    s->top_k = top_k;
    s->seed = seed;
    s->draws = 0;
    s->work = ts_malloc((size_t)vocab * sizeof *s->work);
}

void ts_sampler_free(ts_sampler *s)
{
    free(s->work);
    s->work = NULL;
}

double ts_sample_uniform(uint64_t seed, uint64_t index)
{
    uint64_t h = ts_rng_mix64(seed ^ ts_rng_mix64(ts_rng_name_key("sample") ^ ts_rng_mix64(index)));
    return (double)(h >> 11) * 0x1.0p-53;
}

static int cmp_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int ts_sampler_next(ts_sampler *s, const float *logits)
{
    const int V = s->vocab;
    int best = 0;
    for (int i = 0; i < V; i++) {
        if (!isfinite(logits[i])) return -1;
        if (logits[i] > logits[best]) best = i;
    }
    if (s->temperature == 0.0 || s->top_k == 1) return best;

    /* top-k: every logit below the k-th largest is dropped (nanoGPT's v[:, [-1]]). */
    double kth = -INFINITY;
    if (s->top_k > 0 && s->top_k < V) {
        for (int i = 0; i < V; i++) s->work[i] = logits[i];
        qsort(s->work, (size_t)V, sizeof *s->work, cmp_desc);
        kth = s->work[s->top_k - 1];
    }
    /* softmax(logits / T) over the kept ones, shifted by the maximum. */
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->work[i] = logits[i] >= kth
                         ? exp(((double)logits[i] - (double)logits[best]) / s->temperature)
                         : 0.0;
        sum += s->work[i];
    }
    /* Invert the cumulative distribution at u * sum; sum >= 1 (the maximum's term). */
    const double target = ts_sample_uniform(s->seed, s->draws++) * sum;
    double acc = 0.0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (s->work[i] == 0.0) continue;
        acc += s->work[i];
        last = i;
        if (target < acc) return i;
    }
    return last; /* rounding left target at the very end */
}
