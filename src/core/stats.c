#include "core/stats.h"

#include <stdlib.h>

#include "core/error.h"

static int cmp_double(const void *pa, const void *pb)
{
    const double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

double ts_median(double *x, int n)
{
    TS_ASSERT(n >= 1);
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
