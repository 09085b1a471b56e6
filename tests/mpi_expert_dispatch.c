/* Expert parallelism's token exchange (src/tensor/expert_dispatch.c) on W ranks, one ep
 * group of them all and ep groups of one (W splits): every rank makes its rows by global
 * expert from a seeded generator every rank can replay, so each checks exactly what it
 * receives (expert order: local expert, then source rank, then send order) and, after a
 * stand-in expert y = x * (g + 1) + g (g the row's global expert, exact in fp32), that
 * the combine put every result back at its row. E = W, 2W and 3W, rows of C = 5
 * elements, counts with zeros and one rank that routes nothing; f32 and bf16 rows (bf16
 * moved as bits). Usage: mpi_expert_dispatch [mpi | mpi-staged] (staged: the rows in the
 * strict CPU backend's memory, which faults on any host access). Each rank prints
 * "rank R (...): N passed, F failed" (test_util.h); exits 1 on a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "tensor/expert_dispatch.h"
#include "mpi_expert_rows.h" /* world_rank, EXPECT, C, rows_of (by global expert), value */
#include "test_util.h"

/* The stand-in expert, exact in fp32 for these values. */
static float expert(float x, int g) { return x * (float)(g + 1) + (float)g; }

static const ts_kernels *k;

static void *dev_put(const void *host, size_t bytes)
{
    void *p = k->dev_alloc(bytes ? bytes : 1);
    if (bytes) k->memcpy_h2d(p, host, bytes);
    return p;
}

/* One exchange on group `ep` with E experts of rows of `type`, started blocking or
 * non-blocking (overlap; the non-blocking one tested for progress before its finish). */
