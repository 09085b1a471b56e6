#ifndef TS_TIMER_H
#define TS_TIMER_H

#include <time.h>

/* Monotonic wall-clock time in milliseconds. */
static inline double ts_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif
