/* Simulator: textbook bubbles of the schedules with uniform costs and free
 * communication, communication costs, activation memory, the data-parallel reduction,
 * deadlock detection, traces, the communication an overlapped pair hides. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/sim.h"
#include "test_util.h"

#define MAXC 64

/* Uniform per-chunk costs: F = f, I = W = b / 2 (so B = b). */
typedef struct {
    double f[MAXC], i[MAXC], w[MAXC], act[MAXC];
    ts_sim_costs c;
} costs;

static void uniform(costs *k, int n_chunks, double f, double b)
{
    for (int c = 0; c < n_chunks; c++) k->f[c] = f, k->i[c] = k->w[c] = b / 2, k->act[c] = 1000;
    k->c = (ts_sim_costs){.n_chunks = n_chunks, .f = k->f, .i = k->i, .w = k->w,
                          .act_bytes = k->act};
}

static int simulate(const char *name, int p, int v, int m, double f, double b, double latency,
                    ts_sim_result *r)
{
    ts_schedule s;
    if (ts_schedule_build(&s, name, p, v, m) != TS_OK) {
        fprintf(stderr, "%s p=%d v=%d m=%d: %s\n", name, p, v, m, ts_error_message());
        return -1;
    }
    costs k;
    uniform(&k, p * v, f, b);
    k.c.latency = latency;
    k.c.bandwidth = 0;
    int rc = ts_sim_run(&s, &k.c, r) == TS_OK ? 0 : -1;
    if (rc) fprintf(stderr, "sim %s: %s\n", name, ts_error_message());
    ts_schedule_free(&s);
    return rc;
}

static void test_textbook_plain(void)
{
    const char *names[] = {"gpipe", "1f1b"};
    const int ps[] = {1, 2, 4, 8}, ms[] = {1, 2, 4, 8, 13};
    for (int n = 0; n < 2; n++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 5; b++) {
                int p = ps[a], m = ms[b];
                ts_sim_result r;
                if (simulate(names[n], p, 1, m, 1.0, 2.0, 0.0, &r) != 0) {
                    CHECK(0);
                    continue;
                }
                double want = (double)(p - 1) / (m + p - 1);
                CHECKF(fabs(r.bubble_mean - want) < 1e-9, "%s p=%d m=%d bubble %.12f want %.12f",
                       names[n], p, m, r.bubble_mean, want);
                CHECK(fabs(r.step_time - 3.0 * (m + p - 1)) < 1e-9);
                for (int q = 0; q < p; q++) CHECK(fabs(r.bubble[q] - want) < 1e-9);
                CHECK(r.n_events == 2 * m * p);
                ts_sim_result_free(&r);
            }
}

static void test_textbook_interleaved(void)
{
    const int ps[] = {2, 4}, vs[] = {2, 3}, ms[] = {4, 8, 16};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++) {
                int p = ps[a], v = vs[b], m = ms[c];
                ts_sim_result r;
                if (simulate("interleaved-1f1b", p, v, m, 1.0 / v, 2.0 / v, 0.0, &r) != 0) {
                    CHECK(0);
                    continue;
                }
                double want = (double)(p - 1) / (v * m + p - 1);
                CHECKF(fabs(r.bubble_mean - want) < 1e-9, "interleaved p=%d v=%d m=%d bubble %.12f "
                       "want %.12f", p, v, m, r.bubble_mean, want);
                ts_sim_result_free(&r);
            }
}

