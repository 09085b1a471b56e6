/* Replaying action lists on a cost model (see sim.h). */
#include "pipeline/sim.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOT_DONE (-1.0)

typedef struct {
    const ts_schedule *s;
    const ts_sim_costs *c;
    int m, n_chunks;
    double *f_done, *g_done, *w_done; /* [n_chunks * m] finish times; g = B or I */
} sim;

static size_t slot(const sim *S, int chunk, int mb) { return (size_t)chunk * (size_t)S->m + (size_t)mb; }

static double duration(const sim *S, const ts_action *a)
{
    const ts_sim_costs *c = S->c;
    switch (a->kind) {
    case TS_ACT_F: return c->f[a->chunk];
    case TS_ACT_B: return c->i[a->chunk] + c->w[a->chunk];
    case TS_ACT_I: return c->i[a->chunk];
    case TS_ACT_W: return c->w[a->chunk];
    }
    return 0.0;
}

/* The communication an overlapped partner may hide in `a` (sim.h). */
static double comm_of(const sim *S, const ts_action *a)
{
    const ts_sim_costs *c = S->c;
    switch (a->kind) {
    case TS_ACT_F: return c->f_comm ? c->f_comm[a->chunk] : 0.0;
    case TS_ACT_B:
    case TS_ACT_I: return c->i_comm ? c->i_comm[a->chunk] : 0.0;
    case TS_ACT_W: return 0.0;
    }
    return 0.0;
}

static double min2(double a, double b) { return a < b ? a : b; }

/* What the pair partner before `a` on its rank (previous action q_prev, its event ev)
 * hides of the two actions' communication, given a's inputs ready at `ready` (sim.h). */
static double pair_hidden(const sim *S, const ts_action *prev, const ts_sim_event *ev,
                          const ts_action *a, double ready)
{
    const double ca = comm_of(S, prev), cb = comm_of(S, a);
    if (ca <= 0 && cb <= 0) return 0.0;
    const double h = min2(ca, duration(S, a) - cb) + min2(cb, duration(S, prev) - ca);
    const double span = ev->end - ev->start;
    if (h <= 0 || span <= 0 || ready >= ev->end) return 0.0;
    return ready <= ev->start ? h : h * (ev->end - ready) / span;
}

/* When the output of `dep_chunk` (finished at `done`) is usable on `rank`. */
static double arrival(const sim *S, int dep_chunk, int rank, double done)
{
    if (ts_chunk_rank(S->s, dep_chunk) == rank) return done;
    const ts_sim_costs *c = S->c;
    double t = done + c->latency;
    if (c->bandwidth > 0) t += c->msg_bytes / c->bandwidth;
    return t;
}

/* The time all inputs of `a` (on `rank`) have arrived, or NOT_DONE if one is missing. */
static double inputs_ready(const sim *S, const ts_action *a, int rank)
{
    const int c = a->chunk, i = a->mb;
    double t = 0.0;
    switch (a->kind) {
    case TS_ACT_F:
        if (c > 0) {
            double d = S->f_done[slot(S, c - 1, i)];
            if (d < 0) return NOT_DONE;
            t = arrival(S, c - 1, rank, d);
        }
        break;
    case TS_ACT_B:
    case TS_ACT_I: {
        double d = S->f_done[slot(S, c, i)];
        if (d < 0) return NOT_DONE;
        t = d;
        if (c < S->n_chunks - 1) {
            double g = S->g_done[slot(S, c + 1, i)];
            if (g < 0) return NOT_DONE;
            double at = arrival(S, c + 1, rank, g);
            if (at > t) t = at;
        }
        break;
    }
    case TS_ACT_W: {
        double d = S->g_done[slot(S, c, i)];
        if (d < 0) return NOT_DONE;
        t = d;
        break;
    }
    }
    return t;
}

static const char *act_str(const ts_action *a, char *buf, size_t size)
{
    snprintf(buf, size, "%c(chunk %d, mb %d)", *ts_action_letter(a->kind), a->chunk, a->mb);
    return buf;
}

