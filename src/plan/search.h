/* The grid search: every valid grid for N devices, predicted and ranked by step time
 * among those that fit in memory.
 *
 * Valid grids: pp * dp * cp * tp = N; tp divides n_head and the MLP width (ts_model_ffn),
 * and for llama n_kv_head or a multiple of it (a tp group larger than a node, or
 * not dividing devices_per_node, is allowed and pays the inter-node link); cp a power
 * of two (1, 2, 4, ...) with seq_len % 2cp == 0 (sequence parallelism then needs
 * (seq_len / cp) % tp == 0; ZeRO 1 to 3 wherever dp * cp > 1); dp divides
 * train.global_batch; pp * v chunks of at least one layer (embedding, n_layer blocks,
 * head); micro_batch divides global_batch / dp; every built-in schedule with the v it
 * runs (gpipe, 1f1b, zb-h1, zb-h2: v = 1; zb-v, dualpipe-v: v = 2, the V placement;
 * interleaved-1f1b, looped-bfs, interleaved-zb: v >= 2) where it accepts the number of
 * micro-batches; pp = 1 runs 1f1b only (the schedules coincide); recompute none, full,
 * and auto where none does not fit; ZeRO 0 to 3 (1 to 3 only with dp > 1); sequence
 * parallelism off, and on where tp > 1 divides seq_len; for an MoE model every expert grid
 * (ep, etp) the trainer accepts on the stage (ep dividing moe_experts, etp dividing
 * moe_ffn_hidden, ep * etp dividing tp * cp * dp) (sequence parallelism ranked like the rest: it wins
 * where its smaller activations let a grid fit or recompute less, and loses its
 * backward's extra gathers elsewhere).
 *
 * Phases: the grids with cp = 1 are gathered and ranked first (an MoE model's with the
 * expert grid of least work floor only); then each context-parallel (pp, dp, cp, tp,
 * micro_batch) shape, with each of its expert grids, and each expert grid the first phase
 * left, whose work floor (ts_plan_work_floor, sp on or off) exceeds the K-th best step
 * found is skipped whole (bound_cp; exact: none of its candidates could enter the top K),
 * and the rest join the same top list. With
 * `exhaustive` nothing is skipped.
 *
 * Memory: a shape whose memory floor (ts_plan_shape_memory_floor, the least of its sp
 * choices) exceeds the device and is no lower than the closest out-of-memory and the
 * lightest totals found so far has its candidates counted out of memory unestimated
 * (exact: none fits, none can become either; counted when their estimates would run), so
 * with `exhaustive` too.
 *
 * Shortcut: memory first (no simulation for a grid that does not fit); then every grid
 * that fits gets a lower bound of its step (ts_plan_result.lower_ms, exact work plus the
 * first micro-batch's arrival) and grids are simulated in increasing bound order until
 * the next bound exceeds the K-th best simulated step: the top K are exactly those an
 * exhaustive search finds (`exhaustive` simulates every grid that fits, for tests).
 * recompute = "auto" grids are bounded by their none grid's bound (auto recomputes no
 * less) and estimated (their caps fitted into memory: the costly part) only when that
 * bound comes up unpruned; they fit wherever full does, so they count as fitting.
 * Grids never simulated are classified by their work and the textbook bubble of their
 * schedule: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v*m+p-1) interleaved-1f1b and
 * looped-bfs, (p-1)/(3m+p-1) zb-h1 and zb-h2, (p-1)/(3vm+p-1) interleaved-zb, zb-v and
 * dualpipe-v (F = I = W; the zero-bubble ones from m >= 2p-1, dualpipe-v m >= 2p). */
#ifndef TS_PLAN_SEARCH_H
#define TS_PLAN_SEARCH_H

#include <stdbool.h>

#include "plan/predict.h"


/* Why a grid that fits loses to the best: the term of its step that exceeds the best's
 * the most. */
typedef enum {
    TS_LOSS_BUBBLE,
    TS_LOSS_COMMUNICATION, /* tp all-reduces, exposed dp reduction */
    TS_LOSS_RECOMPUTE,
    TS_LOSS_COMPUTE,       /* slower GEMMs (small shapes), more work per device */
    TS_LOSS_OPTIMIZER,     /* optimizer and ZeRO-1 all-gather */
    TS_N_LOSSES
} ts_loss_reason;
extern const char *const ts_loss_names[TS_N_LOSSES];

typedef struct {
    int gpus, top;
    bool exhaustive;
} ts_search_opts;

typedef struct {
    int n_grids;                 /* (pp, dp, cp, tp) grids */
    long long candidates;        /* with schedule, v, micro_batch, recompute, zero, sp
                                    (bound_cp's shapes not counted) */
    long long fit, simulated;
    ts_plan_result *top;         /* [n_top] best first */
    int n_top;
    long long oom;               /* candidates over the device memory */
    ts_plan_result oom_closest;  /* the one over by the least */
    long long lost[TS_N_LOSSES]; /* fitting candidates outside the top, by reason */
    long long unestimated;       /* recompute auto candidates (they fit: full does) whose
                                    bound kept them out before their memory was fitted,
                                    so without a reason (0 with exhaustive) */
    long long bound_cp;          /* context-parallel (pp, dp, cp, tp, micro_batch) shapes
                                    (an MoE model's: and expert grids of any shape)
                                    skipped whole: their work floor exceeds the K-th best
                                    step of the grids searched before them (0 with
                                    exhaustive) */
    ts_plan_result smallest;     /* the candidate needing the least memory */
} ts_search_result;

/* Search. Errors (clear, naming what to change): no valid grid for N devices (with the
 * nearest device counts that have one), N smaller than one model replica needs (with
 * the minimum), a model that fits nowhere (with the smallest memory per device it
 * would need). */
ts_status ts_plan_search(ts_plan_ctx *x, const ts_search_opts *o, ts_search_result *r);
void ts_search_result_free(ts_search_result *r);

/* The textbook bubble of a grid's schedule (uniform chunks, free communication). */
double ts_plan_textbook_bubble(const ts_plan_grid *g);

/* Why `r` loses to `best`. */
ts_loss_reason ts_plan_loss_reason(const ts_plan_result *r, const ts_plan_result *best);

#endif
