/* The pair runner (pipeline/pair.h) on its own: two fake action bodies that log their
 * steps and yield at fixed points run in exactly the interleaving the baton promises
 * (first body to its first yield, second to its first, ...; the rest of one once the
 * other returns), the same on every repetition whatever the threads' timing (the second
 * body sleeps at random), the first body on the caller's thread and the second on one
 * worker created once; early returns and errors on either side, the hook cleared outside
 * a pair, and the segments reported one at a time, never overlapping. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/yield.h"
#include "pipeline/pair.h"
#include "test_util.h"

/* What both fake bodies write (only the baton's holder writes: no lock). */
typedef struct {
    char log[512];
    pthread_t thread[2];
    int active_inside[2]; /* ts_yield_active() as each body saw it */
} shared_log;

/* A fake action: `steps` steps named "<name><k>", a yield after each step in `yields`
 * (bit k: after step k), failing (TS_ERR, message "<name> failed") after step fail_at
 * (-1: never). jitter: sleep a random few hundred microseconds before each step. */
typedef struct {
    char name;
    int side;
    int steps;
    unsigned yields;
    int fail_at;
    bool jitter;
    shared_log *out;
} fake_action;

static ts_status fake_body(void *ctx)
{
    fake_action *a = ctx;
    a->out->thread[a->side] = pthread_self();
    a->out->active_inside[a->side] = ts_yield_active();
    for (int k = 0; k < a->steps; k++) {
        if (a->jitter) usleep((useconds_t)(rand() % 400));
        char step[16];
        snprintf(step, sizeof step, "%c%d ", a->name, k);
        strcat(a->out->log, step);
        if (k == a->fail_at) return ts_fail("%c failed", a->name);
        if (a->yields >> k & 1u) ts_yield();
    }
    return TS_OK;
}

static int g_setup_calls;
static pthread_t g_setup_thread;
static void setup(void *ctx)
{
    (void)ctx;
    g_setup_calls++;
    g_setup_thread = pthread_self();
}

/* Segments as the runner reports them: side and times, in report order. */
typedef struct {
    int n;
    int side[64];
    double t0[64], t1[64];
} segments;
static void on_segment(void *ctx, int side, double t0, double t1)
{
    segments *s = ctx;
    if (s->n < 64) {
        s->side[s->n] = side;
        s->t0[s->n] = t0;
        s->t1[s->n] = t1;
    }
    s->n++;
}

/* Run the two fakes as a pair; the log into `log` (NULL: not compared). */
static ts_status run_pair(ts_pair *p, fake_action *a, fake_action *b, shared_log *out)
{
    memset(out, 0, sizeof *out);
    a->out = b->out = out;
    a->side = 0;
    b->side = 1;
    return ts_pair_run(p, fake_body, a, fake_body, b);
}

static void test_pair_interleaving(ts_pair *p)
{
    shared_log out;
    /* A: 3 steps, yields after 0 and 1; B: 2 steps, yields after 0. */
    fake_action a = {'a', 0, 3, 0x3u, -1, false, NULL}, b = {'b', 1, 2, 0x1u, -1, true, NULL};
    segments seg = {0};
    p->segment = on_segment;
    p->segment_ctx = &seg;
    for (int rep = 0; rep < 50; rep++) {
        seg.n = 0;
        CHECK(run_pair(p, &a, &b, &out) == TS_OK);
        CHECKF(strcmp(out.log, "a0 b0 a1 b1 a2 ") == 0, "rep %d: %s", rep, out.log);
        CHECK(pthread_equal(out.thread[0], pthread_self()));
        CHECK(!pthread_equal(out.thread[1], pthread_self()));
        CHECK(pthread_equal(out.thread[1], g_setup_thread)); /* one worker, set up once */
        CHECK(out.active_inside[0] && out.active_inside[1]);
        CHECK(p->n_handoffs == 4 && p->n_segments[0] == 3 && p->n_segments[1] == 2);
        /* Reported in order, sides alternating, one at a time. */
        CHECK(seg.n == 5);
        for (int i = 0; i < seg.n && i < 64; i++) {
            CHECK(seg.side[i] == i % 2);
            CHECK(seg.t1[i] >= seg.t0[i]);
            if (i > 0) CHECK(seg.t0[i] >= seg.t1[i - 1]);
        }
    }
    p->segment = NULL;
    CHECK(g_setup_calls == 1);
    CHECK(!ts_yield_active()); /* the hook is a pair's only */
}

