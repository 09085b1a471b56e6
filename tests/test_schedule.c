/* Pipeline schedules: every built-in schedule validates over a grid of (pp, v, m), holds
 * the activations it promises, and has the bubble the literature gives, measured by a
 * small discrete-event replay written here (independent of src/sim); CSV round trips and
 * the errors a user meets with a hand-written CSV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/schedule.h"
#include "test_util.h"

static char g_dir[256];

static bool msg_has(const char *needle) { return strstr(ts_error_message(), needle) != NULL; }

static const char *write_file(const char *name, const char *text)
{
    return ts_test_write_file(g_dir, name, text);
}

/* ---- Discrete-event replay ------------------------------------------------------ */

/* Each rank runs its list in order; an action starts when its rank is free and its
 * inputs exist (F(c-1) for F(c); B/I(c+1) for B/I(c); same-rank inputs come earlier in
 * the list); communication is free. cost[kind] is per chunk. */
typedef struct {
    double makespan;  /* the step: last action's end */
    double bubble;    /* mean over ranks of 1 - busy / makespan */
    double idle;      /* mean over ranks of makespan - busy */
    double span_idle; /* most over ranks of (last end - first start) - busy: the gaps
                         inside a rank's run, not its late start or early end */
} replay_result;

static replay_result replay(const ts_schedule *s, const double cost[4])
{
    int pp = s->pp, m = s->m, cells = s->n_chunks * m, left = 0;
    double *end = malloc(sizeof(double) * 4 * (size_t)cells); /* [kind][cell], -1 = not yet */
    for (int j = 0; j < 4 * cells; j++) end[j] = -1;
    int *next = calloc((size_t)pp, sizeof(int));
    double *t = calloc((size_t)pp, sizeof(double)), *busy = calloc((size_t)pp, sizeof(double));
    double *first = malloc(sizeof(double) * (size_t)pp);
    for (int r = 0; r < pp; r++) first[r] = -1;
    for (int r = 0; r < pp; r++) left += s->n_actions[r];
    for (bool progress = true; left > 0 && progress;) {
        progress = false;
        for (int r = 0; r < pp; r++)
            for (; next[r] < s->n_actions[r]; next[r]++, left--, progress = true) {
                ts_action a = s->actions[r][next[r]];
                double ready = 0;
                if (a.kind == TS_ACT_F && a.chunk > 0) {
                    ready = end[TS_ACT_F * cells + (a.chunk - 1) * m + a.mb];
                } else if ((a.kind == TS_ACT_B || a.kind == TS_ACT_I) &&
                           a.chunk < s->n_chunks - 1) {
                    int j = (a.chunk + 1) * m + a.mb;
                    ready = end[TS_ACT_B * cells + j] >= 0 ? end[TS_ACT_B * cells + j]
                                                           : end[TS_ACT_I * cells + j];
                }
                if (ready < 0) break;
                double start = ready > t[r] ? ready : t[r];
                if (first[r] < 0) first[r] = start;
                t[r] = start + cost[a.kind];
                busy[r] += cost[a.kind];
                end[a.kind * cells + a.chunk * m + a.mb] = t[r];
            }
    }
    replay_result res = { 0 };
    for (int r = 0; r < pp; r++)
        if (t[r] > res.makespan) res.makespan = t[r];
    for (int r = 0; r < pp; r++) {
        res.bubble += (1 - busy[r] / res.makespan) / pp;
        res.idle += (res.makespan - busy[r]) / pp;
        double gaps = first[r] < 0 ? 0 : t[r] - first[r] - busy[r];
        if (gaps > res.span_idle) res.span_idle = gaps;
    }
    if (left > 0) /* stuck: the test fails */
        res.makespan = res.bubble = res.idle = res.span_idle = -1;
    free(first);
    free(end);
    free(next);
    free(t);
    free(busy);
    return res;
}

/* ---- Independent checks of a schedule ----------------------------------------- */

/* Each (chunk, mb): one F and one B or one I and one W, on the rank that holds the chunk;
 * the placement is loop (c % pp) or v (down the ranks and back up) as the schedule says. */
static bool complete(const ts_schedule *s)
{
    int cells = s->n_chunks * s->m;
    int *count = calloc(4 * (size_t)cells, sizeof(int));
    bool ok = s->placement == TS_PLACEMENT_LOOP || s->placement == TS_PLACEMENT_V;
    for (int c = 0; ok && c < s->n_chunks; c++) {
        int round = c / s->pp, pos = c % s->pp; /* its rank, computed here again */
        int rank = s->placement == TS_PLACEMENT_V && round % 2 ? s->pp - 1 - pos : pos;
        ok = ts_chunk_rank(s, c) == rank;
    }
    for (int r = 0; ok && r < s->pp; r++)
        for (int j = 0; j < s->n_actions[r]; j++) {
            ts_action a = s->actions[r][j];
            ok = ok && a.chunk >= 0 && a.chunk < s->n_chunks && ts_chunk_rank(s, a.chunk) == r &&
                 a.mb >= 0 && a.mb < s->m;
            if (ok) count[a.kind * cells + a.chunk * s->m + a.mb]++;
        }
    for (int j = 0; ok && j < cells; j++) {
        int f = count[j], b = count[cells + j], i = count[2 * cells + j], w = count[3 * cells + j];
        ok = f == 1 && ((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1));
    }
    free(count);
    return ok;
}