static void test_zero_bubble(void)
{
    const int ps[] = {2, 4, 8};
    for (int a = 0; a < 3; a++)
        for (int mult = 2; mult <= 4; mult++) {
            int p = ps[a], m = mult * p;
            ts_sim_result zb, ref;
            if (simulate("zb-h1", p, 1, m, 1.0, 2.0, 0.0, &zb) != 0 ||
                simulate("1f1b", p, 1, m, 1.0, 2.0, 0.0, &ref) != 0) {
                CHECK(0);
                continue;
            }
            double ratio = zb.bubble_mean / ref.bubble_mean;
            printf("zb-h1 p=%d m=%d: bubble %.4f vs 1f1b %.4f (ratio %.3f), peak %d vs %d mb\n",
                   p, m, zb.bubble_mean, ref.bubble_mean, ratio, zb.peak_act_mb[0],
                   ref.peak_act_mb[0]);
            /* ZB-H1 leaves (p-1)(F+B-2W) = (p-1) units idle per rank: bubble (p-1)/(3m+p-1),
             * a ratio (m+p-1)/(3m+p-1) to 1F1B's: 3/7 at most for m = 2p, under 0.4 from
             * m = 3p, tending to 1/3. */
            double want = (double)(p - 1) / (3 * m + p - 1);
            CHECKF(fabs(zb.bubble_mean - want) < 1e-9, "zb-h1 p=%d m=%d bubble %.12f want %.12f",
                   p, m, zb.bubble_mean, want);
            CHECKF(ratio < (mult >= 3 ? 0.4 : 3.0 / 7.0), "zb-h1 p=%d m=%d ratio %.3f", p, m, ratio);
            CHECK(zb.peak_act_mb[0] == ref.peak_act_mb[0]); /* at 1F1B's memory */
            CHECK(zb.step_time < ref.step_time);
            ts_sim_result_free(&zb);
            ts_sim_result_free(&ref);
        }
}

static void test_communication(void)
{
    ts_sim_result free_r, slow;
    CHECK(simulate("1f1b", 4, 1, 8, 1.0, 2.0, 0.0, &free_r) == 0);
    CHECK(simulate("1f1b", 4, 1, 8, 1.0, 2.0, 0.25, &slow) == 0);
    CHECK(slow.step_time > free_r.step_time + 0.25);
    CHECK(slow.bubble_mean > free_r.bubble_mean);
    /* The critical path of the first forward and last backward crosses 2 * (p-1) links. */
    CHECK(slow.step_time >= free_r.step_time + 2 * 3 * 0.25 - 1e-9);
    ts_sim_result_free(&free_r);
    ts_sim_result_free(&slow);

    /* Bandwidth: message / bandwidth adds to every hop like latency does. */
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "gpipe", 2, 1, 1) == TS_OK);
    costs k;
    uniform(&k, 2, 1.0, 2.0);
    k.c.latency = 0.5;
    k.c.bandwidth = 100.0;
    k.c.msg_bytes = 50.0; /* 0.5 s */
    ts_sim_result r;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    /* F0 [0,1], hop 1, F1 [2,3], B1 [3,5], hop 1, B0 [6,8]. */
    CHECKF(fabs(r.step_time - 8.0) < 1e-12, "step %g", r.step_time);
    ts_sim_result_free(&r);
    /* One rank holding both chunks: no transfers. */
    ts_schedule_free(&s);
    CHECK(ts_schedule_build(&s, "interleaved-1f1b", 1, 2, 2) == TS_OK);
    uniform(&k, 2, 1.0, 2.0);
    k.c.latency = 10.0;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(fabs(r.step_time - 12.0) < 1e-12 && r.bubble_mean == 0.0);
    ts_sim_result_free(&r);
    ts_schedule_free(&s);
}

static void test_memory(void)
{
    const int ps[] = {2, 4}, ms[] = {1, 3, 8};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            int p = ps[a], m = ms[b];
            ts_sim_result one, gp;
            CHECK(simulate("1f1b", p, 1, m, 1.0, 2.0, 0.0, &one) == 0);
            CHECK(simulate("gpipe", p, 1, m, 1.0, 2.0, 0.0, &gp) == 0);
            int want = p < m ? p : m;
            CHECKF(one.peak_act_bytes[0] == want * 1000.0, "1f1b p=%d m=%d peak %g", p, m,
                   one.peak_act_bytes[0]);
            CHECK(one.peak_act_mb[0] == want);
            for (int q = 0; q < p; q++) {
                int wq = p - q < m ? p - q : m;
                CHECK(one.peak_act_mb[q] == wq);
                CHECK(gp.peak_act_bytes[q] == m * 1000.0);
            }
            ts_sim_result_free(&one);
            ts_sim_result_free(&gp);
        }
}

