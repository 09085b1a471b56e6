/* The pair runner (pair.h): one baton, two threads. Invariant, under mu: while a pair
 * runs, the thread of side `holder` computes and the other is blocked in
 * pthread_cond_wait (or has not started, or has finished). Only the holder changes
 * holder, so a hand-over is always the holder's own decision at a yield or a return. */
#include "pipeline/pair.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "core/yield.h"

/* The holder `me` gives up the baton: at a yield (finishing = false; it then waits until
 * the baton comes back), or as its body returns with status st (finishing = true). At a
 * yield with the partner finished it keeps the baton and goes on: nothing to overlap. */
static void hand_over(ts_pair *p, int me, bool finishing, ts_status st)
{
    const double t1 = ts_now_ms();
    const int other = 1 - me;
    /* done[other] cannot change while we hold the baton: the partner is blocked or done. */
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    const bool give = !p->done[other];
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
    if (!give && !finishing) return; /* the segment goes on */
    /* Still the holder: the segment's record is serialized with every other one. */
    p->n_segments[me]++;
    if (p->segment) p->segment(p->segment_ctx, me, p->seg_t0[me], t1);
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    if (finishing) {
        p->done[me] = true;
        p->status[me] = st;
    }
    if (give) {
        p->holder = other;
        p->n_handoffs++;
    }
    TS_ASSERT(pthread_cond_broadcast(&p->cv) == 0);
    if (!finishing) {
        while (p->holder != me) TS_ASSERT(pthread_cond_wait(&p->cv, &p->mu) == 0);
        p->seg_t0[me] = ts_now_ms(); /* the baton is back: a new segment */
    }
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
}

/* ts_yield()'s hook on either side. */
static void yield_hook(void *ctx)
{
    const ts_pair_side *s = ctx;
    hand_over(s->p, s->side, false, TS_OK);
}

static void *worker_main(void *arg)
{
    ts_pair *p = arg;
    if (p->thread_setup) p->thread_setup(p->setup_ctx); /* ts_pair_init waits for it */
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    p->ready = true;
    TS_ASSERT(pthread_cond_broadcast(&p->cv) == 0);
    for (;;) {
        while (!p->quit && !(p->submitted && p->holder == 1 && !p->done[1]))
            TS_ASSERT(pthread_cond_wait(&p->cv, &p->mu) == 0);
        if (p->quit) break;
        const ts_pair_body body = p->body[1];
        void *ctx = p->ctx[1];
        p->seg_t0[1] = ts_now_ms();
        TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);

        ts_yield_set_hook(yield_hook, &p->side[1]);
        const ts_status st = body(ctx);
        ts_yield_set_hook(NULL, NULL);
        /* The message is this thread's own (core/error.c): keep it for the caller. */
        if (st != TS_OK) snprintf(p->message, TS_ERROR_MAX, "%s", ts_error_message());
        hand_over(p, 1, true, st);

        TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    }
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
    return NULL;
}

ts_status ts_pair_init(ts_pair *p, void (*thread_setup)(void *ctx), void *setup_ctx)
{
    memset(p, 0, sizeof *p);
    p->thread_setup = thread_setup;
    p->setup_ctx = setup_ctx;
    p->side[0] = (ts_pair_side){p, 0};
    p->side[1] = (ts_pair_side){p, 1};
    p->message = ts_calloc(TS_ERROR_MAX, 1);
    TS_ASSERT(pthread_mutex_init(&p->mu, NULL) == 0);
    TS_ASSERT(pthread_cond_init(&p->cv, NULL) == 0);
    const int rc = pthread_create(&p->worker, NULL, worker_main, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p->message);
        memset(p, 0, sizeof *p);
        return ts_fail("overlapped pipeline pairs: cannot start the pair's worker thread "
                       "(pthread_create: %s)",
                       strerror(rc));
    }
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    while (!p->ready) TS_ASSERT(pthread_cond_wait(&p->cv, &p->mu) == 0);
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
    return TS_OK;
}

void ts_pair_free(ts_pair *p)
{
    if (!p->message) return; /* never started */
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    TS_ASSERT(!p->submitted); /* no pair under way */
    p->quit = true;
    TS_ASSERT(pthread_cond_broadcast(&p->cv) == 0);
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
    TS_ASSERT(pthread_join(p->worker, NULL) == 0);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->message);
    memset(p, 0, sizeof *p);
}

ts_status ts_pair_run(ts_pair *p, ts_pair_body first, void *first_ctx, ts_pair_body second,
                      void *second_ctx)
{
    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    TS_ASSERT(!p->submitted);
    p->body[0] = first;
    p->ctx[0] = first_ctx;
    p->body[1] = second;
    p->ctx[1] = second_ctx;
    p->done[0] = p->done[1] = false;
    p->status[0] = p->status[1] = TS_OK;
    p->holder = 0; /* the first body starts; the second at its first yield */
    p->n_handoffs = 0;
    p->n_segments[0] = p->n_segments[1] = 0;
    p->message[0] = '\0';
    p->submitted = true;
    p->seg_t0[0] = ts_now_ms();
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);

    ts_yield_set_hook(yield_hook, &p->side[0]);
    const ts_status st = first(first_ctx);
    ts_yield_set_hook(NULL, NULL);
    hand_over(p, 0, true, st);

    TS_ASSERT(pthread_mutex_lock(&p->mu) == 0);
    while (!p->done[1]) TS_ASSERT(pthread_cond_wait(&p->cv, &p->mu) == 0);
    p->submitted = false;
    const ts_status st1 = p->status[1];
    TS_ASSERT(pthread_mutex_unlock(&p->mu) == 0);
    if (st != TS_OK) return TS_ERR; /* the first failure in program order: ours */
    if (st1 != TS_OK) return ts_fail("%s", p->message);
    return TS_OK;
}