/* Peak activations on rank r counted from F until `release` (I or W; B always frees). */
static int peak_until(const ts_schedule *s, int r, ts_action_kind release)
{
    int held = 0, peak = 0;
    for (int j = 0; j < s->n_actions[r]; j++) {
        ts_action_kind k = s->actions[r][j].kind;
        held += k == TS_ACT_F ? 1 : (k == TS_ACT_B || k == release) ? -1 : 0;
        if (held > peak) peak = held;
    }
    return peak;
}

static bool same_lists(const ts_schedule *a, const ts_schedule *b)
{
    if (a->pp != b->pp || a->v != b->v || a->m != b->m || a->n_chunks != b->n_chunks)
        return false;
    for (int r = 0; r < a->pp; r++) {
        if (a->n_actions[r] != b->n_actions[r]) return false;
        for (int j = 0; j < a->n_actions[r]; j++) {
            ts_action x = a->actions[r][j], y = b->actions[r][j];
            if (x.kind != y.kind || x.chunk != y.chunk || x.mb != y.mb) return false;
        }
    }
    return true;
}

static bool round_trip(const ts_schedule *s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rt.csv", g_dir);
    ts_schedule back;
    if (ts_schedule_write_csv(s, path) != TS_OK) return false;
    if (ts_schedule_read_csv(&back, path, s->pp, s->v, s->m) != TS_OK) {
        fprintf(stderr, "  round trip: %s\n", ts_error_message());
        return false;
    }
    bool same = same_lists(s, &back);
    ts_schedule_free(&back);
    return same;
}

/* ---- Tests ---------------------------------------------------------------------- */

/* Every schedule over pp 1..8, v 1..4, m 1..16, with its own promises. */
static void test_schedule_grid(void)
{
    const char *names[] = { "gpipe", "1f1b", "interleaved-1f1b", "zb-h1" };
    int built = 0;
    for (int pp = 1; pp <= 8; pp++)
        for (int v = 1; v <= 4; v++)
            for (int m = 1; m <= 16; m++)
                for (int n = 0; n < 4; n++) {
                    bool interleaved = n == 2;
                    if (v > 1 && !interleaved) continue;
                    bool supported = !interleaved || v == 1 || m >= pp;
                    ts_schedule s;
                    ts_status st = ts_schedule_build(&s, names[n], pp, v, m);
                    if (!supported) {
                        CHECKF(st == TS_ERR && msg_has("needs at least"),
                               "%s pp=%d v=%d m=%d: %s", names[n], pp, v, m, ts_error_message());
                        continue;
                    }
                    CHECKF(st == TS_OK, "%s pp=%d v=%d m=%d: %s", names[n], pp, v, m,
                           ts_error_message());
                    if (st != TS_OK) continue;
                    built++;
                    CHECKF(complete(&s), "%s pp=%d v=%d m=%d incomplete", names[n], pp, v, m);
                    ts_schedule_report rep;
                    CHECK(ts_schedule_validate(&s, &rep) == TS_OK);
                    for (int r = 0; r < pp; r++) {
                        int peak = rep.peak_activations[r];
                        if (n == 0) CHECKF(peak == m, "gpipe peak %d != m %d", peak, m);
                        if (n == 1 || (n == 2 && v == 1))
                            CHECKF(peak == (pp - r < m ? pp - r : m),
                                   "1f1b pp=%d m=%d rank %d peak %d", pp, m, r, peak);
                        if (n == 3) {
                            /* Full activations (F until I) as 1F1B; W's inputs (F until W)
                             * at most p, the peak of 1F1B's first rank. */
                            int full = peak_until(&s, r, TS_ACT_I);
                            CHECKF(full <= pp - r, "zb-h1 pp=%d m=%d rank %d F-I peak %d", pp,
                                   m, r, full);
                            CHECKF(peak <= pp, "zb-h1 pp=%d m=%d rank %d F-W peak %d", pp, m, r,
                                   peak);
                        }
                    }
                    ts_schedule_report_free(&rep);
                    if (pp <= 4 && m <= 8)
                        CHECKF(round_trip(&s), "%s pp=%d v=%d m=%d", names[n], pp, v, m);
                    ts_schedule_free(&s);
                }
    printf("grid: %d schedules built and validated\n", built);
}

/* Interleaved: rank r holds chunks r + k*pp; a micro-batch's forwards on each rank go up
 * the chunks and its backwards down (so across ranks they visit 0..n_chunks-1). */
