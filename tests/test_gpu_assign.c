/* The choice of GPU per rank from CPU sets (ts_gpu_assign, src/topology/gpu_assign.c):
 * nearest GPU first, every GPU its even share, the old local_rank % GPUs without
 * locality, and bad lists refused. Pure: no GPU, no MPI. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "topology/topology.h"

#define MAX 32

/* Assign and compare with want[]; what names the case. */
static void expect(const char *what, const char *const *ranks, int n_ranks,
                   const char *const *gpus, int n_gpus, const int *want)
{
    int got[MAX];
    for (int r = 0; r < n_ranks; r++) got[r] = -7;
    ts_status st = ts_gpu_assign(ranks, n_ranks, gpus, n_gpus, got);
    CHECKF(st == TS_OK, "%s: %s", what, ts_error_message());
    for (int r = 0; r < n_ranks; r++)
        CHECKF(got[r] == want[r], "%s: rank %d got GPU %d, want %d", what, r, got[r], want[r]);
}

/* Without locality (lists unknown, or every rank near every GPU alike): rank r % G. */
static void test_no_locality(void)
{
    int want[MAX];
    for (int G = 1; G <= 8; G++)
        for (int R = 1; R <= 20; R++) {
            for (int r = 0; r < R; r++) want[r] = r % G;
            char what[64];
            snprintf(what, sizeof what, "no locality, %d ranks, %d GPUs", R, G);
            expect(what, NULL, R, NULL, G, want);
            const char *ranks[MAX], *gpus[MAX];
            for (int r = 0; r < R; r++) ranks[r] = "0-15";
            for (int g = 0; g < G; g++) gpus[g] = "0-15";
            snprintf(what, sizeof what, "one NUMA node, %d ranks, %d GPUs", R, G);
            expect(what, ranks, R, gpus, G, want);
            for (int r = 0; r < R; r++) ranks[r] = "";
            snprintf(what, sizeof what, "unbound ranks, %d ranks, %d GPUs", R, G);
            expect(what, ranks, R, gpus, G, want);
        }
}

/* Two sockets, GPUs 0-1 near cores 0-7 and 2-3 near 8-15. */
static const char *const k_two_sockets[4] = { "0-7", "0-7", "8-15", "8-15" };

static void test_nearest(void)
{
    /* A launcher bound the ranks in the other socket's order. */
    const char *ranks[4] = { "8-11", "12-15", "0-3", "4-7" };
    expect("ranks bound socket 1 first", ranks, 4, k_two_sockets, 4, (int[]){ 2, 3, 0, 1 });

    /* Fewer ranks than GPUs: both on socket 1, each its own GPU there. */
    const char *two[2] = { "8-9", "10-11" };
    expect("two ranks on socket 1", two, 2, k_two_sockets, 4, (int[]){ 2, 3 });

    /* Every rank on socket 0 (mpirun --bind-to core on the first cores): the near GPUs
     * first, then the far ones, one rank each. */
    const char *packed[4] = { "0", "1", "2", "3" };
    expect("packed on socket 0", packed, 4, k_two_sockets, 4, (int[]){ 0, 1, 2, 3 });

    /* A rank near one GPU only takes it before an unbound rank, whatever their order. */
    const char *gpus2[2] = { "8-15", "0-7" };
    const char *mixed[2] = { "0-15", "0-7" };
    expect("an unbound rank before a bound one", mixed, 2, gpus2, 2, (int[]){ 0, 1 });
    const char *mixed2[2] = { "0-7", "0-15" };
    expect("a bound rank before an unbound one", mixed2, 2, gpus2, 2, (int[]){ 1, 0 });

    /* Partial overlap: the larger share wins (3 of 4 CPUs near the GPU). */
    const char *g2[2] = { "0-7", "8-15" };
    const char *s1[1] = { "7-10" }, *s0[1] = { "5-8" };
    expect("straddling, mostly socket 1", s1, 1, g2, 2, (int[]){ 1 });
    expect("straddling, mostly socket 0", s0, 1, g2, 2, (int[]){ 0 });

    /* GPUs with unknown locality take the ranks no near GPU has room for. */
    const char *g3[3] = { "0-7", "", "" };
    const char *r3[3] = { "0-1", "2-3", "4-5" };
    expect("one GPU with locality", r3, 3, g3, 3, (int[]){ 0, 1, 2 });
}

