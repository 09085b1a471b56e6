/* parallel.recompute = "auto" (pipeline/memory.h): the cap rule of ts_memory_peak_sets
 * and the choice of caps by ts_memory_auto_keep_selective, on built schedules and a synthetic rank
 * whose chunks hold 1 MiB per activation set and nothing else worth counting.
 *   test_cap_bounds: keep >= the peak without recompute is "none", keep 0 is "full",
 *     for every built schedule and rank (the same peaks, stashes and decisions);
 *   test_cap_1f1b: 1F1B pp 4 m 8 holds p - r sets on rank r; a cap k below that holds
 *     k + 1 (the recomputed micro-batch's set comes back for its backward) and
 *     recomputes exactly the micro-batches worked out by hand for rank 0, k = 2;
 *   test_choice_per_rank: a room between "full" and "none" of rank 0: rank 0
 *     recomputes more micro-batches than rank 3 (which holds one set and recomputes
 *     none), every rank fits, a room below "full" is refused, and the choice is
 *     described per chunk as the trainer logs it;
 *   test_choice_selective: with the chunks' selective sizes (half a set each) auto makes
 *     a chunk selective before any cap comes down: a room that selective fits keeps
 *     every set, a smaller one lowers caps of the selective chunk, a room that none fits
 *     changes nothing; the chunk saving most goes first, a chunk saving nothing never,
 *     a rebuilt area that outweighs the saving is undone; the log line names it. */
#include <string.h>

#include "pipeline/memory.h"
#include "pipeline/schedule.h"
#include "test_util.h"

enum { MAXC = 16, MAXM = 16 };

/* The peaks, stashes, counts and decisions of rank r under (mode, keep). */
typedef struct {
    int pa[MAXC], ps[MAXC], nr[MAXC];
    bool rec[MAXC * MAXM];
} walk;

static void run_walk(const ts_schedule *s, int mode, const int *keep, int r, walk *w)
{
    memset(w, 0, sizeof *w);
    ts_memory_peak_sets(s, mode, keep, r, w->pa, w->ps, w->nr, w->rec);
}

static bool same_walk(const walk *a, const walk *b) { return memcmp(a, b, sizeof *a) == 0; }

static void test_cap_bounds(void)
{
    const struct { const char *name; int pp, v, m; } cases[] = {
        {"gpipe", 4, 1, 8}, {"1f1b", 4, 1, 8}, {"1f1b", 2, 1, 3}, {"zb-h1", 4, 1, 8},
        {"interleaved-1f1b", 2, 2, 4}, {"interleaved-1f1b", 4, 2, 8}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ts_schedule s;
        CHECK(ts_schedule_build(&s, cases[k].name, cases[k].pp, cases[k].v, cases[k].m) == TS_OK);
        for (int r = 0; r < s.pp; r++) {
            walk none, full, capped;
            run_walk(&s, TS_RECOMPUTE_NONE, NULL, r, &none);
            run_walk(&s, TS_RECOMPUTE_FULL, NULL, r, &full);
            int keep[MAXC];
            memcpy(keep, none.pa, sizeof keep);
            run_walk(&s, TS_RECOMPUTE_AUTO, keep, r, &capped);
            CHECKF(same_walk(&capped, &none), "%s pp %d rank %d: keep = peak is not none",
                   cases[k].name, s.pp, r);
            for (int c = 0; c < MAXC; c++) keep[c] += 5; /* above the peak: still none */
            run_walk(&s, TS_RECOMPUTE_AUTO, keep, r, &capped);
            CHECK(same_walk(&capped, &none));
            memset(keep, 0, sizeof keep);
            run_walk(&s, TS_RECOMPUTE_AUTO, keep, r, &capped);
            CHECKF(same_walk(&capped, &full), "%s pp %d rank %d: keep = 0 is not full",
                   cases[k].name, s.pp, r);
            for (int c = 0; c < s.n_chunks; c++)
                if (ts_chunk_rank(&s, c) == r) CHECK(full.nr[c] == s.m && none.nr[c] == 0);
        }
        ts_schedule_free(&s);
    }
}

static void test_cap_1f1b(void)
{
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "1f1b", 4, 1, 8) == TS_OK);
    for (int r = 0; r < 4; r++) {
        walk w;
        run_walk(&s, TS_RECOMPUTE_NONE, NULL, r, &w);
        CHECKF(w.pa[r] == 4 - r, "rank %d holds %d sets without recompute, not p - r", r,
               w.pa[r]);
        for (int k = 1; k < 4 - r; k++) {
            int keep[MAXC] = {0};
            keep[r] = k;
            run_walk(&s, TS_RECOMPUTE_AUTO, keep, r, &w);
            CHECKF(w.pa[r] == k + 1 && w.nr[r] > 0 && w.nr[r] < 8,
                   "rank %d cap %d: peak %d, %d recomputed", r, k, w.pa[r], w.nr[r]);
        }
    }
    /* Rank 0, cap 2: F0 F1 kept, F2 F3 over the cap; B0 frees one, F4 kept; B1, F5 kept;
     * B2 (replayed); F6 over; B3; F7 over: micro-batches 2, 3, 6, 7 recompute. */
    int keep[MAXC] = {2};
    walk w;
    run_walk(&s, TS_RECOMPUTE_AUTO, keep, 0, &w);
    const bool want[8] = {false, false, true, true, false, false, true, true};
    CHECK(memcmp(w.rec, want, sizeof want) == 0);
    CHECK(w.nr[0] == 4 && w.pa[0] == 3);
    ts_schedule_free(&s);
}