static void test_schedule_interleaved_placement(void)
{
    for (int pp = 1; pp <= 8; pp++)
        for (int v = 2; v <= 4; v++)
            for (int m = pp; m <= 16; m++) {
                ts_schedule s;
                if (ts_schedule_build(&s, "interleaved-1f1b", pp, v, m) != TS_OK) {
                    CHECKF(0, "pp=%d v=%d m=%d: %s", pp, v, m, ts_error_message());
                    continue;
                }
                bool ok = s.n_chunks == pp * v;
                for (int r = 0; r < pp; r++) {
                    int *last_f = malloc(sizeof(int) * (size_t)m);
                    int *last_b = malloc(sizeof(int) * (size_t)m);
                    for (int i = 0; i < m; i++) last_f[i] = -1, last_b[i] = s.n_chunks;
                    int holds = 0; /* bit k: local chunk k seen */
                    for (int j = 0; j < s.n_actions[r]; j++) {
                        ts_action a = s.actions[r][j];
                        ok = ok && a.chunk % pp == r && a.kind != TS_ACT_I && a.kind != TS_ACT_W;
                        holds |= 1 << (a.chunk / pp);
                        if (a.kind == TS_ACT_F) {
                            ok = ok && a.chunk > last_f[a.mb];
                            last_f[a.mb] = a.chunk;
                        } else {
                            ok = ok && a.chunk < last_b[a.mb];
                            last_b[a.mb] = a.chunk;
                        }
                    }
                    ok = ok && holds == (1 << v) - 1;
                    free(last_f);
                    free(last_b);
                }
                CHECKF(ok, "interleaved pp=%d v=%d m=%d placement/order", pp, v, m);
                ts_schedule_free(&s);
            }
}

/* Bubbles by replay: GPipe and 1F1B (p-1)/(m+p-1) with F=1, B=2; interleaved
 * (p-1)/(v*m+p-1) with F=1/v, B=2/v per chunk; ZB-H1 about a third of 1F1B's. */
static void test_schedule_bubbles(void)
{
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 16; m++) {
            double want = (double)(pp - 1) / (m + pp - 1);
            const double cost[4] = { 1, 2, 1, 1 };
            const char *names[] = { "gpipe", "1f1b" };
            for (int n = 0; n < 2; n++) {
                ts_schedule s;
                if (ts_schedule_build(&s, names[n], pp, 1, m) != TS_OK) {
                    CHECK(0);
                    continue;
                }
                replay_result res = replay(&s, cost);
                CHECKF(fabs(res.bubble - want) < 1e-12, "%s pp=%d m=%d bubble %.6f want %.6f",
                       names[n], pp, m, res.bubble, want);
                ts_schedule_free(&s);
            }
            for (int v = 2; v <= 4; v++) {
                if (m % pp != 0) continue; /* the classic analysis: m a multiple of p */
                const double cv[4] = { 1.0 / v, 2.0 / v, 1.0 / v, 1.0 / v };
                ts_schedule s;
                if (ts_schedule_build(&s, "interleaved-1f1b", pp, v, m) != TS_OK) {
                    CHECK(0);
                    continue;
                }
                double want_v = (double)(pp - 1) / (v * m + pp - 1);
                replay_result res = replay(&s, cv);
                CHECKF(fabs(res.bubble - want_v) < 1e-9,
                       "interleaved pp=%d v=%d m=%d bubble %.6f want %.6f", pp, v, m,
                       res.bubble, want_v);
                ts_schedule_free(&s);
            }
        }

    /* Interleaved with the lifted group size (m not a multiple of p): still better than
     * 1F1B. */
    for (int pp = 2; pp <= 8; pp++)
        for (int m = pp + 1; m <= 16; m++) {
            if (m % pp == 0) continue;
            const double c2[4] = { 0.5, 1, 0.5, 0.5 };
            ts_schedule s;
            if (ts_schedule_build(&s, "interleaved-1f1b", pp, 2, m) != TS_OK) continue;
            replay_result res = replay(&s, c2);
            CHECKF(res.bubble > 0 && res.bubble < (double)(pp - 1) / (m + pp - 1),
                   "interleaved pp=%d v=2 m=%d bubble %.4f not below 1F1B's", pp, m,
                   res.bubble);
            ts_schedule_free(&s);
        }

    /* ZB-H1 against 1F1B, both with F = I = W = 1 (so B = 2). */
    printf("zb-h1 vs 1f1b (F=I=W=1, B=2): bubble fraction and idle time per rank\n");
    const int cases[][2] = { { 2, 4 }, { 2, 8 }, { 4, 8 }, { 4, 12 }, { 4, 16 }, { 4, 32 },
                             { 8, 16 }, { 8, 24 }, { 8, 32 }, { 8, 64 }, { 3, 9 },  { 6, 18 } };
    const double cost[4] = { 1, 2, 1, 1 };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int pp = cases[k][0], m = cases[k][1];
        ts_schedule zb, ob;
        if (ts_schedule_build(&zb, "zb-h1", pp, 1, m) != TS_OK ||
            ts_schedule_build(&ob, "1f1b", pp, 1, m) != TS_OK) {
            CHECK(0);
            continue;
        }
        replay_result z = replay(&zb, cost), o = replay(&ob, cost);
        double frac = z.bubble / o.bubble, idle = z.idle / o.idle;
        printf("  p=%d m=%-3d 1f1b %.4f  zb-h1 %.4f  fraction ratio %.3f  idle ratio %.3f "
               "(idle %g vs %g; ideal zb-h1 (p-1)/(3m+p-1) = %.4f)\n",
               pp, m, o.bubble, z.bubble, frac, idle, z.idle, o.idle,
               (double)(pp - 1) / (3 * m + pp - 1));
        CHECKF(idle <= 0.4, "zb-h1 p=%d m=%d idle ratio %.3f", pp, m, idle);
        CHECKF(frac <= (m >= 3 * pp ? 0.4 : 0.42), "zb-h1 p=%d m=%d bubble ratio %.3f", pp, m,
               frac);
        ts_schedule_free(&zb);
        ts_schedule_free(&ob);
    }
}