static void test_optimizer(void)
{
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "1f1b", 2, 1, 4) == TS_OK);
    costs k;
    uniform(&k, 2, 1.0, 2.0);
    double optim[2] = {0.5, 0.5};
    k.c.optim = optim;
    ts_sim_result r;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(fabs(r.step_time - (3.0 * 5 + 0.5)) < 1e-12);
    CHECK(r.n_events == 2 * 8 + 2 && r.events[8].kind == TS_SIM_OPTIM);
    ts_trace t;
    ts_trace_init(&t);
    ts_sim_to_trace(&r, 1000.0, &t);
    int compute = 0, waits = 0, optims = 0;
    for (int i = 0; i < t.n; i++) {
        compute += strlen(t.events[i].cat) == 1;
        waits += !strcmp(t.events[i].cat, "wait");
        optims += !strcmp(t.events[i].cat, "optim");
    }
    CHECK(compute == 16 && optims == 2 && waits >= 2);
    /* Busy + waits + trailing idle = step on every rank. */
    double rank1 = 0;
    for (int i = 0; i < t.n; i++)
        if (t.events[i].rank == 1) rank1 += t.events[i].dur_us;
    CHECK(rank1 <= r.step_time * 1000.0 + 1e-6);
    ts_trace_free(&t);
    ts_sim_result_free(&r);
    ts_schedule_free(&s);
}

/* The same chunk's reduction in pieces, as the trainer's buckets start while the last
 * backward finishes their layers: one chunk, F = 1, B = 2 + 2 (1..5), 4 bytes at 1 byte
 * per unit, no latency. Whole: ready at 5, 5..9, exposed 4. In 2 pieces: ready at 3 and
 * 5, 3..5 and 5..7, exposed 2. */
static void test_dp_reduction_in_pieces(void)
{
    ts_action list[] = {{ TS_ACT_F, 0, 0, false }, { TS_ACT_B, 0, 0, false }};
    ts_action *lists[] = {list};
    int counts[] = {2};
    ts_schedule s = {.name = "hand", .pp = 1, .v = 1, .m = 1, .n_chunks = 1, .chunk_rank = (int[]){0},
                     .n_actions = counts, .actions = lists};
    costs k;
    uniform(&k, 1, 1.0, 4.0);
    double bytes[1] = {4.0};
    k.c.dp_bytes = bytes;
    k.c.dp_bandwidth = 1.0;
    ts_sim_result r;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECKF(r.n_dp_events == 1 && fabs(r.dp_exposed - 4.0) < 1e-12, "whole: exposed %g",
           r.dp_exposed);
    ts_sim_result_free(&r);
    int pieces[1] = {2};
    k.c.dp_pieces = pieces;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(r.n_dp_events == 2);
    CHECKF(fabs(r.dp_events[0].start - 3.0) < 1e-12 && fabs(r.dp_events[0].end - 5.0) < 1e-12 &&
               fabs(r.dp_events[1].start - 5.0) < 1e-12 && fabs(r.dp_events[1].end - 7.0) < 1e-12,
           "%g..%g, %g..%g", r.dp_events[0].start, r.dp_events[0].end, r.dp_events[1].start,
           r.dp_events[1].end);
    CHECKF(fabs(r.dp_exposed - 2.0) < 1e-12 && fabs(r.dp_busy[0] - 4.0) < 1e-12,
           "pieces: exposed %g busy %g", r.dp_exposed, r.dp_busy[0]);
    ts_sim_result_free(&r);
}

