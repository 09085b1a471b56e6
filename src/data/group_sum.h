/* Gradients summed over a group other than the replicas before the optimizer reads them
 * (a "group sum"):
 *  - the tied embedding split over the pipeline (pp > 1: wte on the first stage, its
 *    copy in the head on the last), summed over the embedding group so the two stages
 *    hold the same gradient and take the same update;
 *  - llama's key/value projections replicated on kv_replicas tensor-parallel ranks (tp >
 *    n_kv_head), summed over the kv group (the tp ranks holding the same key/value head):
 *    each replica computed its query heads' part of the gradient.
 * The reducer (data/reducer.h) runs them at the end of the step; ZeRO-1..3 make each such
 * tensor a bucket of its own, reduced after its sum (the stages' buffers are laid out
 * differently, so their pieces would not line up otherwise). */
#ifndef TS_GROUP_SUM_H
#define TS_GROUP_SUM_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/comm.h"
#include "model/model.h"

typedef struct {
    int param;
    size_t offset, numel;  /* its floats in the gradient layout */
    const ts_comm *group;  /* the embedding or the kv group (the topology's) */
} ts_group_sum;

typedef struct {
    const ts_model *model;
    int n;
    ts_group_sum *sums;    /* [n], in parameter order of discovery */
} ts_group_sums;

/* The sums this rank's part of the model needs: embed is the embedding group (a
 * non-member or a group of one when pp == 1), kv the tp ranks holding the same key/value
 * heads; both held by pointer. */
void ts_group_sums_init(ts_group_sums *s, const ts_model *m, const ts_comm *embed,
                        const ts_comm *kv);
void ts_group_sums_free(ts_group_sums *s);
/* Whether parameter p is summed over a group (NULL s: none is). */
bool ts_group_sums_has(const ts_group_sums *s, int p);
/* Run every sum, blocking (the model's gradient views; running non-blocking reductions
 * make progress meanwhile). Returns the time they took. */
double ts_group_sums_run(const ts_group_sums *s);

#endif
