/* Weighted blending of datasets by Megatron-LM's rule (megatron/core/datasets/
 * helpers.cpp, build_blending_indices): global sample g goes to the dataset d that
 * maximises weight_d * max(g, 1) - count_d (ties: the lowest d), and is that dataset's
 * sample count_d, after which count_d grows by one. Deterministic, so every rank
 * computes the same assignment, and the realised share of each dataset stays within
 * about one sample of its weight at every g (its deficits weight * g - count reach 1.5
 * but not 2 in tests of up to 16 datasets; above 1, the counts at g are not a rounding
 * of weight * g, and no closed form gives them: the rule is a piecewise translation of
 * the deficits). A cursor walks g forwards; a resume restores the cursor a checkpoint
 * recorded (ts_blend_restore: O(datasets)); going back, or a checkpoint that recorded
 * none, replays from 0 (O(g x datasets): 8 s at 3.2e8 sequences of 16 datasets). */
#ifndef TS_BLEND_H
#define TS_BLEND_H

#include <stdbool.h>
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

/* The normalised weights of n positive finite weights into out[n]: weight / sum (as
 * Megatron, bit for bit), or, when the sum overflows, each scaled by the largest first;
 * what ts_blend_init keeps and a checkpoint records. */
void ts_blend_normalise(int n, const double *weights, double *out);

/* Set the cursor to sample g with counts[n] samples of each dataset before it (the
 * cursor a checkpoint recorded), without replaying. False (the cursor unchanged) when
 * the counts cannot be this blend's at g: they do not sum to g, or one is further from
 * weight * g than the rule ever lets it drift. */
bool ts_blend_restore(ts_blend *b, uint64_t g, const uint64_t *counts);

/* Move the cursor to sample g (replaying from 0 if g is behind it). */
void ts_blend_seek(ts_blend *b, uint64_t g);

/* Sample b->g's dataset and its sample number within it; the cursor moves on. */
void ts_blend_next(ts_blend *b, int *dataset, uint64_t *sample);

#endif