/* One rank holding two chunks (a hand-made list), F = 1 and B = I + W = 1 + 1, dp link
 * 0.5 + bytes / 2. Chunk 1's last backward ends at 4 and chunk 0's at 6 (the rank's
 * last action): chunk 1's reduction (2 bytes: 1.5) runs 4..5.5 behind chunk 0's
 * backward, hidden; chunk 0's (4 bytes: 2.5) runs 6..8.5, all of it exposed. */
static void test_dp_reduction_hidden_and_exposed(void)
{
    ts_action list[] = {{ TS_ACT_F, 0, 0, false }, { TS_ACT_F, 1, 0, false }, { TS_ACT_B, 1, 0, false }, { TS_ACT_B, 0, 0, false }};
    ts_action *lists[] = {list};
    int counts[] = {4};
    ts_schedule s = {.name = "hand", .pp = 1, .v = 2, .m = 1, .n_chunks = 2, .chunk_rank = (int[]){0, 0},
                     .n_actions = counts, .actions = lists};
    costs k;
    uniform(&k, 2, 1.0, 2.0);
    double bytes[2] = {4.0, 2.0};
    k.c.dp_bytes = bytes;
    k.c.dp_latency = 0.5;
    k.c.dp_bandwidth = 2.0;
    ts_sim_result r;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(r.n_dp_events == 2);
    const ts_sim_event *hidden = &r.dp_events[0], *exposed = &r.dp_events[1];
    CHECK(hidden->chunk == 1 && hidden->kind == TS_SIM_DP && hidden->rank == 0);
    CHECKF(fabs(hidden->start - 4.0) < 1e-12 && fabs(hidden->end - 5.5) < 1e-12, "%g..%g",
           hidden->start, hidden->end);
    CHECKF(exposed->chunk == 0 && fabs(exposed->start - 6.0) < 1e-12 &&
               fabs(exposed->end - 8.5) < 1e-12,
           "chunk %d %g..%g", exposed->chunk, exposed->start, exposed->end);
    CHECKF(fabs(r.step_time - 8.5) < 1e-12, "step %g", r.step_time);
    CHECK(fabs(r.dp_exposed - 2.5) < 1e-12 && fabs(r.dp_wait[0] - 2.5) < 1e-12);
    CHECK(fabs(r.dp_busy[0] - 4.0) < 1e-12);
    CHECK(fabs(r.busy[0] - 6.0) < 1e-12); /* the reduction is not compute */

    /* The optimizer waits for it too: 8.5 .. 9. */
    double optim[1] = {0.5};
    k.c.optim = optim;
    ts_sim_result_free(&r);
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(fabs(r.step_time - 9.0) < 1e-12 && fabs(r.dp_exposed - 2.5) < 1e-12);
    CHECK(r.events[4].kind == TS_SIM_OPTIM && fabs(r.events[4].start - 8.5) < 1e-12);
    /* The trace: the reductions on the dp track, the wait for them before the optimizer. */
    ts_trace t;
    ts_trace_init(&t);
    ts_sim_to_trace(&r, 1.0, &t);
    int dp = 0, waits = 0;
    for (int i = 0; i < t.n; i++) {
        const ts_trace_event *e = &t.events[i];
        if (!strcmp(e->cat, "dpreduce")) dp += e->track == TS_TRACE_TRACK_DP;
        if (!strcmp(e->cat, "wait")) waits += fabs(e->start_us - 6.0) < 1e-9 && fabs(e->dur_us - 2.5) < 1e-9;
        if (strcmp(e->cat, "dpreduce") != 0) CHECK(e->track == TS_TRACE_TRACK_MAIN);
    }
    CHECK(dp == 2 && waits == 1);
    ts_trace_free(&t);
    k.c.optim = NULL;

    /* A slower link: chunk 1's reduction (6 bytes: 3.5, 4..7.5) outlasts the compute and
     * holds the lane, so chunk 0's starts at 7.5, not 6: the lane runs one at a time. */
    bytes[1] = 6.0;
    ts_sim_result_free(&r);
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(fabs(r.dp_events[1].start - 7.5) < 1e-12 && fabs(r.step_time - 10.0) < 1e-12);
    CHECK(fabs(r.dp_exposed - 4.0) < 1e-12);

    /* Split backward (zb-h1's I and W): a chunk's gradients are final after its W, not
     * its I. F0 0-1, F1 1-2, I1 2-3, I0 3-4, W1 4-5, W0 5-6: chunk 1 reduces from 5. */
    ts_action split[] = {{ TS_ACT_F, 0, 0, false }, { TS_ACT_F, 1, 0, false }, { TS_ACT_I, 1, 0, false },
                         { TS_ACT_I, 0, 0, false }, { TS_ACT_W, 1, 0, false }, { TS_ACT_W, 0, 0, false }};
    lists[0] = split;
    counts[0] = 6;
    bytes[1] = 2.0;
    ts_sim_result_free(&r);
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(r.dp_events[0].chunk == 1 && fabs(r.dp_events[0].start - 5.0) < 1e-12);
    CHECK(fabs(r.dp_events[1].start - 6.5) < 1e-12 && fabs(r.step_time - 9.0) < 1e-12);
    ts_sim_result_free(&r);

    /* Two ranks (1f1b, m = 1): rank 1's reduction (4..5.5) hides behind rank 0's
     * backward (4..6), so only rank 0's (6..7.5) lengthens the step. */
    ts_schedule two;
    CHECK(ts_schedule_build(&two, "1f1b", 2, 1, 1) == TS_OK);
    double same[2] = {2.0, 2.0};
    k.c.dp_bytes = same;
    CHECK(ts_sim_run(&two, &k.c, &r) == TS_OK);
    CHECK(fabs(r.dp_wait[1] - 1.5) < 1e-12 && fabs(r.dp_wait[0] - 1.5) < 1e-12);
    CHECK(fabs(r.step_time - 7.5) < 1e-12 && fabs(r.dp_exposed - 1.5) < 1e-12);
    ts_sim_result_free(&r);

    /* No dp (dp_bytes NULL): nothing changes. */
    k.c.dp_bytes = NULL;
    CHECK(ts_sim_run(&two, &k.c, &r) == TS_OK);
    CHECK(r.n_dp_events == 0 && r.dp_exposed == 0.0 && fabs(r.step_time - 6.0) < 1e-12);
    ts_sim_result_free(&r);
    ts_schedule_free(&two);
}