/* Every action on its chunk's rank, in range, once; every (chunk, mb) covered. */
static ts_status check_complete(const ts_schedule *s)
{
    const int m = s->m, n = s->n_chunks;
    char *seen = ts_calloc((size_t)n * (size_t)m * 4, 1); /* [chunk][mb][kind] */
    char buf[64];
    ts_status st = TS_OK;
    for (int r = 0; r < s->pp && st == TS_OK; r++)
        for (int k = 0; k < s->n_actions[r]; k++) {
            const ts_action *a = &s->actions[r][k];
            if (a->chunk < 0 || a->chunk >= n || a->mb < 0 || a->mb >= m || (int)a->kind < (int)TS_ACT_F ||
                (int)a->kind > (int)TS_ACT_W) {
                st = ts_fail("schedule %s: rank %d action %d %s is out of range (%d chunks, %d "
                             "micro-batches)",
                             s->name, r, k, act_str(a, buf, sizeof buf), n, m);
                break;
            }
            if (ts_chunk_rank(s, a->chunk) != r) {
                st = ts_fail("schedule %s: rank %d runs %s, but chunk %d lives on rank %d",
                             s->name, r, act_str(a, buf, sizeof buf), a->chunk,
                             ts_chunk_rank(s, a->chunk));
                break;
            }
            char *f = &seen[((size_t)a->chunk * (size_t)m + (size_t)a->mb) * 4 + (size_t)a->kind];
            if (*f) {
                st = ts_fail("schedule %s: %s appears twice", s->name, act_str(a, buf, sizeof buf));
                break;
            }
            *f = 1;
        }
    for (int c = 0; c < n && st == TS_OK; c++)
        for (int i = 0; i < m; i++) {
            const char *f = &seen[((size_t)c * (size_t)m + (size_t)i) * 4];
            bool ok = f[TS_ACT_F] && ((f[TS_ACT_B] && !f[TS_ACT_I] && !f[TS_ACT_W]) ||
                                      (!f[TS_ACT_B] && f[TS_ACT_I] && f[TS_ACT_W]));
            if (!ok) {
                st = ts_fail("schedule %s: chunk %d micro-batch %d needs one F and either one B "
                             "or one I and one W (has F %d, B %d, I %d, W %d)",
                             s->name, c, i, f[TS_ACT_F], f[TS_ACT_B], f[TS_ACT_I], f[TS_ACT_W]);
                break;
            }
        }
    free(seen);
    return st;
}

static ts_status deadlock(const sim *S, const int *pos)
{
    const ts_schedule *s = S->s;
    size_t cap = 128 + (size_t)s->pp * 64, at = 0;
    char *msg = ts_malloc(cap), buf[64];
    at += (size_t)snprintf(msg, cap, "schedule %s deadlocks: ", s->name);
    for (int r = 0, first = 1; r < s->pp && at < cap; r++) {
        if (pos[r] >= s->n_actions[r]) continue;
        at += (size_t)snprintf(msg + at, cap - at, "%srank %d waits at %s", first ? "" : "; ", r,
                               act_str(&s->actions[r][pos[r]], buf, sizeof buf));
        first = 0;
    }
    ts_status st = ts_fail("%s (its inputs are never produced before it in the order the "
                           "ranks run their lists)",
                           msg);
    free(msg);
    return st;
}

/* The dp lanes: each rank runs its reductions one at a time, in the order they become
 * ready (ties: the later chunk first, as the gradient buckets run from the end of the
 * buffer). A chunk's P pieces are ready at (j+1)/P of its last B or W. dp_done[q] = when
 * rank q's last reduction ends (0 when it has none). */
typedef struct {
    double ready;
    int chunk, piece;
} dp_piece;

static int cmp_piece(const void *pa, const void *pb)
{
    const dp_piece *a = pa, *b = pb;
    if (a->ready != b->ready) return a->ready < b->ready ? -1 : 1;
    if (a->chunk != b->chunk) return a->chunk > b->chunk ? -1 : 1;
    return a->piece - b->piece;
}

static void dp_lanes(const ts_schedule *s, const ts_sim_costs *c, ts_sim_result *r,
                     double *dp_done)
{
    const int n = s->n_chunks;
    double *start = ts_malloc(sizeof(double) * (size_t)n), *end = ts_malloc(sizeof(double) * (size_t)n);
    int total = 0;
    for (int k = 0; k < n; k++) {
        start[k] = end[k] = 0.0;
        total += c->dp_pieces && c->dp_pieces[k] > 1 ? c->dp_pieces[k] : 1;
    }
    for (int k = 0; k < r->n_events; k++) { /* the chunk's last B/W pass */
        const ts_sim_event *e = &r->events[k];
        if ((e->kind == TS_ACT_B || e->kind == TS_ACT_W) && e->end > end[e->chunk]) {
            start[e->chunk] = e->start;
            end[e->chunk] = e->end;
        }
    }
    dp_piece *items = ts_malloc(sizeof(dp_piece) * (size_t)total);
    r->dp_events = ts_calloc((size_t)total, sizeof(ts_sim_event));
    for (int q = 0; q < s->pp; q++) {
        int m = 0;
        for (int k = 0; k < n; k++) {
            if (ts_chunk_rank(s, k) != q) continue;
            const int P = c->dp_pieces && c->dp_pieces[k] > 1 ? c->dp_pieces[k] : 1;
            for (int j = 0; j < P; j++)
                items[m++] = (dp_piece){start[k] + (end[k] - start[k]) * (j + 1) / P, k, j};
        }
        qsort(items, (size_t)m, sizeof *items, cmp_piece);
        double lane = 0.0;
        for (int j = 0; j < m; j++) {
            const int k = items[j].chunk;
            const int P = c->dp_pieces && c->dp_pieces[k] > 1 ? c->dp_pieces[k] : 1;
            double begin = items[j].ready > lane ? items[j].ready : lane;
            double cost = c->dp_latency +
                          (c->dp_bandwidth > 0 ? c->dp_bytes[k] / P / c->dp_bandwidth : 0.0);
            lane = begin + cost;
            r->dp_busy[q] += cost;
            r->dp_events[r->n_dp_events++] = (ts_sim_event){
                .rank = q, .kind = TS_SIM_DP, .chunk = k, .mb = -1, .start = begin, .end = lane};
        }
        dp_done[q] = lane;
    }
    free(items);
    free(start);
    free(end);
}

