/* What comm.c (the data plane's front end), the backends and the control plane share,
 * private to src/comm: the marks and timing around every blocking call. */
#ifndef TS_COMM_INTERNAL_H
#define TS_COMM_INTERNAL_H

#include "comm/comm.h"
#include "core/timer.h"
#include "core/watchdog.h"

/* Around every blocking collective: the watchdog mark, and the time for busy_ms and
 * on_span when the group has them. */
static inline double ts_comm_begin(const ts_comm *c, const char *what)
{
    ts_watchdog_wait_begin(what, c->name, -1);
    return c->busy_ms || c->on_span ? ts_now_ms() : 0.0;
}

static inline void ts_comm_end(const ts_comm *c, const char *what, size_t bytes, double t0)
{
    ts_watchdog_wait_end();
    if (!c->busy_ms && !c->on_span) return;
    double t1 = ts_now_ms();
    if (c->busy_ms) *c->busy_ms += t1 - t0;
    if (c->on_span) c->on_span(c->on_span_ctx, what, bytes, t0, t1);
}

/* Bytes per element of a data-plane type. */
static inline size_t ts_comm_dtype_size(ts_comm_dtype t)
{
    return t == TS_COMM_BF16 ? 2 : t == TS_COMM_F32 || t == TS_COMM_I32 ? 4 : 8;
}

/* Elements over all of c's ranks of an uneven collective's counts[c->size]. */
static inline size_t ts_comm_counts_total(const ts_comm *c, const int *counts)
{
    size_t total = 0;
    for (int k = 0; k < c->size; k++) total += (size_t)counts[k];
    return total;
}

#endif