/* ---- The generated schedules of issue 26 ----------------------------------------- */

typedef struct {
    const char *name;
    int v_lo, v_hi; /* the chunks per rank it takes, tested up to 4 */
} gen_spec;

static const gen_spec g_gens[] = {
    { "looped-bfs", 1, 4 }, { "interleaved-zb", 1, 4 }, { "zb-h2", 1, 1 },
    { "zb-v", 2, 2 },       { "dualpipe-v", 2, 2 },
};
#define N_GENS ((int)(sizeof g_gens / sizeof g_gens[0]))

/* The micro-batch rules, written here again: interleaved-zb (v >= 2) takes torch's m a
 * multiple of max(1, m / pp), dualpipe-v m >= 2pp; the others any m. */
static bool gen_supported(const char *name, int pp, int v, int m)
{
    if (strcmp(name, "interleaved-zb") == 0 && v > 1) {
        int rounds = m / pp > 1 ? m / pp : 1;
        return m % rounds == 0;
    }
    if (strcmp(name, "dualpipe-v") == 0) return m >= 2 * pp;
    return true;
}

static int n_overlaps(const ts_schedule *s, int r)
{
    int n = 0;
    for (int j = 0; j < s->n_actions[r]; j++) n += s->actions[r][j].overlap;
    return n;
}

/* Per-chunk costs of one rank's worth of work split over v chunks: F = I = W = 1/v,
 * B = I + W (so every schedule does 3 units per micro-batch and rank). */
static void uniform_costs(int v, double cost[4])
{
    cost[TS_ACT_F] = cost[TS_ACT_I] = cost[TS_ACT_W] = 1.0 / v;
    cost[TS_ACT_B] = 2.0 / v;
}

/* Every generated schedule over pp {1,2,3,4,8}, its v up to 4, m from 1 to 3pp+2: built
 * exactly where its rule allows (else the rule's message), complete on its placement,
 * replayed without getting stuck, with the activation peaks it promises. */
static void test_schedule_generated_grid(void)
{
    const int pps[] = { 1, 2, 3, 4, 8 };
    int built = 0, refused = 0;
    for (int g = 0; g < N_GENS; g++)
        for (int k = 0; k < 5; k++)
            for (int v = g_gens[g].v_lo; v <= g_gens[g].v_hi; v++)
                for (int m = 1; m <= 3 * pps[k] + 2; m++) {
                    const char *name = g_gens[g].name;
                    const int pp = pps[k];
                    ts_schedule s;
                    ts_error_clear();
                    ts_status st = ts_schedule_build(&s, name, pp, v, m);
                    if (!gen_supported(name, pp, v, m)) {
                        CHECKF(st == TS_ERR && (msg_has("multiple of its rounds") ||
                                                msg_has("at least 2 * pp")),
                               "%s pp=%d v=%d m=%d: %s", name, pp, v, m,
                               st == TS_OK ? "built" : ts_error_message());
                        if (st == TS_OK) ts_schedule_free(&s);
                        refused++;
                        continue;
                    }
                    CHECKF(st == TS_OK, "%s pp=%d v=%d m=%d: %s", name, pp, v, m,
                           ts_error_message());
                    if (st != TS_OK) continue;
                    built++;
                    const bool v_placed = strcmp(name, "zb-v") == 0 ||
                                          strcmp(name, "dualpipe-v") == 0;
                    CHECKF(s.placement == (v_placed ? TS_PLACEMENT_V : TS_PLACEMENT_LOOP) &&
                               s.v == v && s.m == m,
                           "%s pp=%d v=%d m=%d: placement %d", name, pp, v, m, s.placement);
                    CHECKF(complete(&s), "%s pp=%d v=%d m=%d incomplete", name, pp, v, m);
                    double cost[4];
                    uniform_costs(v, cost);
                    CHECKF(replay(&s, cost).makespan > 0, "%s pp=%d v=%d m=%d stuck", name, pp,
                           v, m);
                    ts_schedule_report rep;
                    CHECK(ts_schedule_validate(&s, &rep) == TS_OK);
                    for (int r = 0; r < pp && rep.peak_activations; r++) {
                        const int peak = rep.peak_activations[r];
                        if (g == 0) /* looped-bfs: everything in flight */
                            CHECKF(peak == v * m, "looped-bfs pp=%d v=%d m=%d rank %d peak %d",
                                   pp, v, m, r, peak);
                        if (g == 2) { /* zb-h2: 2p-1 (F until W), 2p-1-2r full (F until I) */
                            const int want = m < 2 * pp - 1 ? m : 2 * pp - 1;
                            const int full = peak_until(&s, r, TS_ACT_I);
                            CHECKF(peak == want && full <= 2 * pp - 1 - 2 * r,
                                   "zb-h2 pp=%d m=%d rank %d peak %d (want %d) F-I %d", pp, m,
                                   r, peak, want, full);
                        }
                        if (g == 3) { /* zb-v: 2p chunk activations = 1F1B's p on rank 0 */
                            const int want = m < pp ? 2 * m : 2 * pp;
                            CHECKF(peak <= want && (m < 2 * pp - 1 || peak == 2 * pp),
                                   "zb-v pp=%d m=%d rank %d peak %d (want %d)", pp, m, r,
                                   peak, want);
                        }
                        if (g == 4) /* dualpipe-v: overlapped pairs, zb-v's peak + 1 */
                            CHECKF(n_overlaps(&s, r) > 0 && peak == 2 * pp + 1,
                                   "dualpipe-v pp=%d m=%d rank %d: %d overlapped pairs, "
                                   "peak %d",
                                   pp, m, r, n_overlaps(&s, r), peak);
                        if (g == 1 && v == 1) /* interleaved-zb v = 1 is zb-h1 */
                            CHECKF(peak <= pp, "interleaved-zb v=1 pp=%d m=%d peak %d", pp, m,
                                   peak);
                    }
                    ts_schedule_report_free(&rep);
                    if (pp <= 4 && m <= 8)
                        CHECKF(round_trip(&s), "%s pp=%d v=%d m=%d round trip", name, pp, v, m);
                    ts_schedule_free(&s);
                }
    printf("generated grid: %d schedules built and validated, %d refused by their rule\n",
           built, refused);
}

