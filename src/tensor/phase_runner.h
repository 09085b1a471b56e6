/* Sub-pipelined tensor parallelism's runner (parallel.tp_overlap = S, Merak; tensor/tp.h).
 *
 * A layer that communicates inside (a transformer block: a norm's rows gathered, a
 * row-parallel linear's sum) is written as a list of steps over ONE sub-batch, each step
 * ending where a collective leaves the rank. The runner runs step j on every sub-batch in
 * turn before step j+1: the collective sub-batch i's step j starts (on the pending it is
 * given) runs behind the other sub-batches' step j, and is finished just before step j+1
 * of sub-batch i; whatever is still in flight after the last step is finished before the
 * runner returns. Between sub-batches it polls every collective in flight (MPI advances
 * non-blocking collectives only inside its calls; this rank's thread is busy in its
 * GEMMs otherwise).
 *
 * With S = 1 the runner is a plain call of each step in order with a NULL pending: every
 * collective blocks, and the order of operations is the unpipelined one. */
#ifndef TS_PHASE_RUNNER_H
#define TS_PHASE_RUNNER_H

#include "tensor/tp.h"

/* The most sub-batches parallel.tp_overlap takes (config_keys.c). */
#define TS_TP_OVERLAP_MAX 8

/* One step on sub-batch `sub` (0 <= sub < S) of what ctx describes; `pending` is where
 * it starts its collective (NULL: run it blocking). A step starts at most one. */
typedef void (*ts_phase_step)(void *ctx, int sub, ts_tp_pending *pending);

/* steps[0 .. n_steps) over S sub-batches (1 <= S <= TS_TP_OVERLAP_MAX), the collectives
 * on tp's group, as described above. */
void ts_phase_run(const ts_tp *tp, int S, const ts_phase_step *steps, int n_steps, void *ctx);

#endif