void ts_sim_result_free(ts_sim_result *r)
{
    free(r->dp_busy);
    free(r->dp_wait);
    free(r->dp_events);
    free(r->comm);
    free(r->comm_hidden);
    free(r->busy);
    free(r->bubble);
    free(r->peak_act_bytes);
    free(r->peak_act_mb);
    free(r->events);
    memset(r, 0, sizeof *r);
}

ts_status ts_sim_run(const ts_schedule *s, const ts_sim_costs *c, ts_sim_result *r)
{
    memset(r, 0, sizeof *r);
    if (c->n_chunks != s->n_chunks)
        return ts_fail("simulator: costs for %d chunks, schedule %s has %d", c->n_chunks,
                       s->name, s->n_chunks);
    if (check_complete(s) != TS_OK) return TS_ERR;

    const int pp = s->pp;
    sim S = {.s = s, .c = c, .m = s->m, .n_chunks = s->n_chunks};
    const size_t slots = (size_t)s->n_chunks * (size_t)s->m;
    S.f_done = ts_malloc(slots * sizeof(double));
    S.g_done = ts_malloc(slots * sizeof(double));
    S.w_done = ts_malloc(slots * sizeof(double));
    for (size_t k = 0; k < slots; k++) S.f_done[k] = S.g_done[k] = S.w_done[k] = NOT_DONE;

    int *pos = ts_calloc((size_t)pp, sizeof(int));
    int *first_event = ts_calloc((size_t)pp, sizeof(int));
    double *free_at = ts_calloc((size_t)pp, sizeof(double));
    double *held = ts_calloc((size_t)pp, sizeof(double));
    int *held_mb = ts_calloc((size_t)pp, sizeof(int));
    r->pp = pp;
    r->busy = ts_calloc((size_t)pp, sizeof(double));
    r->bubble = ts_calloc((size_t)pp, sizeof(double));
    r->peak_act_bytes = ts_calloc((size_t)pp, sizeof(double));
    r->peak_act_mb = ts_calloc((size_t)pp, sizeof(int));
    r->dp_busy = ts_calloc((size_t)pp, sizeof(double));
    r->dp_wait = ts_calloc((size_t)pp, sizeof(double));
    r->comm = ts_calloc((size_t)pp, sizeof(double));
    r->comm_hidden = ts_calloc((size_t)pp, sizeof(double));
    int total = 0;
    for (int q = 0; q < pp; q++) {
        first_event[q] = total;
        total += s->n_actions[q] + (c->optim ? 1 : 0);
    }
    r->n_events = total;
    r->events = ts_calloc((size_t)(total > 0 ? total : 1), sizeof(ts_sim_event));

    /* Round-robin over ranks: run each rank's next actions while their inputs are
     * done. Any order of this loop gives the same times (an action's start depends only
     * on its rank's previous action and its inputs); no progress in a full round with
     * actions left is a deadlock. */
    int remaining = 0;
    for (int q = 0; q < pp; q++) remaining += s->n_actions[q];
    ts_status st = TS_OK;
    while (remaining > 0) {
        int progress = 0;
        for (int q = 0; q < pp; q++) {
            while (pos[q] < s->n_actions[q]) {
                const ts_action *a = &s->actions[q][pos[q]];
                double ready = inputs_ready(&S, a, q);
                if (ready < 0) break;
                double start = ready > free_at[q] ? ready : free_at[q];
                /* The second action of an overlapped pair: its partner hides some of
                 * the two's communication. */
                double hidden = 0.0;
                if (pos[q] > 0 && s->actions[q][pos[q] - 1].overlap)
                    hidden = pair_hidden(&S, &s->actions[q][pos[q] - 1],
                                         &r->events[first_event[q] + pos[q] - 1], a, ready);
                double end = start + duration(&S, a) - hidden;
                r->comm[q] += comm_of(&S, a);
                r->comm_hidden[q] += hidden;
                size_t k = slot(&S, a->chunk, a->mb);
                double bytes = c->act_bytes ? c->act_bytes[a->chunk] : 0.0;
                switch (a->kind) {
                case TS_ACT_F:
                    S.f_done[k] = end;
                    held[q] += bytes;
                    held_mb[q]++;
                    if (held[q] > r->peak_act_bytes[q]) r->peak_act_bytes[q] = held[q];
                    if (held_mb[q] > r->peak_act_mb[q]) r->peak_act_mb[q] = held_mb[q];
                    break;
                case TS_ACT_I: S.g_done[k] = end; break;
                case TS_ACT_B:
                case TS_ACT_W:
                    if (a->kind == TS_ACT_B)
                        S.g_done[k] = end;
                    else
                        S.w_done[k] = end;
                    held[q] -= bytes;
                    held_mb[q]--;
                    break;
                }
                r->events[first_event[q] + pos[q]] = (ts_sim_event){
                    .rank = q, .kind = (int)a->kind, .chunk = a->chunk, .mb = a->mb,
                    .start = start, .end = end};
                r->busy[q] += end - start;
                free_at[q] = end;
                pos[q]++;
                remaining--;
                progress++;
            }
        }
        if (!progress) {
            st = deadlock(&S, pos);
            break;
        }
    }

    if (st == TS_OK) {
        /* The optimizer (or the step's end) waits for the rank's dp reductions. */
        double *dp_done = ts_calloc((size_t)pp, sizeof(double)), without_dp = 0.0;
        if (c->dp_bytes) dp_lanes(s, c, r, dp_done);
        for (int q = 0; q < pp; q++) {
            double optim = c->optim ? c->optim[q] : 0.0;
            if (free_at[q] + optim > without_dp) without_dp = free_at[q] + optim;
            if (dp_done[q] > free_at[q]) {
                r->dp_wait[q] = dp_done[q] - free_at[q];
                free_at[q] = dp_done[q];
            }
            if (c->optim) {
                double start = free_at[q], end = start + optim;
                r->events[first_event[q] + s->n_actions[q]] =
                    (ts_sim_event){.rank = q, .kind = TS_SIM_OPTIM, .chunk = -1, .mb = -1,
                                   .start = start, .end = end};
                r->busy[q] += end - start;
                free_at[q] = end;
            }
            if (free_at[q] > r->step_time) r->step_time = free_at[q];
        }
        r->dp_exposed = r->step_time - without_dp;
        free(dp_done);
        double sum = 0.0;
        for (int q = 0; q < pp; q++) {
            r->bubble[q] = r->step_time > 0 ? (r->step_time - r->busy[q]) / r->step_time : 0.0;
            sum += r->bubble[q];
        }
        r->bubble_mean = pp > 0 ? sum / pp : 0.0;
    }

    free(S.f_done);
    free(S.g_done);
    free(S.w_done);
    free(pos);
    free(first_event);
    free(free_at);
    free(held);
    free(held_mb);
    if (st != TS_OK) ts_sim_result_free(r);
    return st;
}