/* One line of the report table: bubble and peaks of `name` at (pp, v, m). */
static void print_row(const char *name, int pp, int v, int m)
{
    ts_schedule s;
    if (ts_schedule_build(&s, name, pp, v, m) != TS_OK) {
        printf("  %-16s p=%d v=%d m=%-2d  refused: %s\n", name, pp, v, m, ts_error_message());
        return;
    }
    double cost[4];
    uniform_costs(v, cost);
    replay_result res = replay(&s, cost);
    ts_schedule_report rep;
    CHECK(ts_schedule_validate(&s, &rep) == TS_OK);
    char peaks[128];
    size_t len = 0;
    for (int r = 0; r < pp && rep.peak_activations; r++)
        len += (size_t)snprintf(peaks + len, sizeof peaks - len, "%s%d", r ? " " : "",
                                rep.peak_activations[r]);
    printf("  %-16s p=%d v=%d m=%-2d  bubble %.4f  idle %6.3f  gaps %5.3f  makespan %7.3f  "
           "peak [%s]\n",
           name, pp, v, m, res.bubble, res.idle, res.span_idle, res.makespan, peaks);
    ts_schedule_report_free(&rep);
    ts_schedule_free(&s);
}

/* Uniform-cost bubbles (F = I = W per rank's worth of layers, B = I + W, free links):
 * zb-h2 and zb-v run every rank without a gap from its first action to its last, the
 * step being the work plus the ramp they cannot avoid; interleaved-zb beats
 * interleaved-1f1b; looped-bfs has interleaving's (p-1)/(v*m+p-1). */
