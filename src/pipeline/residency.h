/* ZeRO-2/3 across the pipeline: when each of a rank's chunks holds its gathered weights
 * (ZeRO-3) and its full-size gradient buffer (ZeRO-2 and 3), derived from the rank's
 * action list once, as the one rule the engine follows, the memory model counts and the
 * planner prices (torch's pipelining lowering adds UNSHARD/RESHARD and REDUCE_GRAD from
 * its schedule the same way).
 *
 * Weights (ZeRO-3). An action on chunk c uses c's weights; the head's actions also use
 * the embedding's chunk when the tied head reads the embedding's own tensor (both on one
 * rank). Each chunk has a forward phase (its first to its last forward-use) and a
 * backward phase (first to last B, I or W use). The weights are gathered before the
 * phase's first action and freed after its last; two phases that overlap or follow each
 * other with no action between are one residency. So looped-bfs gathers each chunk
 * twice a step (the last chunk once: its backward follows its forwards), 1F1B once (the
 * phases overlap), and the count is what the schedule implies in general.
 * Prefetch: the residencies in order of their first action; residency k's gather is
 * issued right after residency k-1's has been waited for (before k-1's first action),
 * so one gather is always in flight while a chunk computes (the first at the start of
 * the step).
 *
 * Gradients (ZeRO-2 and 3). Chunk c's gradient buffer (its floats of the rank's layout,
 * zeroed) is allocated before the first backward action using it; micro-batches
 * accumulate into it; its buckets are reduce-scattered as the chunk's last backward
 * makes them final, into the rank's persistent shard. It is freed, after waiting for
 * those reductions, just before the second gradient buffer allocated after its last
 * backward (so its reduction runs behind a whole chunk's backward), or at the end of the
 * step. A buffer holding a group-summed tensor (the tied embedding over the embedding
 * group, replicated key/value weights) waits for the end of the step, where the group
 * sums run. */
#ifndef TS_PIPELINE_RESIDENCY_H
#define TS_PIPELINE_RESIDENCY_H

#include <stdbool.h>

#include "pipeline/schedule.h"

/* One residency of a chunk's gathered weights: actions [first, last] of the rank. */
typedef struct {
    int chunk;
    int first, last;
    int issue;         /* the gather is issued before action `issue` (<= first) */
} ts_residency_span;

typedef struct {
    int n_actions;          /* of the rank */
    int n_chunks;
    /* Weights: spans ascending by first action (ties by chunk). */
    int n_spans;
    ts_residency_span *spans;
    int *gathers;           /* [n_chunks]: weight gathers per step (0: not on the rank) */
    /* Gradients, per chunk ([n_chunks], -1 for chunks not on the rank): allocated before
     * action grad_alloc[c], freed before action grad_free[c] (n_actions: at the end of
     * the step, after the group sums). */
    int *grad_alloc, *grad_free;
    int *grad_last;         /* the chunk's last backward-use action */
} ts_residency;

/* The rule above for pipeline rank `rank` of schedule s. tied_chunk: the chunk whose
 * weights and gradients the head chunk (n_chunks - 1) also uses (the embedding's, 0,
 * when the head reads the embedding's tensor on the same rank), or -1. held_to_end
 * ([n_chunks] or NULL): chunks whose gradient buffer waits for the step's end. */
void ts_residency_build(const ts_schedule *s, int rank, int tied_chunk, const bool *held_to_end,
                        ts_residency *r);
void ts_residency_free(ts_residency *r);

/* The most bytes alive at once over the step when chunk c's weight buffer takes
 * param_bytes[c] while resident (NULL: no weight buffers, ZeRO-2) and its gradient buffer
 * grad_bytes[c] while allocated ([n_chunks]). Counted at each action after its
 * allocations, as the engine allocates (frees before allocations before an action; weight
 * buffers freed after it). */
double ts_residency_peak_bytes(const ts_residency *r, const double *param_bytes,
                               const double *grad_bytes);

/* Which chunk the head's actions also use (ts_residency_build's tied_chunk): the
 * embedding's chunk 0 when the model is tied and the schedule places the head with it. */
int ts_residency_tied_chunk(const ts_schedule *s, bool tied);

#endif
