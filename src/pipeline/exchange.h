/* Pipeline exchanges as data: for every pipeline rank, the ordered program of grouped
 * point-to-point sends and receives that carries a schedule's activations and gradients
 * between ranks, with no message tags. It runs on backends that match messages by order
 * only and complete a send only when the peer has posted the receive (NCCL), as well as
 * on MPI (one tag: MPI keeps the order of messages between two ranks).
 *
 * The program of rank r is n_actions[r] + 1 steps. Step k is a GROUP of ops issued
 * together (ncclGroupStart/End, or MPI isend/irecv + waitall), then, once every op of
 * the group has completed, the compute action k of the rank's schedule list; the last
 * step (action -1) carries only the sends of the rank's last actions. Empty groups are
 * no-ops.
 *
 * Transfers (schedule.h's dependencies, only between different ranks):
 *   TS_XCHG_ACT  the output of F(c-1, i) to the rank of F(c, i): op.chunk = c
 *   TS_XCHG_GRAD the input gradient of B/I(c+1, i) to the rank of B/I(c, i): op.chunk = c
 * An op names the chunk whose action CONSUMES the message, the same on both sides.
 *
 * Guarantees of ts_xchg_build (checked by ts_xchg_validate before it returns):
 *   - complete: every cross-rank transfer is one send on the producing rank and one
 *     receive on the consuming rank; nothing else;
 *   - in time: a receive sits in the group right before the action that consumes it
 *     (as late as possible) -- or, for the second action of an overlapped pair
 *     (ts_action.overlap), before the pair's first action, so that on a backend with a
 *     communication stream the message moves while the first computes (kept only where
 *     the rendezvous replay below still passes); a send in a group after the action that produces it, and
 *     the output of F(c, i) before the sender's own B/I(c, i) (which needs the gradient
 *     that answers it), so the activations it is read from are still held;
 *   - matched: for every ordered pair of ranks (a, b), a's sends to b and b's receives
 *     from a list the same messages in the same order (program order: step by step,
 *     ops in array order within a step);
 *   - deadlock-free under rendezvous: a replay of all ranks where a group completes
 *     only once the peer has posted the matching op of each of its ops (in its current
 *     or an earlier group), and actions run when reached, brings every rank to its end.
 * Why the construction cannot deadlock is explained at the top of exchange.c. */
#ifndef TS_EXCHANGE_H
#define TS_EXCHANGE_H

#include <stddef.h>

#include "core/error.h"
#include "pipeline/schedule.h"

typedef enum { TS_XCHG_SEND, TS_XCHG_RECV } ts_xchg_kind;
typedef enum { TS_XCHG_ACT, TS_XCHG_GRAD } ts_xchg_dir;

typedef struct {
    ts_xchg_kind kind;
    ts_xchg_dir dir;
    int peer;  /* the other pipeline rank */
    int chunk; /* the consuming chunk: F(chunk, mb) for ACT, B/I(chunk, mb) for GRAD */
    int mb;
} ts_xchg_op;

typedef struct {
    int n_ops;
    ts_xchg_op *ops; /* [n_ops], issued as one group; points into ts_xchg.ops[r] */
    int action;      /* index into the schedule's actions[r] run after the group, or -1 */
} ts_xchg_step;

typedef struct {
    int pp;
    int *n_steps;         /* [pp]: n_actions[r] + 1 */
    ts_xchg_step **steps; /* [pp][n_steps[r]]; steps[r][k].action = k, the last -1 */
    int *n_ops;           /* [pp]: ops of rank r */
    ts_xchg_op **ops;     /* [pp][n_ops[r]]: the rank's ops in issue order */
} ts_xchg;

/* Build the exchange program of a validated schedule (ts_schedule_build's result, or
 * one that passed ts_schedule_validate) and validate it; pp = 1 gives no ops. On error
 * *x is left empty (ts_xchg_free is still safe). */
ts_status ts_xchg_build(ts_xchg *x, const ts_schedule *s);
void ts_xchg_free(ts_xchg *x);

/* Check a program against its schedule: shape, completeness and timing of every op,
 * pairwise order, and the rendezvous replay (see above). Messages name the rank, the
 * step (numbered from 0) and the op: "mismatch: ..." when two ranks disagree on the
 * order of their messages, "exchange deadlocks: ..." when the replay gets stuck. */
ts_status ts_xchg_validate(const ts_xchg *x, const ts_schedule *s);

/* Ops over all ranks (each transfer counts twice: its send and its receive). */
int ts_xchg_total_ops(const ts_xchg *x);

/* One op as messages print it, "send act(c1,mb2)->1" / "recv grad(c0,mb0)<-1", into
 * buf; returns buf. */
const char *ts_xchg_op_str(char *buf, size_t size, const ts_xchg_op *op);

#endif