void ts_sim_to_trace(const ts_sim_result *r, double us_per_unit, ts_trace *t)
{
    static const char *cats[] = {"F", "B", "I", "W", "optim"};
    int rank = -1;
    double prev_end = 0.0;
    for (int k = 0; k < r->n_events; k++) {
        const ts_sim_event *e = &r->events[k];
        if (e->rank != rank) rank = e->rank, prev_end = 0.0;
        /* A gap before an action is time spent waiting for its input. */
        if (e->start > prev_end * (1 + 1e-12) + 1e-15) {
            ts_trace_event w = ts_trace_event_make("wait", e->rank, e->chunk, e->mb,
                                                   prev_end * us_per_unit,
                                                   (e->start - prev_end) * us_per_unit);
            ts_trace_add(t, &w);
        }
        ts_trace_event ev = ts_trace_event_make(cats[e->kind], e->rank, e->chunk, e->mb,
                                                e->start * us_per_unit,
                                                (e->end - e->start) * us_per_unit);
        ts_trace_add(t, &ev);
        prev_end = e->end;
    }
    for (int k = 0; k < r->n_dp_events; k++) {
        const ts_sim_event *e = &r->dp_events[k];
        ts_trace_event ev = ts_trace_event_make("dpreduce", e->rank, e->chunk, -1,
                                                e->start * us_per_unit,
                                                (e->end - e->start) * us_per_unit);
        ev.track = TS_TRACE_TRACK_DP;
        ts_trace_add(t, &ev);
    }
}
