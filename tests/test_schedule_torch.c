/* torch.distributed.pipelining's seven schedules, as its own _dump_csv writes them
 * (tests/schedules/torch/, made by make_torch_schedules.py there with torch 2.15): every
 * fixture reads with ts_schedule_read_csv (pp, v, m from its name), validates, has the
 * placement torch uses (V for ZBV and DualPipeV, loop for the others), DualPipeV's
 * overlapped pairs survive, and the file round-trips through ts_schedule_write_csv.
 * Where tessera builds the same schedule by name, the two are compared. Also the
 * errors of the CSV reader's placement and pair paths. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/schedule.h"
#include "test_util.h"

static char g_dir[256];

/* How a fixture is compared with tessera's built-in schedule of the same name. */
typedef enum {
    CMP_NONE,    /* tessera has no such built-in */
    CMP_ASSERT,  /* identical action lists and placement: asserted */
    CMP_REPORT,  /* they differ (a different but valid order): the first difference is
                    printed, nothing asserted */
    CMP_PENDING, /* the built-in comes with another branch: reported (not asserted) once
                    ts_schedule_kind_from_name knows it, skipped before */
} compare_mode;

typedef struct {
    const char *prefix;  /* file name up to "_pp": make_torch_schedules.py's fixture_name */
    ts_placement placement;
    bool pairs;          /* has (a;b)OVERLAP_F_B cells */
    const char *tessera; /* tessera's built-in of the same schedule, or NULL */
    compare_mode cmp;
} torch_schedule;

/* Fixture -> tessera built-in: every one of torch's seven orders is tessera's own built-in
 * of the same name action for action (asserted). torch's ZB-V/DualPipeV are the only
 * V-placement schedules here. */
static const torch_schedule k_schedules[] = {
    { "gpipe", TS_PLACEMENT_LOOP, false, "gpipe", CMP_ASSERT },
    { "1f1b", TS_PLACEMENT_LOOP, false, "1f1b", CMP_ASSERT },
    { "interleaved1f1b", TS_PLACEMENT_LOOP, false, "interleaved-1f1b", CMP_ASSERT },
    { "loopedbfs", TS_PLACEMENT_LOOP, false, "looped-bfs", CMP_ASSERT },
    { "interleavedzerobubble", TS_PLACEMENT_LOOP, false, "interleaved-zb", CMP_ASSERT },
    { "zbvzerobubble", TS_PLACEMENT_V, false, "zb-v", CMP_ASSERT },
    { "dualpipev", TS_PLACEMENT_V, true, "dualpipe-v", CMP_ASSERT },
};
enum { N_SCHEDULES = sizeof k_schedules / sizeof k_schedules[0] };

static bool msg_has(const char *needle) { return strstr(ts_error_message(), needle) != NULL; }

static bool same_action(ts_action x, ts_action y)
{
    return x.kind == y.kind && x.chunk == y.chunk && x.mb == y.mb && x.overlap == y.overlap;
}

/* Whether a and b are the same schedule (shape, placement, every action with its
 * overlap flag); when not, the first difference into why. */
static bool same_schedule(const ts_schedule *a, const ts_schedule *b, char *why, size_t size)
{
    if (a->pp != b->pp || a->v != b->v || a->m != b->m || a->n_chunks != b->n_chunks) {
        snprintf(why, size, "shape pp/v/m %d/%d/%d vs %d/%d/%d", a->pp, a->v, a->m, b->pp, b->v,
                 b->m);
        return false;
    }
    for (int c = 0; c < a->n_chunks; c++)
        if (a->chunk_rank[c] != b->chunk_rank[c]) {
            snprintf(why, size, "chunk %d on rank %d vs %d", c, a->chunk_rank[c],
                     b->chunk_rank[c]);
            return false;
        }
    for (int r = 0; r < a->pp; r++) {
        int n = a->n_actions[r] < b->n_actions[r] ? a->n_actions[r] : b->n_actions[r];
        for (int j = 0; j < n; j++)
            if (!same_action(a->actions[r][j], b->actions[r][j])) {
                char x[32], y[32];
                snprintf(why, size, "rank %d action %d: %s%s vs %s%s", r, j + 1,
                         ts_action_cell(x, sizeof x, a->actions[r][j]),
                         a->actions[r][j].overlap ? " (paired)" : "",
                         ts_action_cell(y, sizeof y, b->actions[r][j]),
                         b->actions[r][j].overlap ? " (paired)" : "");
                return false;
            }
        if (a->n_actions[r] != b->n_actions[r]) {
            snprintf(why, size, "rank %d has %d vs %d actions", r, a->n_actions[r],
                     b->n_actions[r]);
            return false;
        }
    }
    return true;
}

static int count_pairs(const ts_schedule *s)
{
    int n = 0;
    for (int r = 0; r < s->pp; r++)
        for (int j = 0; j < s->n_actions[r]; j++) n += s->actions[r][j].overlap;
    return n;
}