static void test_pair_early_finish(ts_pair *p)
{
    shared_log out;
    /* The first body never yields: the second starts when it returns and runs alone,
     * its yields returning at once. */
    fake_action a = {'a', 0, 2, 0u, -1, false, NULL}, b = {'b', 1, 3, 0x7u, -1, true, NULL};
    CHECK(run_pair(p, &a, &b, &out) == TS_OK);
    CHECKF(strcmp(out.log, "a0 a1 b0 b1 b2 ") == 0, "%s", out.log);
    CHECK(p->n_handoffs == 1);
    /* The second returns first: the first's later yields return at once. */
    fake_action c = {'c', 0, 4, 0xfu, -1, false, NULL}, d = {'d', 1, 1, 0x1u, -1, true, NULL};
    CHECK(run_pair(p, &c, &d, &out) == TS_OK);
    CHECKF(strcmp(out.log, "c0 d0 c1 c2 c3 ") == 0, "%s", out.log);
    /* An empty second body. */
    fake_action e = {'e', 0, 2, 0x3u, -1, false, NULL}, f = {'f', 1, 0, 0u, -1, false, NULL};
    CHECK(run_pair(p, &e, &f, &out) == TS_OK);
    CHECKF(strcmp(out.log, "e0 e1 ") == 0, "%s", out.log);
}

static void test_pair_errors(ts_pair *p)
{
    shared_log out;
    /* The worker's failure surfaces on this thread with its message; the first body
     * still runs to its end (the failed one counts as finished). */
    ts_error_clear();
    fake_action a = {'a', 0, 3, 0x3u, -1, false, NULL}, b = {'b', 1, 3, 0x7u, 0, true, NULL};
    CHECK(run_pair(p, &a, &b, &out) == TS_ERR);
    CHECKF(strcmp(ts_error_message(), "b failed") == 0, "%s", ts_error_message());
    CHECKF(strcmp(out.log, "a0 b0 a1 a2 ") == 0, "%s", out.log);
    /* The first body's failure: its own message, the second runs to its end. */
    fake_action c = {'c', 0, 3, 0x1u, 1, false, NULL}, d = {'d', 1, 2, 0x3u, -1, true, NULL};
    CHECK(run_pair(p, &c, &d, &out) == TS_ERR);
    CHECKF(strcmp(ts_error_message(), "c failed") == 0, "%s", ts_error_message());
    CHECKF(strcmp(out.log, "c0 d0 c1 d1 ") == 0, "%s", out.log);
    /* Both fail: the first in program order wins. */
    fake_action g = {'g', 0, 2, 0x1u, 1, false, NULL}, h = {'h', 1, 2, 0x1u, 1, true, NULL};
    CHECK(run_pair(p, &g, &h, &out) == TS_ERR);
    CHECKF(strcmp(ts_error_message(), "g failed") == 0, "%s", ts_error_message());
    CHECKF(strcmp(out.log, "g0 h0 g1 h1 ") == 0, "%s", out.log);
    /* And the runner is usable again. */
    fake_action x = {'x', 0, 1, 0x1u, -1, false, NULL}, y = {'y', 1, 1, 0x1u, -1, false, NULL};
    CHECK(run_pair(p, &x, &y, &out) == TS_OK);
    CHECKF(strcmp(out.log, "x0 y0 ") == 0, "%s", out.log);
}

int main(void)
{
    srand(7);
    CHECK(!ts_yield_active());
    ts_yield(); /* no hook: returns at once */
    ts_pair p;
    CHECKF(ts_pair_init(&p, setup, NULL) == TS_OK, "%s", ts_error_message());
    test_pair_interleaving(&p);
    test_pair_early_finish(&p);
    test_pair_errors(&p);
    CHECK(g_setup_calls == 1);
    ts_pair_free(&p);
    return ts_test_report();
}