/* A rank whose chunks hold 1 MiB per activation set; the pipeline slots (one element
 * per micro-batch) and the token ids are a few bytes, parameters and BLAS none. */
static void synthetic(const ts_schedule *s, ts_memory_shape *sh, ts_memory_holdings *h,
                      double *acts, double *stash)
{
    for (int c = 0; c < s->n_chunks; c++) {
        acts[c] = 1048576.0;
        stash[c] = 0.0;
    }
    *sh = (ts_memory_shape){.micro_batch = 1, .seq_len = 1, .n_embd = 1, .pp = s->pp,
                            .n_chunks = s->n_chunks, .chunk_rank = s->chunk_rank, .m = s->m,
                            .dp = 1, .act_bytes = 4};
    *h = (ts_memory_holdings){.act_bytes = acts, .stash_bytes = stash};
}

static void test_choice_per_rank(void)
{
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "1f1b", 4, 1, 8) == TS_OK);
    ts_memory_shape sh;
    ts_memory_holdings h;
    double acts[MAXC], stash[MAXC];
    synthetic(&s, &sh, &h, acts, stash);
    /* Room for two sets and change: between rank 0's full (1 set) and none (4 sets). */
    const double room = 2.5 * 1048576.0;
    int keep[MAXC] = {0}, pa[MAXC] = {0}, ps[MAXC] = {0}, nr[MAXC] = {0};
    int recomputed[4];
    for (int r = 0; r < 4; r++) {
        ts_rank_memory est;
        CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, r, room, keep, NULL, pa, ps, nr, &est));
        CHECKF(est.total - est.blas <= room, "rank %d: %.0f bytes over the room", r,
               est.total - est.blas);
        CHECK(pa[r] <= 2);
        recomputed[r] = nr[r];
    }
    CHECKF(recomputed[0] > recomputed[3], "rank 0 recomputes %d, rank 3 %d", recomputed[0],
           recomputed[3]);
    CHECK(recomputed[3] == 0 && keep[3] == 1); /* one set in flight: fits as is */
    CHECK(recomputed[2] == 0 && keep[2] == 2); /* two sets fit too */
    CHECK(keep[0] == 1 && keep[1] == 1 && recomputed[0] >= recomputed[1] && recomputed[1] > 0);
    char line[512];
    ts_memory_describe_keep_selective(&s, 0, keep, NULL, line, sizeof line);
    char want[128];
    snprintf(want, sizeof want, "chunk 0 keeps 1 of 4 in flight (recomputes %d of 8 micro-batches)",
             recomputed[0]);
    CHECKF(strcmp(line, want) == 0, "'%s'", line);
    /* Below one set, even full recompute does not fit: refused, with full's numbers. */
    ts_rank_memory est;
    CHECK(!ts_memory_auto_keep_selective(&s, &sh, &h, 0, 0.5 * 1048576.0, keep, NULL, pa, ps, nr, &est));
    CHECK(keep[0] == 0 && nr[0] == 8 && pa[0] == 1);
    ts_schedule_free(&s);

    /* Two chunks per rank (interleaved, v = 2): the cap comes off the chunk holding the
     * most, the lower chunk first on a tie, and the result fits. */
    CHECK(ts_schedule_build(&s, "interleaved-1f1b", 2, 2, 4) == TS_OK);
    synthetic(&s, &sh, &h, acts, stash);
    walk none;
    run_walk(&s, TS_RECOMPUTE_NONE, NULL, 0, &none);
    const double all = (none.pa[0] + none.pa[2]) * 1048576.0;
    ts_rank_memory e;
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, all - 0.5 * 1048576.0, keep, NULL, pa, ps, nr, &e));
    CHECK(e.total - e.blas <= all - 0.5 * 1048576.0);
    CHECK(nr[0] + nr[2] > 0 && (keep[0] < none.pa[0] || keep[2] < none.pa[2]));
    ts_schedule_free(&s);
}

/* The synthetic rank of test_choice_per_rank with selective sizes sel (per chunk) and
 * a scratch of 0 without, `rebuilt` bytes with some chunk selective. */
static void synthetic_selective(const ts_schedule *s, ts_memory_shape *sh, ts_memory_holdings *h,
                                double *acts, double *stash, const double *sel, double rebuilt)
{
    synthetic(s, sh, h, acts, stash);
    h->sel_act_bytes = sel;
    h->sel_scratch_bytes = rebuilt;
}

