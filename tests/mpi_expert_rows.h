/* The row pattern the expert-exchange MPI tests (mpi_expert_dispatch.c, mpi_expert_tp.c)
 * build their inputs from: uneven counts, empty experts and an empty rank, and values
 * exact in fp32 (and bf16-safe) that name their rank, expert, row and column. */
#ifndef TS_TESTS_MPI_EXPERT_ROWS_H
#define TS_TESTS_MPI_EXPERT_ROWS_H

#include <stdio.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "test_util.h"

/* The rank in every failure message: set by each test's main. */
static int world_rank;

/* test_util.h's CHECKF, with this rank in every message. */
#define EXPECT(cond, fmt, ...) CHECKF(cond, "rank %d: " fmt, world_rank, __VA_ARGS__)

enum { C = 5 };

/* Rank r's rows for expert e in a group of S ranks: rank 1 of a group of three or more
 * has none; (r + e) % 3 == 0 gets none; else 1 to 4. */
static int rows_of(int r, int e, int S)
{
    if (S >= 3 && r == 1) return 0;
    return (r + e) % 3 == 0 ? 0 : 1 + (r * 7 + e * 5) % 4;
}
/* Element c of row i of rank r's rows for expert e. */
static float value(int r, int e, int i, int c)
{
    return (float)(r * 1000 + e * 100 + i * 10 + c) * 0.25f - 3.0f;
}

/* The start every expert-exchange test shares: MPI, the world on backend argv[1] ("mpi",
 * the default, or "mpi-staged": the rows in cpu-strict's device memory, through host
 * bounce buffers), world_rank set. Returns the kernel table the rows live in, or NULL
 * after saying why and finalizing MPI (the test then exits with 2). */
static const ts_kernels *expert_test_start(int *argc, char ***argv, ts_comm *world)
{
    ts_comm_init(argc, argv);
    ts_comm_world(world);
    world_rank = world->rank;
    const char *name = *argc > 1 ? (*argv)[1] : "mpi";
    const ts_comm_backend *ops = ts_comm_backend_find(name);
    if (!ops || (ops != &ts_comm_mpi && ops != &ts_comm_mpi_staged)) {
        if (world->rank == 0) fprintf(stderr, "backend %s: give mpi or mpi-staged\n", name);
        ts_comm_finalize();
        return NULL;
    }
    const ts_kernels *k = ops == &ts_comm_mpi_staged ? &ts_kernels_cpu_strict : &ts_kernels_cpu;
    if (ops == &ts_comm_mpi_staged) ts_comm_staged_set_copies(k->memcpy_d2h, k->memcpy_h2d);
    ts_comm_set_backend(world, ops);
    return k;
}

#endif
