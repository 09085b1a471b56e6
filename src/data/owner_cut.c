/* Owner-aligned cuts of a bucket (data/owner_cut.h). */
#include "data/owner_cut.h"

#include <limits.h>
#include <stdlib.h>

#include "core/error.h"

void ts_even_cut(int n, size_t len, size_t align, int *counts, int *displs)
{
    const size_t units = len / align;
    TS_ASSERT(len <= INT_MAX);
    for (int r = 0; r < n; r++) {
        size_t lo = units * (size_t)r / (size_t)n * align;
        size_t hi = r == n - 1 ? len : units * (size_t)(r + 1) / (size_t)n * align;
        displs[r] = (int)lo;
        counts[r] = (int)(hi - lo);
    }
}

/* The assignment: members 0..n-1 take consecutive runs of the k items; the run of member
 * r is items [first[r], first[r + 1]). best[r][j]: the least sum over members 0..r of
 * (load + run cost)^2 when they take items [0, j); from[r][j] the run start achieving it
 * (the smallest on ties). */
static void assign(int n, const double *prefix, int k, const double *load, int *owner)
{
    const size_t w = (size_t)k + 1;
    double *best = ts_malloc((size_t)n * w * sizeof(double));
    int *from = ts_malloc((size_t)n * w * sizeof(int));
    for (int j = 0; j <= k; j++) {
        const double l = load[0] + prefix[j];
        best[j] = l * l;
        from[j] = 0;
    }
    for (int r = 1; r < n; r++) {
        for (int j = 0; j <= k; j++) {
            double b = 0.0;
            int at = -1;
            for (int i = 0; i <= j; i++) {
                const double l = load[r] + (prefix[j] - prefix[i]);
                const double v = best[(size_t)(r - 1) * w + (size_t)i] + l * l;
                if (at < 0 || v < b) {
                    b = v;
                    at = i;
                }
            }
            best[(size_t)r * w + (size_t)j] = b;
            from[(size_t)r * w + (size_t)j] = at;
        }
    }
    int j = k;
    for (int r = n - 1; r >= 0; r--) {
        const int i = r == 0 ? 0 : from[(size_t)r * w + (size_t)j];
        for (int q = i; q < j; q++) owner[q] = r;
        j = i;
    }
    free(best);
    free(from);
}

void ts_owner_cut(int n, size_t len, size_t align, const ts_whole_item *items, int k,
                  double *load, int *counts, int *displs, int *owner)
{
    ts_even_cut(n, len, align, counts, displs);
    if (k == 0) return;
    double *prefix = ts_malloc(((size_t)k + 1) * sizeof(double));
    prefix[0] = 0.0;
    for (int i = 0; i < k; i++) {
        TS_ASSERT(items[i].cost > 0.0 && items[i].begin < items[i].end && items[i].end <= len);
        TS_ASSERT(i == 0 || items[i].begin >= items[i - 1].end);
        prefix[i + 1] = prefix[i] + items[i].cost;
    }
    assign(n, prefix, k, load, owner);
    for (int i = 0; i < k; i++) load[owner[i]] += items[i].cost;
    free(prefix);
    /* The cut after member r: the even one, moved out of any whole item, between the last
     * item of members <= r and the first of members > r. Monotone in r: so are the even
     * cuts and both bounds. */
    size_t prev = 0;
    int it = 0; /* the first item of a member > r */
    for (int r = 0; r < n; r++) {
        size_t cut = len;
        if (r < n - 1) {
            while (it < k && owner[it] <= r) it++;
            const size_t lo = it > 0 ? items[it - 1].end : 0;
            const size_t hi = it < k ? items[it].begin : len;
            cut = (size_t)displs[r] + (size_t)counts[r]; /* the even cut */
            if (cut < lo) cut = lo;
            if (cut > hi) cut = hi;
            if (cut < prev) cut = prev;
        }
        displs[r] = (int)prev;
        counts[r] = (int)(cut - prev);
        prev = cut;
    }
}