static void test_choice_selective(void)
{
    const double MiB = 1048576.0;
    ts_schedule s;
    CHECK(ts_schedule_build(&s, "1f1b", 4, 1, 8) == TS_OK);
    ts_memory_shape sh;
    ts_memory_holdings h;
    double acts[MAXC], stash[MAXC], sel[MAXC];
    for (int c = 0; c < MAXC; c++) sel[c] = 0.5 * MiB;
    synthetic_selective(&s, &sh, &h, acts, stash, sel, 0.125 * MiB);
    int keep[MAXC] = {0}, pa[MAXC] = {0}, ps[MAXC] = {0}, nr[MAXC] = {0};
    bool selective[MAXC] = {false};
    ts_rank_memory est;
    /* Rank 0 holds 4 sets: none 4 MiB, selective 2 MiB and the rebuilt area. */
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 3.0 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(selective[0] && keep[0] == 4 && nr[0] == 0 && pa[0] == 4);
    CHECK(est.act_sets == 4 * 0.5 * MiB && est.total - est.blas <= 3.0 * MiB);
    char line[512];
    ts_memory_describe_keep_selective(&s, 0, keep, selective, line, sizeof line);
    CHECKF(strcmp(line, "chunk 0 keeps 4 of 4 in flight, selective (recomputes 0 of 8 "
                        "micro-batches)") == 0, "'%s'", line);
    /* Without the flags the line is the caps' alone (plan's until it passes them). */
    ts_memory_describe_keep_selective(&s, 0, keep, NULL, line, sizeof line);
    CHECKF(strcmp(line, "chunk 0 keeps 4 of 4 in flight (recomputes 0 of 8 micro-batches)") == 0,
           "'%s'", line);
    /* 1.5 MiB: selective alone does not fit; the selective chunk's cap comes down. */
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 1.5 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(selective[0] && keep[0] < 4 && nr[0] > 0 && pa[0] * 0.5 * MiB <= 1.5 * MiB);
    CHECK(est.total - est.blas <= 1.5 * MiB);
    /* The same room without the selective option needs more recomputed micro-batches. */
    int keep2[MAXC] = {0}, nr2[MAXC] = {0};
    ts_rank_memory plain;
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 1.5 * MiB, keep2, NULL, pa, ps, nr2, &plain));
    CHECK(keep2[0] == 0 && nr2[0] == 8 && nr[0] < nr2[0]);
    /* sel_act_bytes NULL: never selective, the same caps as with selective NULL. */
    h.sel_act_bytes = NULL;
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 1.5 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(!selective[0] && keep[0] == keep2[0] && est.total == plain.total);
    h.sel_act_bytes = sel;
    /* Rank 3 holds one set (1 MiB plus a few bytes): a room it fits needs nothing. */
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 3, 1.1 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(!selective[3] && keep[3] == 1 && nr[3] == 0);
    /* A rebuilt area larger than what selective drops (2 MiB): undone, caps instead. */
    h.sel_scratch_bytes = 4.0 * MiB;
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 1.5 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(!selective[0] && keep[0] == 0 && est.total == plain.total);
    /* A chunk saving nothing (no blocks) is never made selective. */
    h.sel_scratch_bytes = 0.125 * MiB;
    sel[0] = acts[0];
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, 1.5 * MiB, keep, selective, pa, ps, nr,
                                        &est));
    CHECK(!selective[0] && keep[0] == 0);
    ts_schedule_free(&s);

    /* Two chunks per rank (interleaved, v = 2): the chunk whose selective layout saves
     * more goes first (chunk 2 drops 3/4 of each set, chunk 0 1/4), and a room that
     * chunk 2 alone makes fit leaves chunk 0 as it was. */
    CHECK(ts_schedule_build(&s, "interleaved-1f1b", 2, 2, 4) == TS_OK);
    sel[0] = 0.75 * MiB;
    sel[2] = 0.25 * MiB;
    synthetic_selective(&s, &sh, &h, acts, stash, sel, 0.125 * MiB);
    walk none;
    run_walk(&s, TS_RECOMPUTE_NONE, NULL, 0, &none);
    const double all = (none.pa[0] + none.pa[2]) * MiB;
    const double room = all - 0.5 * none.pa[2] * MiB; /* chunk 2 saves 0.75 of its sets */
    CHECK(ts_memory_auto_keep_selective(&s, &sh, &h, 0, room, keep, selective, pa, ps, nr, &est));
    CHECK(selective[2] && !selective[0] && keep[0] == none.pa[0] && keep[2] == none.pa[2]);
    CHECK(nr[0] == 0 && nr[2] == 0 && est.total - est.blas <= room);
    ts_memory_describe_keep_selective(&s, 0, keep, selective, line, sizeof line);
    char want[256];
    snprintf(want, sizeof want,
             "chunk 0 keeps %d of %d in flight (recomputes 0 of 4 micro-batches); chunk 2 keeps "
             "%d of %d in flight, selective (recomputes 0 of 4 micro-batches)",
             none.pa[0], none.pa[0], none.pa[2], none.pa[2]);
    CHECKF(strcmp(line, want) == 0, "'%s'", line);
    ts_schedule_free(&s);
}

int main(void)
{
    test_cap_bounds();
    test_cap_1f1b();
    test_choice_per_rank();
    test_choice_selective();
    return ts_test_report();
}