/* A hand-made list: rank 0 runs B before its F. */
static void test_errors(void)
{
    ts_action r0[] = {{ TS_ACT_B, 0, 0, false }, { TS_ACT_F, 0, 0, false }};
    ts_action r1[] = {{ TS_ACT_F, 1, 0, false }, { TS_ACT_B, 1, 0, false }};
    ts_action *lists[] = {r0, r1};
    int counts[] = {2, 2};
    ts_schedule s = {.name = "hand", .pp = 2, .v = 1, .m = 1, .n_chunks = 2, .chunk_rank = (int[]){0, 1},
                     .n_actions = counts, .actions = lists};
    costs k;
    uniform(&k, 2, 1.0, 2.0);
    ts_sim_result r;
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "deadlock") && strstr(ts_error_message(), "rank 0 waits at B"),
           "%s", ts_error_message());

    r0[0] = (ts_action){ TS_ACT_F, 1, 0, false }; /* chunk 1 lives on rank 1 */
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_ERR);
    CHECK(strstr(ts_error_message(), "lives on rank 1") != NULL);
    r0[0] = (ts_action){ TS_ACT_F, 0, 0, false };
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_ERR); /* F twice, no B */
    CHECK(strstr(ts_error_message(), "twice") != NULL);
    r0[1] = (ts_action){ TS_ACT_I, 0, 0, false };
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_ERR); /* I without W */
    CHECK(strstr(ts_error_message(), "one I and one W") != NULL);
    r0[1] = (ts_action){ TS_ACT_B, 0, 0, false };
    CHECK(ts_sim_run(&s, &k.c, &r) == TS_OK);
    CHECK(fabs(r.step_time - 6.0) < 1e-12);
    ts_sim_result_free(&r);
}


