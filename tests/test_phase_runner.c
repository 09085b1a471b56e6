/* tensor/phase_runner.h: the order in which tp_overlap's runner calls a layer's steps.
 *   test_one_sub_batch: S = 1 is a plain call, each step once in order with a NULL
 *     pending (every collective blocks, as without tp_overlap);
 *   test_interleaved: S = 3, four steps: step j on sub-batches 0, 1, 2 before step j+1,
 *     each sub-batch always given its own pending (the same one at every step, where its
 *     collective stays until its next step), idle when the step starts. */
#include "tensor/phase_runner.h"
#include "test_util.h"

enum { MAX_CALLS = 64 };

typedef struct {
    int n, step[MAX_CALLS], sub[MAX_CALLS];
    ts_tp_pending *pending[MAX_CALLS];
    bool idle[MAX_CALLS];
} calls;

static void record(calls *c, int step, int sub, ts_tp_pending *p)
{
    if (c->n == MAX_CALLS) return;
    c->step[c->n] = step;
    c->sub[c->n] = sub;
    c->pending[c->n] = p;
    c->idle[c->n] = !p || !p->active;
    c->n++;
}
static void step0(void *ctx, int sub, ts_tp_pending *p) { record(ctx, 0, sub, p); }
static void step1(void *ctx, int sub, ts_tp_pending *p) { record(ctx, 1, sub, p); }
static void step2(void *ctx, int sub, ts_tp_pending *p) { record(ctx, 2, sub, p); }
static void step3(void *ctx, int sub, ts_tp_pending *p) { record(ctx, 3, sub, p); }
static const ts_phase_step steps[] = {step0, step1, step2, step3};

static void test_one_sub_batch(void)
{
    const ts_tp tp = ts_tp_make(1, 0, NULL, &ts_kernels_cpu);
    calls c = {0};
    ts_phase_run(&tp, 1, steps, 4, &c);
    CHECK(c.n == 4);
    for (int i = 0; i < c.n; i++) CHECK(c.step[i] == i && c.sub[i] == 0 && c.pending[i] == NULL);
}

static void test_interleaved(void)
{
    const ts_tp tp = ts_tp_overlap(ts_tp_make(1, 0, NULL, &ts_kernels_cpu), 3);
    calls c = {0};
    ts_phase_run(&tp, 3, steps, 4, &c);
    CHECK(c.n == 12);
    for (int i = 0; i < c.n; i++) {
        CHECKF(c.step[i] == i / 3 && c.sub[i] == i % 3, "call %d: step %d sub %d", i, c.step[i],
               c.sub[i]);
        CHECK(c.pending[i] != NULL && c.idle[i]);
        CHECK(c.pending[i] == c.pending[c.sub[i]]);        /* a sub-batch's own, every step */
        CHECK(c.sub[i] == 0 || c.pending[i] != c.pending[0]); /* and no other's */
    }
    CHECK(c.pending[1] != c.pending[2]);
}

int main(void)
{
    test_one_sub_batch();
    test_interleaved();
    return ts_test_report();
}
