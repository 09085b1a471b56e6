/* Chunk costs from a measured trace (plan/trace_costs.h), on small Chrome traces written
 * here in the format `tessera train --set log.trace=...` writes: the mean and the median
 * over the steady steps, I and W taken as measured or a full B split in halves, the
 * trace's own step time and both bubbles, events that are not compute ignored; and
 * every way a trace can disagree with the schedule an error that says so, leaving no
 * costs behind. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/schedule.h"
#include "plan/trace_costs.h"
#include "test_util.h"

/* A growing JSON text. */
typedef struct {
    char *s;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char line[512];
    const int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof line) abort();
    if (t->n + (size_t)k + 1 > t->cap) {
        t->cap = 2 * (t->n + (size_t)k + 1);
        t->s = realloc(t->s, t->cap);
        if (!t->s) abort();
    }
    memcpy(t->s + t->n, line, (size_t)k + 1);
    t->n += (size_t)k;
}

static const char *cats[] = {"F", "B", "I", "W"};

/* Step u runs at u seconds, each rank's actions back to back, every duration the
 * chunk's base cost (ms) times the step's scale; rank q starts q ms x scale late (it
 * waits for rank 0's first forward). What else a training trace holds is added too: the
 * track names, an optimizer step after each rank's actions, a dp reduction on the dp
 * track. drop_last: leave out rank 1's last action; short_rank1: rank 1 ran one step
 * less. */
typedef struct {
    double f[4], b[4], i[4], w[4]; /* per chunk, ms */
    double scale[8];               /* per step */
    int steps;
    bool drop_last, short_rank1;
} trace_spec;

static const char *write_trace(const char *dir, const char *name, const ts_schedule *s,
                               const trace_spec *sp)
{
    text t = {0};
    put(&t, "{\"traceEvents\": [\n");
    for (int q = 0; q < s->pp; q++)
        put(&t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                "\"args\":{\"name\":\"pipeline rank %d\"}},\n", q, q);
    for (int u = 0; u < sp->steps; u++)
        for (int q = 0; q < s->pp; q++) {
            if (q == 1 && sp->short_rank1 && u == sp->steps - 1) continue;
            const double k = sp->scale[u];
            double at = u * 1e6 + q * 1e3 * k; /* us */
            for (int j = 0; j < s->n_actions[q]; j++) {
                if (q == 1 && sp->drop_last && u == sp->steps - 1 && j == s->n_actions[q] - 1)
                    continue;
                const ts_action *a = &s->actions[q][j];
                const int c = a->chunk;
                const double ms = a->kind == TS_ACT_F   ? sp->f[c]
                                  : a->kind == TS_ACT_B ? sp->b[c]
                                  : a->kind == TS_ACT_I ? sp->i[c]
                                                        : sp->w[c];
                const double dur = ms * k * 1e3;
                put(&t, "{\"name\":\"%s%d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                        "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"chunk\":%d,\"mb\":%d}},\n",
                    cats[a->kind], a->mb, cats[a->kind], q, at, dur, c, a->mb);
                at += dur;
            }
            put(&t, "{\"name\":\"optim\",\"cat\":\"optim\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":50,\"args\":{\"chunk\":-1,\"mb\":-1}},\n", q, at);
            put(&t, "{\"name\":\"all-reduce\",\"cat\":\"dpreduce\",\"ph\":\"X\",\"pid\":1,"
                    "\"tid\":%d,\"ts\":%.3f,\"dur\":70,\"args\":{\"chunk\":%d,\"mb\":-1}},\n",
                q, at - 10, q);
        }
    /* The last element without a comma: one more metadata event. */
    put(&t, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
            "\"args\":{\"name\":\"pipeline\"}}\n], \"displayTimeUnit\": \"ms\"}\n");
    const char *path = ts_test_write_file(dir, name, t.s);
    free(t.s);
    return path;
}

static bool near(double a, double b) { return ts_rel_err(a, b, 1e-9) < 1e-9; }

static void build(ts_schedule *s, const char *name, int pp, int m)
{
    if (ts_schedule_build(s, name, pp, 1, m) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(2);
    }
}