static void test_schedule_generated_bubbles(void)
{
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 3 * pp + 2; m++) {
            const double unit[4] = { 1, 2, 1, 1 }, half[4] = { 0.5, 1, 0.5, 0.5 };
            ts_schedule s;
            /* ZB-H2: from m = 2p-1 on, 3m units of work per rank plus the p-1 of the
             * ramp (rank r starts at r, the F chain, and ends p-1-r early), no gap. */
            if (ts_schedule_build(&s, "zb-h2", pp, 1, m) == TS_OK) {
                replay_result res = replay(&s, unit);
                if (m >= 2 * pp - 1)
                    CHECKF(res.makespan == 3 * m + pp - 1 && res.span_idle == 0 &&
                               fabs(res.idle - (pp - 1)) < 1e-9,
                           "zb-h2 pp=%d m=%d makespan %g (want %d) gaps %g idle %g", pp, m,
                           res.makespan, 3 * m + pp - 1, res.span_idle, res.idle);
                else
                    CHECKF(res.makespan > 0, "zb-h2 pp=%d m=%d stuck", pp, m);
                ts_schedule_free(&s);
            } else {
                CHECKF(0, "zb-h2 pp=%d m=%d: %s", pp, m, ts_error_message());
            }
            /* ZB-V, chunks of half a rank (F = I = W = 1/2): 3m units per rank, and the
             * ramp of the F chain down to rank p-1, (p-1)/2, no gap. */
            if (ts_schedule_build(&s, "zb-v", pp, 2, m) == TS_OK) {
                replay_result res = replay(&s, half);
                if (m >= 2 * pp - 1)
                    CHECKF(res.makespan == 3 * m + (pp - 1) * 0.5 && res.span_idle == 0,
                           "zb-v pp=%d m=%d makespan %g (want %g) gaps %g", pp, m,
                           res.makespan, 3 * m + (pp - 1) * 0.5, res.span_idle);
                else
                    CHECKF(res.makespan > 0, "zb-v pp=%d m=%d stuck", pp, m);
                ts_schedule_free(&s);
            } else {
                CHECKF(0, "zb-v pp=%d m=%d: %s", pp, m, ts_error_message());
            }
            for (int v = 2; v <= 4; v++) {
                double cv[4];
                uniform_costs(v, cv);
                ts_schedule zb, il, bfs;
                if (ts_schedule_build(&bfs, "looped-bfs", pp, v, m) == TS_OK) {
                    replay_result res = replay(&bfs, cv);
                    double want = (double)(pp - 1) / (v * m + pp - 1);
                    if (m >= pp)
                        CHECKF(fabs(res.bubble - want) < 1e-9,
                               "looped-bfs pp=%d v=%d m=%d bubble %.6f want %.6f", pp, v, m,
                               res.bubble, want);
                    ts_schedule_free(&bfs);
                } else {
                    CHECKF(0, "looped-bfs pp=%d v=%d m=%d: %s", pp, v, m, ts_error_message());
                }
                if (pp < 2 || !gen_supported("interleaved-zb", pp, v, m) || m < pp) continue;
                if (ts_schedule_build(&zb, "interleaved-zb", pp, v, m) != TS_OK ||
                    ts_schedule_build(&il, "interleaved-1f1b", pp, v, m) != TS_OK) {
                    CHECKF(0, "interleaved pp=%d v=%d m=%d: %s", pp, v, m, ts_error_message());
                    continue;
                }
                replay_result a = replay(&zb, cv), b = replay(&il, cv);
                CHECKF(a.makespan > 0 && a.bubble < b.bubble,
                       "interleaved-zb pp=%d v=%d m=%d bubble %.4f not below "
                       "interleaved-1f1b's %.4f",
                       pp, v, m, a.bubble, b.bubble);
                ts_schedule_free(&zb);
                ts_schedule_free(&il);
            }
        }

    /* Unequal costs, F = 1, I = 2, W = 1 (B = 3): each rank's idle is the paper's bubble,
     * (p-1)(F + I - W) = 2(p-1) for ZB-H1 and (p-1)(F + I - 2W) = p-1 for ZB-H2 (above
     * the ramp (p-1)F that one step cannot avoid, which is why they tie at F = I = W). */
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int m = 2 * pp; m <= 4 * pp; m += pp) {
            const double cost[4] = { 1, 3, 2, 1 };
            ts_schedule h1, h2;
            if (ts_schedule_build(&h1, "zb-h1", pp, 1, m) != TS_OK ||
                ts_schedule_build(&h2, "zb-h2", pp, 1, m) != TS_OK) {
                CHECK(0);
                continue;
            }
            replay_result a = replay(&h1, cost), b = replay(&h2, cost);
            CHECKF(fabs(a.idle - 2 * (pp - 1)) < 1e-9 && fabs(b.idle - (pp - 1)) < 1e-9,
                   "F=1 I=2 W=1 pp=%d m=%d: zb-h1 idle %g (want %d), zb-h2 idle %g (want %d)",
                   pp, m, a.idle, 2 * (pp - 1), b.idle, pp - 1);
            ts_schedule_free(&h1);
            ts_schedule_free(&h2);
        }

    printf("schedules at uniform costs (per rank's layers F = I = W = 1, B = 2; a chunk "
           "1/v of that): bubble = mean idle / makespan, gaps = most idle inside one "
           "rank's run, peak = ts_schedule_report's activations per rank (micro-batch x "
           "chunk)\n");
    const int cases[][2] = { { 2, 4 }, { 4, 8 }, { 8, 16 } };
    for (int k = 0; k < 3; k++) {
        const int pp = cases[k][0], m = cases[k][1];
        print_row("1f1b", pp, 1, m);
        print_row("zb-h1", pp, 1, m);
        print_row("zb-h2", pp, 1, m);
        print_row("interleaved-1f1b", pp, 2, m);
        print_row("interleaved-zb", pp, 2, m);
        print_row("looped-bfs", pp, 2, m);
        print_row("zb-v", pp, 2, m);
        print_row("dualpipe-v", pp, 2, m);
    }
}