/* The table row of file `name` ("<prefix>_pp<P>_v<V>_m<M>.csv"), its pp, v, m; NULL if
 * the name does not parse or names no schedule of the table. */
static const torch_schedule *parse_name(const char *name, int *pp, int *v, int *m)
{
    const char *at = strstr(name, "_pp");
    if (!at) return NULL;
    char tail[8];
    if (sscanf(at, "_pp%d_v%d_m%d%7s", pp, v, m, tail) != 4 || strcmp(tail, ".csv") != 0)
        return NULL;
    for (int k = 0; k < N_SCHEDULES; k++)
        if (strlen(k_schedules[k].prefix) == (size_t)(at - name) &&
            strncmp(name, k_schedules[k].prefix, (size_t)(at - name)) == 0)
            return &k_schedules[k];
    return NULL;
}

static void compare_builtin(const char *name, const torch_schedule *t, const ts_schedule *s)
{
    if (t->cmp == CMP_NONE) return;
    if (t->cmp == CMP_PENDING && ts_schedule_kind_from_name(t->tessera) < 0) {
        printf("%s: tessera has no built-in '%s' on this branch yet: not compared\n", name,
               t->tessera);
        return;
    }
    ts_schedule ours;
    ts_status st = ts_schedule_build(&ours, t->tessera, s->pp, s->v, s->m);
    if (t->cmp == CMP_ASSERT) CHECKF(st == TS_OK, "%s: build %s: %s", name, t->tessera, ts_error_message());
    if (st != TS_OK) {
        printf("%s: tessera's %s cannot build pp=%d v=%d m=%d: %s\n", name, t->tessera, s->pp,
               s->v, s->m, ts_error_message());
        return;
    }
    char why[256];
    bool same = same_schedule(s, &ours, why, sizeof why);
    if (t->cmp == CMP_ASSERT)
        CHECKF(same, "%s differs from tessera's %s: torch vs tessera: %s", name, t->tessera, why);
    else if (same)
        printf("%s: matches tessera's %s\n", name, t->tessera);
    else
        printf("%s: differs from tessera's %s; first difference (torch vs tessera): %s\n", name,
               t->tessera, why);
    ts_schedule_free(&ours);
}