/* Overlapped pairs (sim.h f_comm, i_comm): without overlap flags the communication
 * changes nothing, to the bit; under dualpipe-v the pairs hide some of it (never more
 * than there is), each pair's second action shortened by at most min(comm_a, compute_b) +
 * min(comm_b, compute_a), and every rank's busy time is its actions' costs less what was
 * hidden. */
static void test_overlapped_pairs(void)
{
    const char *names[] = {"1f1b", "dualpipe-v"};
    const int vs[] = {1, 2};
    for (int n = 0; n < 2; n++) {
        ts_schedule s;
        CHECK(ts_schedule_build(&s, names[n], 2, vs[n], 8) == TS_OK);
        costs k;
        uniform(&k, s.n_chunks, 1.0, 2.0);
        ts_sim_result plain, paired;
        CHECK(ts_sim_run(&s, &k.c, &plain) == TS_OK);
        double comm[MAXC];
        for (int c = 0; c < s.n_chunks; c++) comm[c] = 0.4;
        k.c.f_comm = comm;
        k.c.i_comm = comm;
        CHECK(ts_sim_run(&s, &k.c, &paired) == TS_OK);
        int pairs = 0;
        for (int q = 0; q < s.pp; q++)
            for (int a = 0; a + 1 < s.n_actions[q]; a++) pairs += s.actions[q][a].overlap;
        double hidden = 0.0, total = 0.0;
        for (int q = 0; q < s.pp; q++) {
            hidden += paired.comm_hidden[q];
            total += paired.comm[q];
            /* busy = the actions' costs less what their partners hid (no optimizer here) */
            double cost = 0.0;
            for (int a = 0; a < s.n_actions[q]; a++) {
                const ts_action *x = &s.actions[q][a];
                cost += x->kind == TS_ACT_F ? k.f[x->chunk]
                        : x->kind == TS_ACT_B ? k.i[x->chunk] + k.w[x->chunk]
                        : x->kind == TS_ACT_I ? k.i[x->chunk] : k.w[x->chunk];
            }
            CHECKF(ts_rel_err(paired.busy[q], cost - paired.comm_hidden[q], 1) < 1e-12,
                   "%s rank %d: busy %g, costs %g less hidden %g", names[n], q, paired.busy[q],
                   cost, paired.comm_hidden[q]);
            /* each pair hides at most min(0.4, 1 - 0.4) + min(0.4, 2 - 0.4) = 0.8 */
        }
        if (pairs == 0) {
            CHECKF(hidden == 0.0 && paired.step_time == plain.step_time,
                   "%s: no pairs, yet %g hidden (step %g against %g)", names[n], hidden,
                   paired.step_time, plain.step_time);
        } else {
            CHECKF(hidden > 0.0 && hidden <= total && hidden <= 0.8 * pairs + 1e-12 &&
                       paired.step_time < plain.step_time,
                   "%s: %d pairs hid %g of %g (step %g against %g)", names[n], pairs, hidden,
                   total, paired.step_time, plain.step_time);
        }
        ts_sim_result_free(&plain);
        ts_sim_result_free(&paired);
        ts_schedule_free(&s);
    }
}

int main(void)
{
    test_textbook_plain();
    test_textbook_interleaved();
    test_zero_bubble();
    test_communication();
    test_memory();
    test_optimizer();
    test_dp_reduction_hidden_and_exposed();
    test_dp_reduction_in_pieces();
    test_errors();
    test_overlapped_pairs();
    return ts_test_report();
}