/* Each rule's message, and the v = 1 equivalences. */
static void test_schedule_generated_errors(void)
{
    ts_schedule s, t;
    ts_error_clear();
    CHECK(ts_schedule_build(&s, "zb-v", 4, 3, 8) == TS_ERR &&
          msg_has("schedule \"zb-v\" needs parallel.virtual_stages = 2 (V placement: two "
                  "chunks per rank") &&
          msg_has("got 3"));
    CHECK(ts_schedule_build(&s, "zb-v", 4, 1, 8) == TS_ERR && msg_has("got 1"));
    CHECK(ts_schedule_build(&s, "dualpipe-v", 2, 4, 8) == TS_ERR &&
          msg_has("\"dualpipe-v\" needs parallel.virtual_stages = 2"));
    CHECK(ts_schedule_build(&s, "dualpipe-v", 4, 2, 7) == TS_ERR &&
          msg_has("needs at least 2 * pp = 8 micro-batches") && msg_has("got 7") &&
          msg_has("ScheduleDualPipeV"));
    CHECK(ts_schedule_build(&s, "interleaved-zb", 4, 2, 9) == TS_ERR &&
          msg_has("multiple of its rounds max(1, m / pp)") && msg_has("m = 9 has 2 rounds") &&
          msg_has("use m = 8 or 10"));
    CHECK(ts_schedule_build(&s, "zb-h2", 2, 2, 8) == TS_ERR &&
          msg_has("\"zb-h2\" runs one chunk per pipeline rank") && msg_has("looped-bfs") &&
          msg_has("zb-v"));
    CHECK(s.actions == NULL && s.n_actions == NULL);
    /* interleaved-zb with v = 1 is zb-h1 (any m; torch's class gives the same order
     * wherever its rule takes m). */
    for (int m = 1; m <= 9; m++) {
        CHECK(ts_schedule_build(&s, "interleaved-zb", 4, 1, m) == TS_OK);
        CHECK(ts_schedule_build(&t, "zb-h1", 4, 1, m) == TS_OK);
        CHECKF(same_lists(&s, &t), "interleaved-zb v=1 m=%d is not zb-h1", m);
        ts_schedule_free(&s);
        ts_schedule_free(&t);
    }
    /* The first and last actions of torch's ZB-V for pp = 2, m = 4 (rank 1:
     * 1F0,2F0,1F1,2F1,2I0,2W0,...,1W2,2W3,1W3) and a DualPipeV pair. */
    CHECK(ts_schedule_build(&s, "zb-v", 2, 2, 4) == TS_OK);
    CHECK(s.n_actions[1] == 24 && s.actions[1][1].chunk == 2 && s.actions[1][4].kind == TS_ACT_I &&
          s.actions[1][23].kind == TS_ACT_W && s.actions[1][23].chunk == 1);
    ts_schedule_free(&s);
    CHECK(ts_schedule_build(&s, "dualpipe-v", 2, 2, 4) == TS_OK);
    /* rank 0: 0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,... */
    CHECK(s.actions[0][7].overlap && s.actions[0][7].kind == TS_ACT_F &&
          s.actions[0][7].chunk == 0 && s.actions[0][7].mb == 3 &&
          s.actions[0][8].kind == TS_ACT_B && s.actions[0][8].chunk == 3 &&
          s.actions[0][8].mb == 1);
    ts_schedule_free(&s);
}

static void expect_csv_err(const char *text, int pp, int v, int m, const char *frag1,
                           const char *frag2)
{
    const char *path = write_file("bad.csv", text);
    ts_schedule s;
    ts_error_clear();
    ts_status st = ts_schedule_build(&s, path, pp, v, m);
    CHECKF(st == TS_ERR, "expected an error for:\n%s", text);
    if (st == TS_OK) ts_schedule_free(&s);
    CHECKF(msg_has(frag1), "message lacks '%s': %s", frag1, ts_error_message());
    if (frag2) CHECKF(msg_has(frag2), "message lacks '%s': %s", frag2, ts_error_message());
}