/* 1F1B on 2 ranks, 2 micro-batches: chunk 0 has F 1 ms, B 2 ms; chunk 1 F 2, B 4; steps
 * scaled 10 (warm-up), 1, 2, 6. Per step rank 0 is busy 6 x scale, rank 1 12 x scale
 * from 1 x scale: the step spans 13 x scale, idle 7/13 and 1/13 of it (mean 4/13), and
 * until each rank's last action 0 and 1/13 (mean 1/26). */
static void test_costs(const char *dir)
{
    ts_schedule s;
    build(&s, "1f1b", 2, 2);
    const trace_spec sp = {.f = {1, 2}, .b = {2, 4}, .scale = {10, 1, 2, 6}, .steps = 4};
    const char *p = write_trace(dir, "1f1b.json", &s, &sp);
    char path[512];
    snprintf(path, sizeof path, "%s", p);

    ts_trace_costs tc;
    CHECKF(ts_trace_costs_load(path, &s, 1, false, &tc) == TS_OK, "%s", ts_error_message());
    CHECK(tc.n_chunks == 2 && tc.steps == 4 && tc.skip == 1 && tc.n_tracks == 2);
    /* mean of scales 1, 2, 6 = 3; a full B is halved into I and W */
    CHECKF(near(tc.f[0], 3) && near(tc.f[1], 6), "F %g %g", tc.f[0], tc.f[1]);
    CHECKF(near(tc.i[0], 3) && near(tc.w[0], 3) && near(tc.i[1], 6) && near(tc.w[1], 6),
           "I/W %g %g %g %g", tc.i[0], tc.w[0], tc.i[1], tc.w[1]);
    /* the step's own numbers are medians over the steps: scale 2 */
    CHECKF(near(tc.step_ms, 26), "step %g ms", tc.step_ms);
    CHECKF(near(tc.bubble, 4.0 / 13), "bubble %g", tc.bubble);
    CHECKF(near(tc.bubble_rank_span, 1.0 / 26), "rank-span bubble %g", tc.bubble_rank_span);
    ts_trace_costs_free(&tc);
    CHECK(!tc.f && tc.n_chunks == 0);

    /* The median: scale 2; without skipping, the warm-up step counts too (median of
     * scales 1, 2, 6, 10: 4). */
    CHECK(ts_trace_costs_load(path, &s, 1, true, &tc) == TS_OK);
    CHECKF(near(tc.f[0], 2) && near(tc.f[1], 4) && near(tc.i[1], 4) && near(tc.w[0], 2),
           "median F %g %g, I %g, W %g", tc.f[0], tc.f[1], tc.i[1], tc.w[0]);
    ts_trace_costs_free(&tc);
    CHECK(ts_trace_costs_load(path, &s, 0, true, &tc) == TS_OK);
    CHECKF(tc.skip == 0 && near(tc.f[0], 4) && near(tc.step_ms, 52), "skip 0: F %g, step %g",
           tc.f[0], tc.step_ms);
    ts_trace_costs_free(&tc);
    /* The last step alone. */
    CHECK(ts_trace_costs_load(path, &s, 3, false, &tc) == TS_OK);
    CHECKF(near(tc.f[1], 12) && near(tc.step_ms, 78), "skip 3: F %g, step %g", tc.f[1],
           tc.step_ms);
    ts_trace_costs_free(&tc);
    ts_schedule_free(&s);
}

/* ZB-H1's split backward: I and W as measured. */
static void test_split_backward(const char *dir)
{
    ts_schedule s;
    build(&s, "zb-h1", 2, 4);
    const trace_spec sp = {.f = {1, 2}, .i = {1.5, 2.5}, .w = {0.5, 0.25},
                           .scale = {1, 1, 1}, .steps = 3};
    const char *path = write_trace(dir, "zb.json", &s, &sp);
    ts_trace_costs tc;
    CHECKF(ts_trace_costs_load(path, &s, 1, false, &tc) == TS_OK, "%s", ts_error_message());
    CHECKF(near(tc.f[0], 1) && near(tc.f[1], 2) && near(tc.i[0], 1.5) && near(tc.i[1], 2.5) &&
               near(tc.w[0], 0.5) && near(tc.w[1], 0.25),
           "zb-h1: F %g %g, I %g %g, W %g %g", tc.f[0], tc.f[1], tc.i[0], tc.i[1], tc.w[0],
           tc.w[1]);
    ts_trace_costs_free(&tc);
    ts_schedule_free(&s);
}