static void run_case(const ts_comm *ep, int E, ts_dtype type, bool overlap)
{
    const int S = ep->size, me = ep->rank, L = E / S;
    const size_t elem = ts_dtype_bytes(type);
    ts_expert_dispatch d;
    ts_status st = ts_expert_dispatch_init(&d, ep, k, E, C, type);
    EXPECT(st == TS_OK, "init E=%d on %d ranks: %s", E, S, ts_error_message());
    if (st != TS_OK) return;
    d.overlap = overlap;
    /* This rank's send rows, by global expert. */
    int *counts = calloc((size_t)E, sizeof(int)), n_send = 0;
    for (int g = 0; g < E; g++) n_send += counts[g] = rows_of(me, g, S);
    float *xs = calloc((size_t)n_send * C + 1, sizeof(float));
    int *g_of = calloc((size_t)n_send + 1, sizeof(int));
    for (int g = 0, at = 0; g < E; g++)
        for (int i = 0; i < counts[g]; i++, at++) {
            g_of[at] = g;
            for (int c = 0; c < C; c++) xs[(size_t)at * C + c] = value(me, g, i, c);
        }
    ts_expert_plan p;
    ts_expert_plan_make(&d, &p, counts);
    EXPECT(p.n_send == n_send, "n_send %d, not %d", p.n_send, n_send);
    /* What must arrive, in expert order. */
    int n_recv = 0;
    for (int l = 0; l < L; l++) {
        int rows = 0;
        for (int j = 0; j < S; j++) rows += rows_of(j, me * L + l, S);
        EXPECT(p.expert_rows[l] == rows, "E=%d local expert %d: %d rows, not %d", E, l,
               p.expert_rows[l], rows);
        n_recv += rows;
    }
    EXPECT(p.n_recv == n_recv, "E=%d: n_recv %d, not %d", E, p.n_recv, n_recv);
    float *want = calloc((size_t)n_recv * C + 1, sizeof(float));
    for (int l = 0, at = 0; l < L; l++)
        for (int j = 0; j < S; j++)
            for (int i = 0; i < rows_of(j, me * L + l, S); i++, at++)
                for (int c = 0; c < C; c++) want[(size_t)at * C + c] = value(j, me * L + l, i, c);
    /* In `type`: f32 as is, bf16 as the upper half of each f32 (bits moved unchanged). */
    const size_t sbytes = (size_t)n_send * C * elem, rbytes = (size_t)n_recv * C * elem;
    unsigned char *hs = calloc(sbytes + 1, 1), *hr = calloc(rbytes + 1, 1),
                  *hw = calloc(rbytes + 1, 1);
    for (size_t x = 0; x < (size_t)n_send * C; x++)
        memcpy(hs + x * elem, (const char *)&xs[x] + (4 - elem), elem);
    for (size_t x = 0; x < (size_t)n_recv * C; x++)
        memcpy(hw + x * elem, (const char *)&want[x] + (4 - elem), elem);
    void *xp = dev_put(hs, sbytes), *out = k->dev_alloc(rbytes ? rbytes : 1),
         *work = k->dev_alloc(rbytes ? rbytes : 1);
    ts_expert_xfer x = {0};
    ts_expert_dispatch_start(&d, &p, &x, xp, work, 'F', 0);
    EXPECT(d.n_inflight == (overlap ? 1 : 0), "%d exchanges in flight", d.n_inflight);
    /* A second exchange of the same layer in flight at once, as an overlapped pair's
     * partner action starts its own (its own plan, record and buffers), finished first. */
    ts_expert_plan p2;
    ts_expert_plan_make(&d, &p2, counts);
    ts_expert_xfer x2 = {0};
    void *out2 = k->dev_alloc(rbytes ? rbytes : 1), *work2 = k->dev_alloc(rbytes ? rbytes : 1);
    ts_expert_dispatch_start(&d, &p2, &x2, xp, work2, 'B', 1);
    EXPECT(d.n_inflight == (overlap ? 2 : 0), "%d exchanges in flight", d.n_inflight);
    ts_expert_dispatch_progress(&d);
    ts_expert_dispatch_finish(&d, &p2, &x2, out2);
    ts_expert_dispatch_finish(&d, &p, &x, out);
    EXPECT(d.n_inflight == 0, "%d exchanges in flight after the finish", d.n_inflight);
    if (rbytes) {
        unsigned char *h2 = calloc(rbytes, 1);
        k->memcpy_d2h(h2, out2, rbytes);
        EXPECT(memcmp(h2, hw, rbytes) == 0, "E=%d: the second exchange in flight differs", E);
        free(h2);
    }
    k->dev_free(out2);
    k->dev_free(work2);
    ts_expert_plan_free(&p2);
    if (rbytes) k->memcpy_d2h(hr, out, rbytes);
    EXPECT(memcmp(hr, hw, rbytes) == 0, "E=%d %s: the rows in expert order differ", E,
           type == TS_DTYPE_BF16 ? "bf16" : "f32");
    /* The experts (f32), or nothing (bf16: the rows go back as they came). */
    if (type == TS_DTYPE_F32) {
        float *y = (float *)hr;
        for (int l = 0, at = 0; l < L; l++)
            for (int r = 0; r < p.expert_rows[l]; r++, at++)
                for (int c = 0; c < C; c++)
                    y[(size_t)at * C + c] = expert(y[(size_t)at * C + c], me * L + l);
        if (rbytes) k->memcpy_h2d(out, hr, rbytes);
    }
    void *yp = k->dev_alloc(sbytes ? sbytes : 1);
    ts_expert_combine_start(&d, &p, &x, yp, out, work, 'F', 0);
    ts_expert_dispatch_progress(&d);
    ts_expert_combine_finish(&d, &x);
    double a2a_ms, wait_ms;
    ts_expert_dispatch_take_times(&d, &a2a_ms, &wait_ms);
    EXPECT(a2a_ms >= 0.0 && wait_ms >= 0.0 && wait_ms <= a2a_ms + 1e-9,
           "exchange times %g ms, %g ms of it blocked", a2a_ms, wait_ms);
    unsigned char *hy = calloc(sbytes + 1, 1);
    if (sbytes) k->memcpy_d2h(hy, yp, sbytes);
    int bad = 0;
    for (size_t x = 0; x < (size_t)n_send * C; x++) {
        float v = xs[x];
        if (type == TS_DTYPE_F32) v = expert(v, g_of[x / C]);
        if (memcmp(hy + x * elem, (const char *)&v + (4 - elem), elem) != 0) bad++;
    }
    EXPECT(bad == 0, "E=%d %s: %d elements not back at their rows after the combine", E,
           type == TS_DTYPE_BF16 ? "bf16" : "f32", bad);
    k->dev_free(xp);
    k->dev_free(out);
    k->dev_free(work);
    k->dev_free(yp);
    free(hs);
    free(hr);
    free(hw);
    free(hy);
    free(xs);
    free(want);
    free(g_of);
    free(counts);
    ts_expert_plan_free(&p);
    ts_expert_dispatch_free(&d);
}

static void run_group(const ts_comm *ep)
{
    for (int m = 1; m <= 3; m++) {
        run_case(ep, m * ep->size, TS_DTYPE_F32, m % 2 == 1);
        run_case(ep, m * ep->size, TS_DTYPE_BF16, m % 2 == 0);
    }
    /* E not divisible by ep: refused, naming the keys. */
    if (ep->size > 1) {
        ts_expert_dispatch d;
        ts_error_clear();
        EXPECT(ts_expert_dispatch_init(&d, ep, k, ep->size + 1, C, TS_DTYPE_F32) == TS_ERR &&
                   strstr(ts_error_message(), "model.moe_experts") &&
                   strstr(ts_error_message(), "parallel.ep"),
               "E = ep + 1 accepted or unnamed: %s", ts_error_message());
    }
}

int main(int argc, char **argv)
{
    ts_comm world;
    k = expert_test_start(&argc, &argv, &world);
    if (!k) return 2;
    run_group(&world);
    ts_comm single; /* ep groups of one rank: the exchange is a copy */
    ts_comm_split(&world, world.rank, 0, "single", &single);
    run_group(&single);
    ts_comm_free(&single);
    printf("rank %d (%s, %d ranks): ", world.rank, argc > 1 ? argv[1] : "mpi", world.size);
    const int code = ts_test_report();
    ts_comm_finalize();
    return code;
}
