/* Weighted blending of datasets by Megatron-LM's rule (megatron/core/datasets/
 * helpers.cpp, build_blending_indices): global sample g goes to the dataset d that
 * maximises weight_d * max(g, 1) - count_d (ties: the lowest d), and is that dataset's
 * sample count_d, after which count_d grows by one. Deterministic, so every rank
 * computes the same assignment, and the realised share of each dataset stays within
 * about one sample of its weight at every g. A cursor walks g forwards; going back
 * replays from 0 (O(g x datasets), which a resume does once). */
#ifndef TS_BLEND_H
#define TS_BLEND_H

#include <stdint.h>

#define TS_MAX_DATASETS 16

typedef struct {
    int n;                              /* datasets */
    double weight[TS_MAX_DATASETS];     /* normalised: they sum to 1 */
    uint64_t g;                         /* the next sample the cursor assigns */
    uint64_t count[TS_MAX_DATASETS];    /* samples of each dataset among 0 .. g-1 */
} ts_blend;

/* n datasets (1 <= n <= TS_MAX_DATASETS) with positive weights, normalised here. */
void ts_blend_init(ts_blend *b, int n, const double *weights);

/* Move the cursor to sample g (replaying from 0 if g is behind it). */
void ts_blend_seek(ts_blend *b, uint64_t g);

/* Sample b->g's dataset and its sample number within it; the cursor moves on. */
void ts_blend_next(ts_blend *b, int *dataset, uint64_t *sample);

#endif
