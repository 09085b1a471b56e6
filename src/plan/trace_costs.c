/* Chunk costs from a measured trace (trace_costs.h). */
#include "plan/trace_costs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"
#include "core/trace.h"

void ts_trace_costs_free(ts_trace_costs *tc)
{
    free(tc->f);
    free(tc->i);
    free(tc->w);
    memset(tc, 0, sizeof *tc);
}

static int kind_of_cat(const char *cat)
{
    if (!strcmp(cat, "F")) return TS_ACT_F;
    if (!strcmp(cat, "B")) return TS_ACT_B;
    if (!strcmp(cat, "I")) return TS_ACT_I;
    if (!strcmp(cat, "W")) return TS_ACT_W;
    return -1;
}

static int cmp_event_start(const void *pa, const void *pb)
{
    const ts_trace_event *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->start_us != b->start_us) return a->start_us < b->start_us ? -1 : 1;
    return 0;
}

typedef struct {
    int group; /* chunk * 4 + kind */
    double ms;
} group_dur;

static int cmp_group_dur(const void *pa, const void *pb)
{
    const group_dur *a = pa, *b = pb;
    if (a->group != b->group) return a->group < b->group ? -1 : 1;
    return a->ms < b->ms ? -1 : a->ms > b->ms;
}

ts_status ts_trace_costs_load(const char *path, const ts_schedule *s, int skip,
                              bool use_median, ts_trace_costs *tc)
{
    memset(tc, 0, sizeof *tc);
    ts_trace_event *all = NULL;
    int n_all = 0, n_ranks = 0;
    if (ts_trace_read_chrome(path, &all, &n_all, &n_ranks) != TS_OK)
        return ts_error_prefix("--costs-from-trace: ");

    /* Keep the compute events, grouped by track in time order. */
    int n = 0;
    for (int k = 0; k < n_all; k++)
        if (kind_of_cat(all[k].cat) >= 0) all[n++] = all[k];
    ts_status st = TS_OK;
    if (n == 0) {
        free(all);
        return ts_fail("--costs-from-trace: %s has no F/B/I/W events (write one with "
                       "tessera train --set log.trace=\"FILE\")", path);
    }
    qsort(all, (size_t)n, sizeof *all, cmp_event_start);

    const int nc = s->n_chunks;
    group_dur *dur = ts_malloc(sizeof *dur * (size_t)n); /* the steady steps' durations */
    int n_dur = 0;
    double *step_start = NULL, *step_end = NULL, *b_make = NULL, *b_span = NULL;
    int steps = -1, tracks = 0;
    /* Pass 1: check every track, count steps. */
    for (int k = 0; k < n && st == TS_OK;) {
        int e = k;
        while (e < n && all[e].rank == all[k].rank) e++;
        /* A hostile trace's chunk is checked before it indexes the placement. */
        const int q = all[k].chunk >= 0 && all[k].chunk < nc ? ts_chunk_rank(s, all[k].chunk) : -1;
        const int na = q >= 0 ? s->n_actions[q] : 0;
        if (q < 0 || all[k].chunk >= nc) {
            st = ts_fail("--costs-from-trace: %s has an event on chunk %d, but this config has "
                         "%d chunks (pass the training run's --set options to plan)",
                         path, all[k].chunk, nc);
        } else if ((e - k) % na != 0) {
            st = ts_fail("--costs-from-trace: rank %d of %s has %d compute events, not whole "
                         "steps of the %d actions schedule %s gives pipeline rank %d with "
                         "%d micro-batches (pass the training run's --set options to plan)",
                         all[k].rank, path, e - k, na, s->name, q, s->m);
        } else if (steps >= 0 && (e - k) / na != steps) {
            st = ts_fail("--costs-from-trace: rank %d of %s ran %d steps, another rank %d",
                         all[k].rank, path, (e - k) / na, steps);
        } else {
            steps = (e - k) / na;
            for (int j = k; j < e && st == TS_OK; j++) {
                const ts_action *a = &s->actions[q][(j - k) % na];
                const ts_trace_event *ev = &all[j];
                if (kind_of_cat(ev->cat) != (int)a->kind || ev->chunk != a->chunk ||
                    ev->mb != a->mb)
                    st = ts_fail("--costs-from-trace: event %d of rank %d in %s is %s on chunk %d, "
                                 "micro-batch %d; schedule %s has %c on chunk %d, micro-batch %d "
                                 "there (pass the training run's --set options to plan)",
                                 j - k, ev->rank, path, ev->cat, ev->chunk, ev->mb, s->name,
                                 *ts_action_letter(a->kind), a->chunk, a->mb);
            }
            tracks++;
        }
        k = e;
    }
    if (st == TS_OK && steps <= skip)
        st = ts_fail("--costs-from-trace: %s holds %d step%s; nothing is left after dropping "
                     "%d (--trace-skip-steps)", path, steps, steps == 1 ? "" : "s", skip);
    if (st == TS_OK) {
        const int used = steps - skip;
        step_start = ts_malloc(sizeof(double) * (size_t)used);
        step_end = ts_malloc(sizeof(double) * (size_t)used);
        b_make = ts_calloc((size_t)used, sizeof(double));
        b_span = ts_calloc((size_t)used, sizeof(double));
        for (int u = 0; u < used; u++) {
            step_start[u] = INFINITY;
            step_end[u] = -INFINITY;
        }
        /* Pass 2: sums per chunk and kind; each step's window over all tracks. */
        for (int k = 0; k < n;) {
            int e = k;
            while (e < n && all[e].rank == all[k].rank) e++;
            const int na = s->n_actions[ts_chunk_rank(s, all[k].chunk)];
            for (int j = k + skip * na; j < e; j++) {
                const ts_trace_event *ev = &all[j];
                const int u = (j - k) / na - skip, kind = kind_of_cat(ev->cat);
                dur[n_dur++] = (group_dur){ev->chunk * 4 + kind, ev->dur_us * 1e-3};
                if (ev->start_us < step_start[u]) step_start[u] = ev->start_us;
                if (ev->start_us + ev->dur_us > step_end[u]) step_end[u] = ev->start_us + ev->dur_us;
            }
            k = e;
        }
        /* Pass 3: per track and step, busy time and last end. */
        for (int k = 0; k < n;) {
            int e = k;
            while (e < n && all[e].rank == all[k].rank) e++;
            const int na = s->n_actions[ts_chunk_rank(s, all[k].chunk)];
            for (int u = 0; u < used; u++) {
                double busy = 0.0, last = -INFINITY;
                for (int j = k + (u + skip) * na; j < k + (u + skip + 1) * na; j++) {
                    busy += all[j].dur_us;
                    if (all[j].start_us + all[j].dur_us > last) last = all[j].start_us + all[j].dur_us;
                }
                const double span = step_end[u] - step_start[u], own = last - step_start[u];
                b_make[u] += (span > 0 ? 1.0 - busy / span : 0.0) / tracks;
                b_span[u] += (own > 0 ? 1.0 - busy / own : 0.0) / tracks;
            }
            k = e;
        }
        tc->n_chunks = nc;
        tc->f = ts_malloc(sizeof(double) * (size_t)nc);
        tc->i = ts_malloc(sizeof(double) * (size_t)nc);
        tc->w = ts_malloc(sizeof(double) * (size_t)nc);
        /* Sorted by chunk, kind and duration: each group is a sorted run. */
        qsort(dur, (size_t)n_dur, sizeof *dur, cmp_group_dur);
        double *stat = ts_calloc((size_t)nc * 4, sizeof(double));
        int *cnt = ts_calloc((size_t)nc * 4, sizeof(int));
        for (int k = 0; k < n_dur;) {
            int e = k;
            double sum = 0.0;
            while (e < n_dur && dur[e].group == dur[k].group) sum += dur[e++].ms;
            const int len = e - k, mid = k + len / 2;
            cnt[dur[k].group] = len;
            stat[dur[k].group] = !use_median ? sum / len
                                 : len % 2  ? dur[mid].ms
                                            : 0.5 * (dur[mid - 1].ms + dur[mid].ms);
            k = e;
        }
        for (int c = 0; c < nc && st == TS_OK; c++) {
            const int *nk = cnt + c * 4;
            const double *sc = stat + c * 4;
            if (!nk[TS_ACT_F])
                st = ts_fail("--costs-from-trace: no forward of chunk %d in %s", c, path);
            tc->f[c] = sc[TS_ACT_F];
            if (nk[TS_ACT_I] && nk[TS_ACT_W]) {
                tc->i[c] = sc[TS_ACT_I];
                tc->w[c] = sc[TS_ACT_W];
            } else if (nk[TS_ACT_B]) {
                tc->i[c] = tc->w[c] = 0.5 * sc[TS_ACT_B];
            } else if (st == TS_OK) {
                st = ts_fail("--costs-from-trace: no backward (B, or I and W) of chunk %d in %s", c,
                             path);
            }
        }
        free(stat);
        free(cnt);
        tc->steps = steps;
        tc->skip = skip;
        tc->n_tracks = tracks;
        for (int u = 0; u < used; u++) step_end[u] = (step_end[u] - step_start[u]) * 1e-3;
        tc->step_ms = ts_median(step_end, used);
        tc->bubble = ts_median(b_make, used);
        tc->bubble_rank_span = ts_median(b_span, used);
    }
    free(step_start);
    free(step_end);
    free(b_make);
    free(b_span);
    free(dur);
    free(all);
    if (st != TS_OK) ts_trace_costs_free(tc);
    return st;
}

double ts_plan_sim_bubble_rank_span(const ts_sim_result *r)
{
    double total = 0.0;
    for (int q = 0; q < r->pp; q++) {
        double busy = 0.0, last = 0.0;
        for (int k = 0; k < r->n_events; k++) {
            const ts_sim_event *e = &r->events[k];
            if (e->rank != q || e->kind == TS_SIM_OPTIM) continue;
            busy += e->end - e->start;
            if (e->end > last) last = e->end;
        }
        total += last > 0 ? 1.0 - busy / last : 0.0;
    }
    return r->pp > 0 ? total / r->pp : 0.0;
}
