/* Context parallelism's per-position exchange (tensor/cp.h ts_cp_rows_*, which MLA's
 * latent goes through), on 2 or 3 ranks (run under mpirun by test_cp_invariance.sh): the
 * gather puts every rank's local rows at their global positions, from packed rows and
 * from a column block of wider rows; the reduce-scatter gives each rank the sum over the
 * group of the gathered gradients at its own positions, into packed rows or a column
 * block (the columns beside it untouched). fp32 and bf16 tables; the values are small
 * integers, exact in both, so every check is exact. Every rank checks; the job fails if
 * any rank fails. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "tensor/cp.h"
#include "test_util.h"

/* A row element's value from its sequence, global position and column: distinct for
 * each (b < 2, t < 12, w < 5), at most 119 (bf16 holds the integers to 256 exactly). */
static float value(int b, int t, int w) { return (float)((b * 12 + t) * 5 + w); }

static void put(const ts_kernels *k, void *buf, size_t i, float x)
{
    k->convert((unsigned char *)buf + i * ts_dtype_bytes(k->act_dtype), k->act_dtype, &x,
               TS_DTYPE_F32, 1);
}
static float get(const ts_kernels *k, const void *buf, size_t i)
{
    float x;
    k->convert(&x, TS_DTYPE_F32, (const unsigned char *)buf + i * ts_dtype_bytes(k->act_dtype),
               k->act_dtype, 1);
    return x;
}

static void run(const ts_kernels *k, const ts_comm *comm, int size, int rank, size_t ld)
{
    const int B = 2, T = 12, W = 5;
    const ts_cp cp = ts_cp_make(size, rank, comm, k, T);
    const int Tl = ts_cp_local_len(&cp);
    const size_t eb = ts_dtype_bytes(k->act_dtype), all = ts_cp_rows_elems(&cp, B, W);
    CHECK(all == (size_t)B * T * W);
    void *local = ts_calloc((size_t)B * Tl * ld, eb), *gathered = ts_calloc(all, eb);
    void *work = ts_calloc(ts_cp_rows_work_bytes(&cp, B, W, eb), 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            for (size_t w = 0; w < ld; w++) /* columns past W: -1, which must not travel */
                put(k, local, ((size_t)b * Tl + t) * ld + w,
                    w < (size_t)W ? value(b, ts_cp_position(&cp, t), (int)w) : -1.0f);
    ts_cp_rows_gather(&cp, gathered, work, local, ld, B, W);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int w = 0; w < W; w++)
                bad += get(k, gathered, ((size_t)b * T + t) * W + w) != value(b, t, w);
    CHECKF(!bad, "cp %d rank %d ld %zu: %d gathered values off their positions", size, rank, ld,
           bad);

    /* Rank r's gradient of the gathered rows: value at the rows (b T + t) % size == r,
     * 1 elsewhere; the owner's sum is value + size - 1 (every rank's part counted). */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int w = 0; w < W; w++)
                put(k, gathered, ((size_t)b * T + t) * W + w,
                    (b * T + t) % size == rank ? value(b, t, w) : 1.0f);
    ts_cp_rows_reduce_scatter(&cp, local, ld, work, gathered, B, W);
    bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            for (size_t w = 0; w < ld; w++) {
                const float want =
                    w < (size_t)W ? value(b, ts_cp_position(&cp, t), (int)w) + (float)(size - 1)
                                  : -1.0f;
                bad += get(k, local, ((size_t)b * Tl + t) * ld + w) != want;
            }
    CHECKF(!bad, "cp %d rank %d ld %zu: %d reduce-scattered values wrong", size, rank, ld, bad);
    free(local);
    free(gathered);
    free(work);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ts_comm cp;
    ts_comm_world(&cp);
    cp.name = "cp";
    const ts_kernels *tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_bf16};
    for (int i = 0; i < 2; i++)
        for (size_t ld = 5; ld <= 7; ld += 2) run(tables[i], &cp, size, rank, ld);

    int failed = ts_test_failed, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("cp=%d: ", size);
    int code = rank == 0 ? ts_test_report() : (failed != 0 || ts_test_passed == 0);
    MPI_Finalize();
    return any ? 1 : code;
}