/* More ranks than GPUs: every GPU gets floor or ceil of R/G, near ones first. */
static void test_balance(void)
{
    const char *ranks[4] = { "0-1", "2-3", "4-5", "6-7" }; /* all on socket 0 */
    const char *g2[2] = { "0-7", "8-15" };
    expect("four ranks on socket 0, two GPUs", ranks, 4, g2, 2, (int[]){ 0, 0, 1, 1 });

    const char *r8[8] = { "0", "8", "1", "9", "2", "10", "3", "11" }; /* interleaved */
    expect("interleaved sockets", r8, 8, g2, 2, (int[]){ 0, 1, 0, 1, 0, 1, 0, 1 });

    /* Pseudo-random CPU sets: loads always within one of each other, every rank placed. */
    unsigned x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        const int R = 1 + trial % 13, G = 1 + trial % 5;
        char rb[MAX][32], gb[MAX][32];
        const char *rl[MAX], *gl[MAX];
        for (int r = 0; r < R; r++) {
            x = x * 1103515245u + 12345u;
            unsigned lo = (x >> 8) % 16, len = (x >> 16) % 8;
            snprintf(rb[r], sizeof rb[r], "%u-%u", lo, lo + len);
            rl[r] = rb[r];
        }
        for (int g = 0; g < G; g++) {
            x = x * 1103515245u + 12345u;
            unsigned lo = (x >> 8) % 16;
            snprintf(gb[g], sizeof gb[g], "%u-%u", lo, lo + 7);
            gl[g] = gb[g];
        }
        int got[MAX], load[MAX] = { 0 };
        CHECK(ts_gpu_assign(rl, R, gl, G, got) == TS_OK);
        int lo = R, hi = 0;
        for (int r = 0; r < R; r++) {
            CHECKF(got[r] >= 0 && got[r] < G, "trial %d: rank %d got GPU %d of %d", trial, r,
                   got[r], G);
            if (got[r] >= 0 && got[r] < G) load[got[r]]++;
        }
        for (int g = 0; g < G; g++) {
            lo = load[g] < lo ? load[g] : lo;
            hi = load[g] > hi ? load[g] : hi;
        }
        CHECKF(hi - lo <= 1, "trial %d: %d ranks on %d GPUs, loads from %d to %d", trial, R, G,
               lo, hi);
        /* The same inputs, the same answer (every rank of a node computes it). */
        int again[MAX];
        CHECK(ts_gpu_assign(rl, R, gl, G, again) == TS_OK);
        CHECK(!memcmp(got, again, sizeof(int) * (size_t)R));
    }
}

static void test_errors(void)
{
    const char *bad[1] = { "0-3,x" };
    const char *ok[1] = { "0-3" };
    int got[1] = { -7 };
    CHECK(ts_gpu_assign(bad, 1, ok, 1, got) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "local rank 0") && strstr(ts_error_message(), "0-3,x"),
           "message: %s", ts_error_message());
    CHECK(ts_gpu_assign(ok, 1, bad, 1, got) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "GPU 0") && strstr(ts_error_message(), "0-3,x"),
           "message: %s", ts_error_message());
    CHECK(got[0] == -7); /* nothing written */
    CHECK(ts_gpu_assign(ok, 0, ok, 1, got) == TS_OK);
}

int main(void)
{
    test_no_locality();
    test_nearest();
    test_balance();
    test_errors();
    return ts_test_report();
}
