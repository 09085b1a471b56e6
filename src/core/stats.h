/* Small statistics over measurements (timings, traces). */
#ifndef TS_CORE_STATS_H
#define TS_CORE_STATS_H

/* The median of x[0..n), n >= 1 (the mean of the two middle values when n is even);
 * sorts x in place. */
double ts_median(double *x, int n);

#endif
