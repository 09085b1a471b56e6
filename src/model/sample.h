/* Drawing the next token from a model's logits, as nanoGPT's generate does: divide the
 * last position's logits by the temperature, keep the top k, softmax (in double) and
 * draw. Draw i of a sampler uses the counter-based RNG (core/rng.h) at (seed, i), so the
 * same seed gives the same tokens on any machine. */
#ifndef TS_SAMPLE_H
#define TS_SAMPLE_H

#include <stdint.h>

typedef struct {
    int vocab;
    double temperature; /* > 0; 0 = greedy (the argmax) */
    int top_k;          /* keep the k largest logits (ties with the k-th kept); 0 = all,
                         * 1 = greedy; k > vocab = all */
    uint64_t seed;
    uint64_t draws;     /* draws made so far: the next draw's counter */
    double *work;       /* [vocab] scratch, owned */
} ts_sampler;

void ts_sampler_init(ts_sampler *s, int vocab, double temperature, int top_k, uint64_t seed);
void ts_sampler_free(ts_sampler *s);

/* The next token drawn from logits[vocab]. Greedy (temperature 0 or top_k 1) returns the
 * first index of the largest logit and draws no random number. Returns -1 when a logit
 * is not finite (a diverged model): nothing sensible can be drawn. */
int ts_sampler_next(ts_sampler *s, const float *logits);

/* The uniform in [0, 1) of draw `index` for `seed` (53 bits). */
double ts_sample_uniform(uint64_t seed, uint64_t index);

#endif