/* One fixture: read, validate, placement, pairs, round trip, the built-in. */
static void check_fixture(const char *dir, const char *name, int seen[N_SCHEDULES])
{
    int pp = 0, v = 0, m = 0;
    const torch_schedule *t = parse_name(name, &pp, &v, &m);
    CHECKF(t != NULL, "%s: not <schedule>_pp<P>_v<V>_m<M>.csv of a schedule in k_schedules", name);
    if (!t) return;
    seen[t - k_schedules]++;
    char path[1024], back_path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ts_schedule s, back;
    ts_error_clear();
    if (ts_schedule_read_csv(&s, path, pp, v, m) != TS_OK) {
        CHECKF(false, "%s: %s", name, ts_error_message());
        return;
    }
    ts_schedule_report rep;
    CHECKF(ts_schedule_validate(&s, &rep) == TS_OK, "%s: %s", name, ts_error_message());
    ts_schedule_report_free(&rep);
    CHECKF(s.placement == t->placement, "%s: placement %s, torch uses %s", name,
           ts_placement_names[s.placement], ts_placement_names[t->placement]);
    for (int c = 0; c < s.n_chunks; c++)
        CHECKF(s.chunk_rank[c] == ts_placement_rank(t->placement, c, pp),
               "%s: chunk %d on rank %d", name, c, s.chunk_rank[c]);
    int pairs = count_pairs(&s);
    CHECKF(t->pairs ? pairs > 0 : pairs == 0, "%s: %d overlapped pairs", name, pairs);

    snprintf(back_path, sizeof back_path, "%s/back.csv", g_dir);
    CHECKF(ts_schedule_write_csv(&s, back_path) == TS_OK, "%s: write: %s", name, ts_error_message());
    if (ts_schedule_read_csv(&back, back_path, pp, v, m) == TS_OK) {
        char why[256] = "";
        CHECKF(same_schedule(&s, &back, why, sizeof why), "%s: round trip changed it: %s", name,
               why);
        ts_schedule_free(&back);
    } else {
        CHECKF(false, "%s: reading the written copy back: %s", name, ts_error_message());
    }
    compare_builtin(name, t, &s);
    ts_schedule_free(&s);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_torch_fixtures(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    char dir[768];
    snprintf(dir, sizeof dir, "%s/tests/schedules/torch", src ? src : ".");
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s (TS_SOURCE_DIR)", dir);
    if (!d) return;
    /* Sorted, so the printed comparisons come in a stable order. */
    char *names[128];
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < 128;) {
        size_t len = strlen(de->d_name);
        if (len > 4 && strcmp(de->d_name + len - 4, ".csv") == 0) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    int seen[N_SCHEDULES] = { 0 };
    for (int k = 0; k < n; k++) {
        check_fixture(dir, names[k], seen);
        free(names[k]);
    }
    /* 27 = 7 schedules x pp {2, 4} x m {4, 8}, less DualPipeV at pp = 4, m = 4 (torch
     * wants at least as many micro-batches as its 8 stages). */
    CHECKF(n == 27, "%d fixtures in %s, expected 27", n, dir);
    for (int k = 0; k < N_SCHEDULES; k++)
        CHECKF(seen[k] >= 3, "%s: %d fixtures", k_schedules[k].prefix, seen[k]);
}

/* ---- The CSV reader's placement and pair paths --------------------------------------- */

static void expect_err(const char *text, int pp, int v, int m, const char *frag1,
                       const char *frag2)
{
    const char *path = ts_test_write_file(g_dir, "bad.csv", text);
    ts_schedule s;
    ts_error_clear();
    ts_status st = ts_schedule_read_csv(&s, path, pp, v, m);
    CHECKF(st == TS_ERR, "expected an error for:\n%s", text);
    if (st == TS_OK) ts_schedule_free(&s);
    CHECKF(msg_has(frag1), "message lacks '%s': %s", frag1, ts_error_message());
    if (frag2) CHECKF(msg_has(frag2), "message lacks '%s': %s", frag2, ts_error_message());
}

static void test_csv_placement_and_pair_errors(void)
{
    /* A V placement by hand (pp = 2: rank 0 holds 0 and 3, rank 1 holds 1 and 2), one
     * overlapped pair: read as V, the pair as two actions, the first marked. */
    const char *ok = ts_test_write_file(g_dir, "v.csv",
                                        "0F0,3F0,3B0,(0F1;0B0)OVERLAP_F_B,3F1,3B1,0B1\n"
                                        "1F0,2F0,2B0,1B0,1F1,2F1,2B1,1B1\n");
    ts_schedule s;
    ts_error_clear();
    CHECKF(ts_schedule_read_csv(&s, ok, 2, 2, 2) == TS_OK, "%s", ts_error_message());
    if (s.actions) {
        CHECK(s.placement == TS_PLACEMENT_V && s.chunk_rank[3] == 0 && s.chunk_rank[2] == 1);
        CHECK(s.n_actions[0] == 8 && s.actions[0][3].overlap && !s.actions[0][4].overlap);
        CHECK(s.actions[0][3].kind == TS_ACT_F && s.actions[0][3].chunk == 0 &&
              s.actions[0][3].mb == 1 && s.actions[0][4].kind == TS_ACT_B);
        ts_schedule_free(&s);
    }

    /* A stage on two lines. */
    expect_err("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0,3F0\n", 2, 2, 1, "bad.csv:2: cell '3F0'",
               "stage 3 is on line 1 (pipeline rank 0) too");
    /* Malformed pairs: no suffix, one action, three, an empty half, a bad half. */
    expect_err("(0F0;0B0)OVERLAP\n1F0,1B0\n", 2, 1, 1, "bad.csv:1: cell '(0F0;0B0)OVERLAP'",
               "a pair cell is (<action>;<action>)OVERLAP_F_B");
    expect_err("(0F0)OVERLAP_F_B,0B0\n1F0,1B0\n", 2, 1, 1, "cell '(0F0)OVERLAP_F_B'",
               "a pair cell is");
    expect_err("(0F1;0B0;0F2)OVERLAP_F_B\n1F0,1B0\n", 2, 1, 3, "cell '(0F1;0B0;0F2)OVERLAP_F_B'",
               "a pair cell is");
    expect_err("0F0,(0F1;)OVERLAP_F_B\n1F0,1B0\n", 2, 1, 2, "cell '(0F1;)OVERLAP_F_B'",
               "expected <stage><F|B|I|W><micro-batch>");
    expect_err("0F0,(0F1;0X0)OVERLAP_F_B\n1F0,1B0\n", 2, 1, 2, "cell '(0F1;0X0)OVERLAP_F_B'",
               "expected <stage><F|B|I|W><micro-batch>");
    expect_err("0F0,(0F1;0B0)overlap_f_b\n1F0,1B0\n", 2, 1, 2, "cell '(0F1;0B0)overlap_f_b'",
               "a pair cell is");
    /* A pair with a W, and two forwards: the validator refuses them. */
    expect_err("0F0,0I0,(0F1;0W0)OVERLAP_F_B,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n", 2, 1, 2,
               "rank 0 action 3 (0F1)", "an overlapped pair is a forward and a backward");
    expect_err("(0F0;0F1)OVERLAP_F_B,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 1, 2, "rank 0 action 1 (0F0)",
               "an overlapped pair");
    /* A missing stage: 0, 1 and 3 of pp = 2 x v = 2. */
    expect_err("0F0,3F0,3B0,0B0\n1F0,1B0\n", 2, 2, 1, "stage 2 appears on no line",
               "stages 0..3");
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_test_schedule_torch");
    test_torch_fixtures();
    test_csv_placement_and_pair_errors();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
