/* Yield points: where a computation that has just started a non-blocking exchange (an
 * expert layer's dispatch or combine) offers the CPU to other work before it waits for
 * the exchange to complete.
 *
 * The pipeline engine runs a DualPipe-style overlapped pair (a forward of one micro-batch
 * and a backward of another, ts_action.overlap) as two cooperating threads that hold one
 * baton: only the holder computes, and ts_yield() hands the baton to the partner until it
 * yields back or finishes. So one action's all-to-all travels while the other computes,
 * and the order in which the two touch the network is fixed by the program (never by
 * timing): the ranks of an ep group, running the same pair, start their collectives in
 * the same order and every result is bit-identical to the blocking run.
 *
 * The hook is per thread: a thread with none set (every thread outside a pair) returns
 * at once, so the layers call ts_yield() unconditionally. Any state a caller holds across
 * a ts_yield() must be its own (its stack, its micro-batch's activations), never the
 * model's shared scratch: the partner may run any layer in between. */
#ifndef TS_CORE_YIELD_H
#define TS_CORE_YIELD_H

typedef void (*ts_yield_fn)(void *ctx);

/* Set (fn non-NULL) or clear (fn NULL) this thread's hook. */
void ts_yield_set_hook(ts_yield_fn fn, void *ctx);
/* Offer the CPU to this thread's partner, if it has one; returns when this thread may
 * compute again. */
void ts_yield(void);
/* Whether this thread has a partner to yield to (a layer may skip splitting an exchange
 * into start and wait when nothing could run in between and nothing else overlaps). */
int ts_yield_active(void);

#endif