static void test_schedule_csv(void)
{
    /* The checked-in example: 1F1B for pp = 2, m = 4. */
    const char *src = getenv("TS_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/schedules/example_1f1b_pp2.csv", src ? src : ".");
    ts_schedule ex, ref;
    CHECKF(ts_schedule_build(&ex, path, 2, 1, 4) == TS_OK, "%s", ts_error_message());
    CHECK(ts_schedule_build(&ref, "1f1b", 2, 1, 4) == TS_OK);
    CHECK(same_lists(&ex, &ref));
    CHECK(strstr(ex.name, "example_1f1b_pp2.csv") != NULL);
    ts_schedule_free(&ex);
    ts_schedule_free(&ref);

    /* Spaces, empty cells (torch's idle steps), CRLF, a trailing blank line. */
    const char *loose =
        write_file("loose.csv", " 0F0 ,, 0F1,0B0 , 0B1\r\n,1F0, 1B0,,1F1,1B1,\r\n\n");
    ts_schedule s;
    CHECKF(ts_schedule_build(&s, loose, 2, 1, 2) == TS_OK, "%s", ts_error_message());
    if (s.actions) {
        CHECK(s.n_actions[0] == 4 && s.n_actions[1] == 4);
        CHECK(s.actions[1][1].kind == TS_ACT_B && s.actions[1][1].chunk == 1);
        ts_schedule_free(&s);
    }

    /* Split backward round trip by hand: I and W cells. */
    const char *split = write_file("split.csv", "0F0,0I0,0W0\n1F0,1I0,1W0\n");
    CHECKF(ts_schedule_build(&s, split, 2, 1, 1) == TS_OK, "%s", ts_error_message());
    if (s.actions) {
        CHECK(s.actions[0][1].kind == TS_ACT_I && s.actions[0][2].kind == TS_ACT_W);
        ts_schedule_free(&s);
    }

    /* A long path keeps its end in the name. */
    const char *longname = write_file("a_schedule_file_with_a_rather_long_name_for_the_name_"
                                      "field_of_sixty_four_bytes.csv",
                                      "0F0,0B0\n");
    CHECKF(ts_schedule_build(&s, longname, 1, 1, 1) == TS_OK, "%s", ts_error_message());
    CHECK(strlen(s.name) == sizeof s.name - 1 && strncmp(s.name, "...", 3) == 0 &&
          strstr(s.name, "sixty_four_bytes.csv") != NULL);
    ts_schedule_free(&s);
    unlink(longname);

    expect_csv_err("0F0,0X0,0B0\n1F0,1B0\n", 2, 1, 1, "bad.csv:1: cell '0X0'", "0F1");
    expect_csv_err("0F0,0B0\n1F0,1B0,F1\n", 2, 1, 1, "bad.csv:2: cell 'F1'", NULL);
    expect_csv_err("0F0,0B0\n1F0,0B1\n", 2, 1, 2, "bad.csv:2: cell '0B1'", "rank 0");
    expect_csv_err("0F0,0SEND_F0\n1F0\n", 2, 1, 1, "cell '0SEND_F0'", "compute-only");
    expect_csv_err("0F0,0B0\n", 2, 1, 1, "1 line(s)", "pp = 2");
    expect_csv_err("0F0,0B0\n1F0,1B0\n2F0\n", 2, 1, 1, "bad.csv:3", "more lines");
    expect_csv_err("0F0,0B0\n1F0,1B0\n", 2, 2, 1, "found 2 stages", "virtual_stages = 1");
    expect_csv_err("0F0,0B0,2F0,2B0\n1F0,1B0,3F0,3B0\n", 2, 1, 1, "found 4 stages",
                   "virtual_stages = 2");
    expect_csv_err("0F0,0B0\n1F0,1B0,1F5,1B5\n", 2, 1, 2, "cell '1F5'", "2 micro-batches");
    /* Missing micro-batch 1 on rank 1: caught by validation. */
    expect_csv_err("0F0,0F1,0B0,0B1\n1F0,1B0\n", 2, 1, 2, "bad.csv: incomplete", "1F1");
    /* Rank 0 waits for the gradient of mb 0 before sending mb 1 on; rank 1 wants mb 1
     * first: */
    expect_csv_err("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", 2, 1, 2, "schedule deadlocks",
                   "rank 0 waits for B(chunk 1, mb 0) at its action 2 (0B0); rank 1 waits "
                   "for F(chunk 0, mb 1) at its action 1 (1F1)");
    expect_csv_err("0F0,0B0,0I0,0W0\n1F0,1B0\n", 2, 1, 1, "bad.csv: rank 0 mixes", NULL);
    expect_csv_err("0B0,0F0\n1F0,1B0\n", 2, 1, 1, "before its forward", NULL);
    expect_csv_err("0F0,0W0,0I0\n1F0,1B0\n", 2, 1, 1, "before its input-gradient", NULL);
    expect_csv_err("0F0,0F0,0B0\n1F0,1B0\n", 2, 1, 1, "appears twice", NULL);
    expect_csv_err("0F0,0I0\n1F0,1B0\n", 2, 1, 1, "needs both I and W", NULL);

    ts_error_clear();
    CHECK(ts_schedule_build(&s, "/nonexistent/s.csv", 2, 1, 1) == TS_ERR &&
          msg_has("cannot open schedule CSV"));
}

static void test_schedule_build_errors(void)
{
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "gpipe", 2, 2, 4) == TS_ERR && msg_has("interleaved-1f1b"));
    CHECK(ts_schedule_build(&s, "zb-h1", 2, 3, 4) == TS_ERR && msg_has("virtual_stages = 3"));
    CHECK(ts_schedule_build(&s, "pipedream", 2, 1, 4) == TS_ERR && msg_has("unknown"));
    CHECK(ts_schedule_build(&s, "1f1b", 0, 1, 4) == TS_ERR);
    CHECK(ts_schedule_build(&s, "interleaved-1f1b", 4, 2, 3) == TS_ERR &&
          msg_has("at least 4 micro-batches") && msg_has("global_batch"));
    CHECK(s.actions == NULL && s.n_actions == NULL); /* nothing half-built comes back */
    /* v = 1 interleaved is plain 1F1B. */
    ts_schedule a, b;
    CHECK(ts_schedule_build(&a, "interleaved-1f1b", 4, 1, 6) == TS_OK);
    CHECK(ts_schedule_build(&b, "1f1b", 4, 1, 6) == TS_OK);
    CHECK(same_lists(&a, &b));
    ts_schedule_free(&a);
    ts_schedule_free(&b);
    /* The validator on a hand-made list with a chunk on the wrong rank. */
    ts_action r0[] = { { TS_ACT_F, 1, 0, false }, { TS_ACT_B, 1, 0, false } }, r1[] = { { TS_ACT_F, 0, 0, false } };
    ts_action *lists[] = { r0, r1 };
    int n[] = { 2, 1 };
    ts_schedule h = { .name = "hand", .pp = 2, .v = 1, .m = 1, .n_chunks = 2, .chunk_rank = (int[]){0, 1}, .n_actions = n,
                      .actions = lists };
    CHECK(ts_schedule_validate(&h, NULL) == TS_ERR && msg_has("lives on pipeline rank 1"));
    char cell[32];
    ts_action w = { TS_ACT_W, 12, 3, false };
    CHECK(strcmp(ts_action_cell(cell, sizeof cell, w), "12W3") == 0);
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_test_schedule");
    test_schedule_grid();
    test_schedule_interleaved_placement();
    test_schedule_bubbles();
    test_schedule_generated_grid();
    test_schedule_generated_bubbles();
    test_schedule_generated_errors();
    test_schedule_csv();
    test_schedule_build_errors();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
