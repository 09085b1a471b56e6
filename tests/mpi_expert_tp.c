/* Expert tensor parallelism's exchange (src/tensor/expert_tp.c) on W >= 2 ranks, one etp
 * group of them all: every rank makes its rows for L local experts from a rule every rank
 * can replay, so each checks exactly what the gather delivers (gathered order: local
 * expert, then etp rank, then the rank's order) and, after a stand-in partial output
 * y_j = x * (j + 1) on etp rank j (exact in fp32 for these values), that the reduce put
 * the sum x * W(W+1)/2 back at every one of its rows. L = 1, 2 and 3; counts with zeros
 * and one rank with no rows; the gather in place (its input the start of its output, as
 * the MoE layer runs it) and the reduce's output in its work buffer. Usage:
 * mpi_expert_tp [mpi | mpi-staged] (staged: the rows in the strict CPU backend's memory,
 * which faults on any host access). Each rank prints "rank R (...): N passed, F failed"
 * (test_util.h); exits 1 on a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "tensor/expert_tp.h"
#include "mpi_expert_rows.h" /* world_rank, EXPECT, C, rows_of (by local expert), value */
#include "test_util.h"

static const ts_kernels *k;

static void run_case(const ts_comm *etp, int L)
{
    const int S = etp->size, me = etp->rank;
    ts_expert_tp t;
    ts_expert_tp_init(&t, etp, k, L, C, TS_DTYPE_F32);
    int *rows = calloc((size_t)L, sizeof(int)), n_mine = 0, n_all = 0;
    for (int l = 0; l < L; l++) n_mine += rows[l] = rows_of(me, l, S);
    for (int j = 0; j < S; j++)
        for (int l = 0; l < L; l++) n_all += rows_of(j, l, S);
    ts_expert_tp_plan(&t, rows);
    EXPECT(t.n_mine == n_mine && t.n_all == n_all, "L=%d: n_mine %d n_all %d, not %d %d", L,
           t.n_mine, t.n_all, n_mine, n_all);
    /* Mine in expert order, and what the gather must give. */
    const size_t mine = (size_t)n_mine * C, all = (size_t)n_all * C;
    float *x = calloc(mine + 1, sizeof(float)), *want = calloc(all + 1, sizeof(float)),
          *got = calloc(all + 1, sizeof(float));
    for (int l = 0, at = 0; l < L; l++)
        for (int i = 0; i < rows[l]; i++, at++)
            for (int c = 0; c < C; c++) x[(size_t)at * C + c] = value(me, l, i, c);
    for (int l = 0, at = 0; l < L; l++) {
        int n = 0;
        for (int j = 0; j < S; j++)
            for (int i = 0; i < rows_of(j, l, S); i++, at++, n++)
                for (int c = 0; c < C; c++) want[(size_t)at * C + c] = value(j, l, i, c);
        EXPECT(t.expert_rows[l] == n, "L=%d expert %d: %d rows, not %d", L, l,
               t.expert_rows[l], n);
    }
    EXPECT(t.n_buf == (S * n_mine > n_all ? S * n_mine : n_all), "L=%d: n_buf %d", L, t.n_buf);
    const size_t bytes = ((size_t)t.n_buf * C + 1) * sizeof(float);
    void *buf = k->dev_alloc(bytes), *work = k->dev_alloc(bytes);
    if (mine) k->memcpy_h2d(buf, x, mine * sizeof(float));
    ts_expert_tp_gather(&t, buf, buf, work); /* in place: the input is buf's start */
    if (all) k->memcpy_d2h(got, buf, all * sizeof(float));
    EXPECT(memcmp(got, want, all * sizeof(float)) == 0, "L=%d: the gathered rows differ", L);
    /* This rank's partials, then the reduce into the work buffer. */
    for (size_t e = 0; e < all; e++) got[e] *= (float)(me + 1);
    if (all) k->memcpy_h2d(buf, got, all * sizeof(float));
    ts_expert_tp_reduce(&t, work, buf, work);
    float *sum = calloc(mine + 1, sizeof(float));
    if (mine) k->memcpy_d2h(sum, work, mine * sizeof(float));
    int bad = 0;
    for (size_t e = 0; e < mine; e++)
        if (sum[e] != x[e] * (float)(S * (S + 1) / 2)) bad++;
    EXPECT(bad == 0, "L=%d: %d elements of the summed rows wrong", L, bad);
    k->dev_free(buf);
    k->dev_free(work);
    free(x);
    free(want);
    free(got);
    free(sum);
    free(rows);
    ts_expert_tp_free(&t);
}

int main(int argc, char **argv)
{
    ts_comm world;
    k = expert_test_start(&argc, &argv, &world);
    if (!k) return 2;
    if (world.size < 2) {
        if (world.rank == 0) fprintf(stderr, "mpi_expert_tp: give 2 or more ranks\n");
        ts_comm_finalize();
        return 2;
    }
    for (int L = 1; L <= 3; L++) run_case(&world, L);
    printf("rank %d (%s, %d ranks): ", world.rank, argc > 1 ? argv[1] : "mpi", world.size);
    const int code = ts_test_report();
    ts_comm_finalize();
    return code;
}
