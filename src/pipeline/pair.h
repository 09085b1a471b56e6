/* The pair runner: runs the bodies of a schedule's overlapped F/B pair (ts_action.overlap,
 * DualPipe's overlapped forward-backward) as two cooperating threads that hold one baton,
 * so that one body's expert all-to-all travels while the other body computes.
 *
 * The calling thread (the engine's) runs the first body; a worker thread, created once
 * per runner (per engine), runs the second. Only the baton's holder computes. Each body
 * runs with a yield hook (core/yield.h): ts_yield() hands the baton to the partner when
 * the partner has not finished, and blocks until it comes back; a body that returns hands
 * the baton over for good (the partner's later yields return at once). The first body
 * holds the baton when the pair starts, so the second starts at the first body's first
 * yield (or when it returns). ts_pair_run returns when both have returned.
 *
 * Why the order of network calls is fixed by the program, never by timing. At every
 * moment exactly one of the two threads holds the baton and the other is blocked on the
 * condition variable (or not started, or finished); the baton moves only at a ts_yield()
 * of the holder or at its return, never because of time or a message's arrival. So the
 * sequence of code the two bodies run is one interleaving, fixed by where each body's
 * yields are: body 1 to its 1st yield, body 2 to its 1st yield, body 1 to its 2nd, ...,
 * and once one returns, the rest of the other. Both ranks of an ep group run the same
 * pair (the same schedule position) with yields at the same places (the same layers),
 * so they start their collectives in the same order, and every result (the same kernels
 * on the same data, the same accumulation order within each body) is the bits of the
 * sequential run whenever the two bodies share no state across a yield (the engine's
 * header comment and docs/ARCHITECTURE.md "Overlapped pairs" list what they share).
 * The baton is a mutex and a condition variable: the hand-over is a release/acquire, so
 * everything the holder wrote is visible to the next holder (plain data needs no atomics;
 * single-writer records such as the watchdog's see one writer at a time).
 *
 * Thread state. The worker runs `thread_setup` once, first (the engine's: the CPU thread
 * budget, which OpenMP keeps per thread, and the CUDA device). The yield hook is set on
 * each thread only while its body runs: outside a pair ts_yield() returns at once.
 *
 * Errors. A body returns a ts_status; its message (core/error.c's, per thread) is the
 * worker's own, so the runner copies the second body's message to the calling thread.
 * ts_pair_run returns the first failure in program order (the first body's, else the
 * second's) with its message on the calling thread; a failed body counts as finished
 * (it hands the baton over for good), so the other still runs to its end. */
#ifndef TS_PIPELINE_PAIR_H
#define TS_PIPELINE_PAIR_H

#include <pthread.h>
#include <stdbool.h>

#include "core/error.h"

/* One action's body: what it computes between its pre-work and its post-work. */
typedef ts_status (*ts_pair_body)(void *ctx);

/* Called by the thread holding the baton as it gives it up (at a yield or its body's
 * return) for the segment it computed: side 0 (first body) or 1, its start and end in
 * ts_now_ms() milliseconds. The engine traces the segments. NULL: not wanted. */
typedef void (*ts_pair_segment_fn)(void *ctx, int side, double t0_ms, double t1_ms);

typedef struct ts_pair ts_pair;

/* One side's yield hook context. */
typedef struct {
    ts_pair *p;
    int side;
} ts_pair_side;

struct ts_pair {
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;                   /* ts_pair_free: the worker leaves */
    bool ready;                  /* the worker has run thread_setup */
    void (*thread_setup)(void *ctx);
    void *setup_ctx;
    /* The pair under way (guarded by mu). */
    bool submitted;              /* a pair is running (the worker may start side 1) */
    int holder;                  /* 0: the first body's thread, 1: the worker's */
    bool done[2];
    ts_status status[2];
    ts_pair_body body[2];
    void *ctx[2];
    ts_pair_side side[2];
    double seg_t0[2];            /* the start of each side's current segment */
    char *message;               /* [TS_ERROR_MAX] the second body's error message */
    ts_pair_segment_fn segment;
    void *segment_ctx;
    /* Counters of the last pair (tests, logs): baton hand-overs and segments per side. */
    int n_handoffs;
    int n_segments[2];
};

/* Start the worker thread. thread_setup (may be NULL) runs once on it, before any body
 * and before ts_pair_init returns (the caller waits: the setup may read what the caller
 * set up).
 * Errors: the thread could not be created (the message names pthread_create's error). */
ts_status ts_pair_init(ts_pair *p, void (*thread_setup)(void *ctx), void *setup_ctx);
/* Stop and join the worker (no pair may be running). */
void ts_pair_free(ts_pair *p);

/* Run first(first_ctx) on this thread and second(second_ctx) on the worker, one baton
 * between them (the header's rules). Returns when both have returned: TS_OK, or the
 * first failure in program order with its message on this thread. */
ts_status ts_pair_run(ts_pair *p, ts_pair_body first, void *first_ctx, ts_pair_body second,
                      void *second_ctx);

#endif
