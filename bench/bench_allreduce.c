/* The communication ceiling of data parallelism: a plain in-place MPI_Allreduce (sum) of
 * N floats, the operation a replica's gradient sync amounts to, timed best of several.
 * Prints the algorithm bandwidth, bytes / time (the convention of nccl-tests' algbw),
 * so it compares directly with a training step's dp_bytes / dp_wait_ms. Also times what
 * the trainer's gradient sync issues for the same buffer: MPI_Iallreduce of buckets of
 * --bucket-mb MiB (default 4, parallel.bucket_mb's default), all started, then waited for.
 * Usage: mpirun -np 2 bench_allreduce [N_FLOATS] [REPS] [--bucket-mb X] [--json]
 *        (default 4M floats, 10 repetitions) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/stats.h"
#include "core/timer.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    long long n = 4 << 20;
    int reps = 10, json = 0, pos = 0;
    double bucket_mb = 4.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--bucket-mb") && i + 1 < argc) {
            bucket_mb = atof(argv[++i]);
        } else if (pos == 0) {
            n = atoll(argv[i]);
            pos++;
        } else if (pos == 1) {
            reps = atoi(argv[i]);
            pos++;
        }
    }
    if (n < 1 || n > 0x7fffffff || reps < 1 || !(bucket_mb > 0)) {
        if (rank == 0)
            fprintf(stderr, "usage: bench_allreduce [N_FLOATS >= 1] [REPS >= 1] [--bucket-mb X > 0] "
                            "[--json]\n");
        MPI_Finalize();
        return 2;
    }

    float *x = ts_alloc_floats((size_t)n);
    for (long long i = 0; i < n; i++) x[i] = (float)(i % 7) * 1e-3f;
    long long bucket = (long long)(bucket_mb * 1048576.0 / sizeof(float));
    if (bucket < 1) bucket = 1;
    const int n_buckets = (int)((n + bucket - 1) / bucket);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)n_buckets);
    double best[2] = {1e30, 1e30}, sum[2] = {0.0, 0.0}, med[2];
    double *times = malloc(sizeof(double) * (size_t)reps);
    for (int mode = 0; mode < 2; mode++) {
        for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up: page faults, shm setup */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = ts_now_ms();
            if (mode == 0) {
                MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            } else { /* the gradient sync's way: buckets from the end of the buffer */
                for (int b = 0; b < n_buckets; b++) {
                    long long end = n - (long long)b * bucket, beg = end - bucket < 0 ? 0 : end - bucket;
                    MPI_Iallreduce(MPI_IN_PLACE, x + beg, (int)(end - beg), MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD, &reqs[b]);
                }
                MPI_Waitall(n_buckets, reqs, MPI_STATUSES_IGNORE);
            }
            double dt = ts_now_ms() - t0;
            /* the slowest rank decides when the reduction is complete everywhere */
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (rep > 0) {
                if (dt < best[mode]) best[mode] = dt;
                sum[mode] += dt;
                times[rep - 1] = dt;
            }
        }
        med[mode] = ts_median(times, reps);
    }
    if (rank == 0) {
        const double bytes = (double)n * sizeof(float);
        double gbs[2];
        for (int mode = 0; mode < 2; mode++) gbs[mode] = bytes / (best[mode] * 1e-3) / 1e9;
        if (json)
            printf("{\"ranks\":%d,\"bytes\":%.0f,\"best_ms\":%.4f,\"mean_ms\":%.4f,\"median_ms\":%.4f,"
                   "\"algbw_gbs\":%.4f,\"bucket_mb\":%g,\"buckets\":%d,\"bucketed_best_ms\":%.4f,"
                   "\"bucketed_mean_ms\":%.4f,\"bucketed_median_ms\":%.4f,\"bucketed_algbw_gbs\":%.4f}\n",
                   size, bytes, best[0], sum[0] / reps, med[0], gbs[0], bucket_mb, n_buckets,
                   best[1], sum[1] / reps, med[1], gbs[1]);
        else
            printf("in-place all-reduce of %.2f MB on %d ranks, best of %d (GB/s of the best):\n"
                   "  MPI_Allreduce (one call)            %8.3f ms (median %8.3f)  %6.2f GB/s\n"
                   "  MPI_Iallreduce, %d buckets of %g MiB %8.3f ms (median %8.3f)  %6.2f GB/s\n",
                   bytes / 1e6, size, reps, best[0], med[0], gbs[0], n_buckets, bucket_mb, best[1],
                   med[1], gbs[1]);
    }
    free(reqs);
    free(times);
    free(x);
    MPI_Finalize();
    return 0;
}