/* load must fail with a message containing `want`, and leave no costs. */
static void expect_error(const char *path, const ts_schedule *s, int skip, const char *want)
{
    ts_trace_costs tc;
    memset(&tc, 0x5a, sizeof tc); /* nothing may be read from what was there */
    const ts_status st = ts_trace_costs_load(path, s, skip, false, &tc);
    const char *msg = st == TS_OK ? "" : ts_error_message();
    CHECKF(st != TS_OK && strstr(msg, want) && !strncmp(msg, "--costs-from-trace: ", 20),
           "%s: expected an error with \"%s\", got \"%s\"", path, want, msg);
    CHECK(!tc.f && !tc.i && !tc.w && tc.n_chunks == 0);
    if (st == TS_OK) ts_trace_costs_free(&tc);
}

static void test_errors(const char *dir)
{
    ts_schedule s, gpipe;
    build(&s, "1f1b", 2, 2);
    build(&gpipe, "gpipe", 2, 2);
    trace_spec sp = {.f = {1, 2}, .b = {2, 4}, .scale = {1, 1, 1}, .steps = 3};
    char path[1024];

    snprintf(path, sizeof path, "%s/absent.json", dir);
    expect_error(path, &s, 1, "No such file or directory"); /* the open, not the JSON */
    /* An input that is not a regular file is refused before it is read (a FIFO would
     * block the open). */
    snprintf(path, sizeof path, "%s", dir);
    expect_error(path, &s, 1, "is not a regular file (it is a directory)");
    expect_error(ts_test_write_file(dir, "object.json", "{\"x\": 1}\n"), &s, 1,
                 "no \"traceEvents\" array");
    expect_error(ts_test_write_file(dir, "none.json",
                                    "{\"traceEvents\": [{\"name\":\"optim\",\"cat\":\"optim\","
                                    "\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":0,\"dur\":5}]}\n"),
                 &s, 1, "has no F/B/I/W events");
    expect_error(ts_test_write_file(dir, "chunk.json",
                                    "{\"traceEvents\": [{\"name\":\"F0\",\"cat\":\"F\",\"ph\":"
                                    "\"X\",\"pid\":0,\"tid\":0,\"ts\":0,\"dur\":5,\"args\":{"
                                    "\"chunk\":5,\"mb\":0}}]}\n"),
                 &s, 1, "has an event on chunk 5, but this config has 2 chunks");
    sp.drop_last = true;
    expect_error(write_trace(dir, "partial.json", &s, &sp), &s, 1,
                 "has 11 compute events, not whole steps of the 4 actions schedule 1f1b");
    sp.drop_last = false;
    sp.short_rank1 = true;
    expect_error(write_trace(dir, "short.json", &s, &sp), &s, 1, "ran 2 steps, another rank 3");
    sp.short_rank1 = false;
    /* GPipe's rank 1 runs F0 F1 B0 B1; 1F1B's F0 B0 F1 B1 */
    expect_error(write_trace(dir, "gpipe.json", &gpipe, &sp), &s, 1,
                 "event 1 of rank 1 in");
    expect_error(write_trace(dir, "good.json", &s, &sp), &s, 3,
                 "holds 3 steps; nothing is left after dropping 3 (--trace-skip-steps)");
    ts_schedule_free(&s);
    ts_schedule_free(&gpipe);
}

int main(void)
{
    char dir[512];
    ts_test_make_dir(dir, sizeof dir, "ts_trace_costs");
    test_costs(dir);
    test_split_backward(dir);
    test_errors(dir);
    ts_test_remove_dir(dir);
    return ts_test_report();
}
