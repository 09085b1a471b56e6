/* One thread budget for our OpenMP kernels and OpenBLAS. */
#include <cblas.h>
#include <omp.h>

#include "kernels/kernels.h"

static int ts_cpu_threads = 0; /* 0: not set, use OpenMP's default */

void ts_cpu_set_threads(int n)
{
    if (n < 1) n = 1;
    ts_cpu_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int ts_cpu_get_threads(void)
{
    return ts_cpu_threads > 0 ? ts_cpu_threads : omp_get_max_threads();
}
