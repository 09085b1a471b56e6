/* One link, one direction: an MPI ping-pong between ranks 0 and 1 (any others wait).
 * The one-way time of a message is half the round trip; latency is that time for an
 * 8-byte message (median), bandwidth the message bytes over the one-way time at the
 * largest sizes (best). This is what a cluster file's intra_node / inter_node describe
 * (scripts/measure_cluster.sh), and what the pipeline's activation transfers do.
 * Usage: mpirun -np 2 bench_pingpong [--max-mb X] [--json]   (default 64 MiB) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One-way times in ms of `iters` round trips of `bytes` (rank 0 sends first). */
static void pingpong(int rank, char *buf, int bytes, int iters, double *oneway)
{
    for (int it = -1; it < iters; it++) { /* it = -1 warms up: shm setup, page faults */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = ts_now_ms();
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        if (it >= 0) oneway[it] = 0.5 * (ts_now_ms() - t0);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, json = 0;
    double max_mb = 64.0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--max-mb") && i + 1 < argc) {
            max_mb = atof(argv[++i]);
        } else {
            max_mb = -1.0;
            break;
        }
    }
    if (size < 2 || !(max_mb >= 1.0 && max_mb <= 1024.0)) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 bench_pingpong [--max-mb X in 1..1024] [--json] "
                            "(%d rank%s launched)\n",
                    size, size == 1 ? "" : "s");
        MPI_Finalize();
        return 2;
    }

    const int max_bytes = (int)(max_mb * 1048576.0);
    char *buf = malloc((size_t)max_bytes);
    double *t = malloc(sizeof(double) * 1000);
    if (!buf || !t) {
        fprintf(stderr, "bench_pingpong: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, 1, (size_t)max_bytes);

    pingpong(rank, buf, 8, 1000, t);
    qsort(t, 1000, sizeof *t, cmp_double);
    const double latency_us = 1e3 * 0.5 * (t[499] + t[500]);

    if (rank == 0 && !json) printf("%12s %12s %10s\n", "bytes", "one-way ms", "GB/s");
    double best_gbs = 0.0;
    int best_bytes = 0;
    for (int bytes = 65536; bytes <= max_bytes; bytes *= 4) {
        pingpong(rank, buf, bytes, 10, t);
        qsort(t, 10, sizeof *t, cmp_double);
        double gbs = bytes / (t[0] * 1e-3) / 1e9;
        if (gbs > best_gbs) {
            best_gbs = gbs;
            best_bytes = bytes;
        }
        if (rank == 0 && !json) printf("%12d %12.4f %10.3f\n", bytes, t[0], gbs);
        if (bytes > max_bytes / 4) break;
    }
    if (rank == 0) {
        if (json)
            printf("{\"latency_us\":%.3f,\"bandwidth_gbs\":%.3f,\"at_bytes\":%d}\n", latency_us,
                   best_gbs, best_bytes);
        else
            printf("latency (8 B, one way, median of 1000): %.3f us; bandwidth (best): %.3f GB/s "
                   "at %d bytes\n",
                   latency_us, best_gbs, best_bytes);
    }
    free(buf);
    free(t);
    MPI_Finalize();
    return 0;
}
