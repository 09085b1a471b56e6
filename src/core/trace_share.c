/* How much of a trace's communication its compute hid (trace.h ts_trace_hidden_share):
 * each rank's compute spans and blocked spans merged into disjoint intervals, and each
 * communication span measured against them. Sorting makes it n log n, so a whole run's
 * trace is summarised at once. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/trace.h"

typedef struct {
    int rank;
    double a, b; /* [a, b) in microseconds */
} interval;

static int by_rank_then_start(const void *x, const void *y)
{
    const interval *p = x, *q = y;
    if (p->rank != q->rank) return p->rank < q->rank ? -1 : 1;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : 0;
}

static bool is_compute(const ts_trace_event *e)
{
    return e->track == TS_TRACE_TRACK_MAIN && e->cat[0] && !e->cat[1] &&
           strchr("FBIW", e->cat[0]) != NULL;
}

/* The events `keep` selects as disjoint intervals per rank, sorted (*n of them). */
static interval *union_of(const ts_trace_event *ev, int n, bool (*keep)(const ts_trace_event *,
                                                                          const char *),
                          const char *cat, int *out_n)
{
    interval *v = ts_malloc(((size_t)n + 1) * sizeof *v);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (keep(&ev[i], cat) && ev[i].dur_us > 0)
            v[k++] = (interval){ev[i].rank, ev[i].start_us, ev[i].start_us + ev[i].dur_us};
    qsort(v, (size_t)k, sizeof *v, by_rank_then_start);
    int m = 0;
    for (int i = 0; i < k; i++) {
        if (m > 0 && v[m - 1].rank == v[i].rank && v[i].a <= v[m - 1].b) {
            if (v[i].b > v[m - 1].b) v[m - 1].b = v[i].b;
        } else {
            v[m++] = v[i];
        }
    }
    *out_n = m;
    return v;
}

static bool keep_compute(const ts_trace_event *e, const char *cat)
{
    (void)cat;
    return is_compute(e);
}

static bool keep_cat(const ts_trace_event *e, const char *cat) { return !strcmp(e->cat, cat); }

/* The length of [a, b) on `rank` covered by the disjoint sorted intervals u[n]. */
static double covered(const interval *u, int n, int rank, double a, double b)
{
    int lo = 0, hi = n; /* the first interval of rank ending after a */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (u[mid].rank < rank || (u[mid].rank == rank && u[mid].b <= a)) lo = mid + 1;
        else hi = mid;
    }
    double sum = 0.0;
    for (int i = lo; i < n && u[i].rank == rank && u[i].a < b; i++) {
        const double x = u[i].a > a ? u[i].a : a, y = u[i].b < b ? u[i].b : b;
        if (y > x) sum += y - x;
    }
    return sum;
}

double ts_trace_hidden_share(const ts_trace_event *events, int n, const char *comm,
                             const char *blocked, double *total_us)
{
    int nc = 0, nb = 0;
    interval *cu = union_of(events, n, keep_compute, NULL, &nc);
    interval *bu = union_of(events, n, keep_cat, blocked, &nb);
    double total = 0.0, hidden = 0.0;
    for (int i = 0; i < n; i++) {
        const ts_trace_event *e = &events[i];
        if (strcmp(e->cat, comm) != 0 || e->dur_us <= 0) continue;
        const double a = e->start_us, b = e->start_us + e->dur_us;
        total += e->dur_us;
        const double h = covered(cu, nc, e->rank, a, b) - covered(bu, nb, e->rank, a, b);
        if (h > 0) hidden += h;
    }
    free(cu);
    free(bu);
    if (total_us) *total_us = total;
    if (total <= 0) return 0.0;
    const double share = hidden / total;
    return share < 0 ? 0.0 : share > 1 ? 1.0 : share;
}
