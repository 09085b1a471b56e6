/* Stragglers (docs/CONTRACT.md "Metrics" and "Straggler report"): every rank's compute
 * and wait time of each step ride in the step's one max all-reduce of timings
 * (ts_trainer_step), each rank in slots of its own, so rank 0 knows them all without a
 * collective of their own. From them: the step's slowest and fastest rank and the spread
 * of both times (the metrics line), and every log.straggler_every steps a report naming
 * the ranks whose relative score over the window, median / own compute time, is below
 * log.straggler_threshold. NVRx's relative score divides by the best rank's time; the
 * median keeps one unusually fast rank from making every other rank a straggler. */
#include "train/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

void ts_straggler_put(double *slots, int rank, double compute_ms, double wait_ms)
{
    slots[2 * rank] = compute_ms > 0 ? compute_ms : 0.0;
    slots[2 * rank + 1] = wait_ms > 0 ? wait_ms : 0.0;
}

void ts_straggler_step(ts_trainer *t, const double *slots, ts_step_stats *out)
{
    const int n = t->groups->world.size;
    int slow = 0, fast = 0;
    double wmax = slots[1], wmin = slots[1];
    for (int r = 1; r < n; r++) {
        if (slots[2 * r] > slots[2 * slow]) slow = r;
        if (slots[2 * r] < slots[2 * fast]) fast = r;
        wmax = slots[2 * r + 1] > wmax ? slots[2 * r + 1] : wmax;
        wmin = slots[2 * r + 1] < wmin ? slots[2 * r + 1] : wmin;
    }
    out->rank_slowest = slow;
    out->rank_fastest = fast;
    out->compute_ms_max = slots[2 * slow];
    out->compute_ms_min = slots[2 * fast];
    out->wait_ms_max = wmax;
    out->wait_ms_min = wmin;
    if (t->groups->world.rank != 0 || t->cfg.log.straggler_every <= 0) return;
    if (!t->straggler_sum) t->straggler_sum = ts_calloc((size_t)n, sizeof(double));
    for (int r = 0; r < n; r++) t->straggler_sum[r] += slots[2 * r];
    t->straggler_steps++;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ts_straggler_report(ts_trainer *t, int step)
{
    const int every = t->cfg.log.straggler_every, n = t->groups->world.size;
    if (every <= 0 || (step + 1) % every != 0 || t->groups->world.rank != 0 ||
        t->straggler_steps == 0)
        return;
    const int steps = t->straggler_steps;
    double *sorted = ts_malloc((size_t)n * sizeof(double));
    memcpy(sorted, t->straggler_sum, (size_t)n * sizeof(double));
    qsort(sorted, (size_t)n, sizeof(double), cmp_double);
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    free(sorted);
    const double threshold = t->cfg.log.straggler_threshold;
    /* "rank R score S (X ms/step)" for each rank below the threshold, the first 16. */
    char named[1024] = "";
    size_t at = 0;
    int count = 0;
    for (int r = 0; r < n; r++) {
        const double own = t->straggler_sum[r];
        const double score = own > 0 ? median / own : 1.0;
        if (score >= threshold) continue;
        if (count++ < 16 && at < sizeof named)
            at += (size_t)snprintf(named + at, sizeof named - at, "%srank %d score %.2f (%.2f ms/step)",
                                   count > 1 ? ", " : "", r, score, own / steps);
    }
    if (count > 16 && at < sizeof named)
        snprintf(named + at, sizeof named - at, " and %d more", count - 16);
    if (count)
        ts_log_warn("stragglers, steps %d-%d: %s; median compute %.2f ms/step, threshold %.2f "
                    "(log.straggler_threshold)",
                    step - steps + 1, step, named, median / steps, threshold);
    else
        /* Asked for by log.straggler_every: printed whatever log.progress says. */
        fprintf(stderr, "stragglers, steps %d-%d: no stragglers (every rank's score >= %.2f; "
                        "median compute %.2f ms/step)\n",
                step - steps + 1, step, threshold, median / steps);
    memset(t->straggler_sum, 0, (size_t)n * sizeof(double));
    t->straggler_steps = 0;
}
