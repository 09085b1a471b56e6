/* The pipeline simulator: replays a schedule's action lists on a cost model.
 *
 * Each pipeline rank executes its actions strictly in list order. An action starts
 * when its rank is free and all its inputs have arrived: a dependency on another rank
 * arrives at its finish time + latency + msg_bytes / bandwidth; a dependency on the
 * same rank costs nothing. Dependencies are schedule.h's: F(c,i) <- F(c-1,i);
 * B/I(c,i) <- F(c,i), B/I(c+1,i); W(c,i) <- I(c,i). Costs: F takes f[c], I takes i[c],
 * W takes w[c] and a full B takes i[c] + w[c].
 *
 * The data-parallel gradient reduction (when dp_bytes is given): chunk c's weight
 * gradients are final after its last B (or, with split backward, its last W); its
 * reduction then costs dp_latency + dp_bytes[c] / dp_bandwidth on its rank's separate
 * "dp" lane, one reduction at a time in the order the chunks become ready, overlapping
 * the rank's later compute. With dp_pieces, a chunk's bytes are cut into that many equal
 * reductions, piece j of P ready at (j+1)/P of its last B/W (the backward finishes the
 * chunk's layers one by one, and the trainer starts each bucket when its layers are). The rank's optimizer step (or, without one, the rank's end
 * of the step) waits for its last reduction; what it waits is the exposed part.
 *
 * Overlapped pairs (ts_action.overlap: DualPipe-V's F/B pairs, which the engine runs as
 * two threads taking turns): with f_comm / i_comm given, the part of an action's cost
 * that is communication (an MoE block's all-to-all exchanges) travels while its partner
 * computes. The pair's second action then ends earlier by
 *     hidden = min(comm_a, compute_b) + min(comm_b, compute_a)
 * (compute = cost - comm), times the share of the first action's span the second could
 * run beside (all of it when its inputs were there when the first started, none when
 * they arrived after it ended). comm and comm_hidden in the result sum them per rank.
 *
 * Units are the caller's (seconds in the docs below, with latency in seconds and
 * bandwidth in bytes per second; any consistent time unit works). */
#ifndef TS_SIM_H
#define TS_SIM_H

#include "core/error.h"
#include "core/trace.h"
#include "pipeline/schedule.h"

typedef struct {
    int n_chunks;
    const double *f;         /* [n_chunks] forward time of one micro-batch */
    const double *i;         /* [n_chunks] input-gradient time */
    const double *w;         /* [n_chunks] weight-gradient time (B = i + w) */
    const double *act_bytes; /* [n_chunks] activation bytes a micro-batch holds from its F
                                until its B (or W); NULL = 0 */
    double latency;          /* per P2P message (s) */
    double bandwidth;        /* bytes/s; <= 0 means infinite (free transfers) */
    double msg_bytes;        /* activation / gradient message per micro-batch (B*T*C*4) */
    const double *optim;     /* [pp] optimizer time appended after a rank's last action
                                (NULL = none) */
    const double *dp_bytes;  /* [n_chunks] bytes each chunk's dp reduction moves; NULL = no
                                data parallelism (dp = 1) */
    double dp_latency;       /* per reduction (s) */
    double dp_bandwidth;     /* bytes/s; <= 0 means infinite */
    const int *dp_pieces;    /* [n_chunks] reductions a chunk's bytes are cut into, ready
                                one after another during its last B/W (the trainer's
                                buckets start as their layers' gradients become final);
                                NULL = one per chunk, ready at the end of that pass */
    const double *f_comm;    /* [n_chunks] of f, the communication an overlapped partner
                                hides (above); NULL = none */
    const double *i_comm;    /* [n_chunks] of i (a full B's too); NULL = none */
} ts_sim_costs;

/* ts_sim_event.kind beyond ts_action_kind's F/B/I/W: the optimizer step (chunk = mb =
 * -1) and a chunk's dp reduction (mb = -1). */
enum { TS_SIM_OPTIM = 4, TS_SIM_DP = 5 };

typedef struct {
    int rank;
    int kind;        /* ts_action_kind, TS_SIM_OPTIM or TS_SIM_DP */
    int chunk, mb;
    double start, end;
} ts_sim_event;

typedef struct {
    int pp;
    double step_time;         /* makespan (exposed dp reductions included) */
    double *busy;             /* [pp] compute (and optimizer) time per rank */
    double *bubble;           /* [pp] idle / step_time */
    double bubble_mean;       /* mean of bubble[] over ranks */
    double *peak_act_bytes;   /* [pp] most activation bytes held at once */
    int *peak_act_mb;         /* [pp] most micro-batch activations held at once */
    int n_events;
    ts_sim_event *events;     /* every action (and optimizer step), in rank, list order */

    /* The data-parallel reduction (all zero without costs.dp_bytes). */
    double *dp_busy;          /* [pp] time on the rank's dp lane (its reductions' sum) */
    double *dp_wait;          /* [pp] how long the rank waits for its reductions after
                                 its last action */
    double dp_exposed;        /* how much the reductions lengthen the step: step_time less
                                 the makespan the same run would have without them */
    int n_dp_events;
    ts_sim_event *dp_events;  /* [n_dp_events] TS_SIM_DP, per rank in lane order */

    /* Overlapped pairs (costs.f_comm, i_comm): per rank the communication its actions
     * carry, and how much of it their partners hid. */
    double *comm;             /* [pp] */
    double *comm_hidden;      /* [pp] */
} ts_sim_result;

/* Simulate. Errors: an action on the wrong rank, a duplicate or missing action, a
 * dependency on an action the schedule never runs, or a deadlock (ranks each waiting
 * for another), with the first blocked action of every rank named. */
ts_status ts_sim_run(const ts_schedule *s, const ts_sim_costs *c, ts_sim_result *r);
void ts_sim_result_free(ts_sim_result *r);

/* Append the events to a trace with times scaled by `us_per_unit` (1e6 for seconds):
 * compute spans as "F"/"B"/"I"/"W", optimizer as "optim", the gaps in which a rank
 * waited for an input (or for its dp reductions) as "wait", and the dp reductions as
 * "dpreduce" on the rank's dp track (TS_TRACE_TRACK_DP). */
void ts_sim_to_trace(const ts_sim_result *r, double us_per_unit, ts_trace *t);

#endif
