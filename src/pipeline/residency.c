#include "pipeline/residency.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int ts_residency_tied_chunk(const ts_schedule *s, bool tied)
{
    const int head = s->n_chunks - 1;
    if (!tied || head == 0 || ts_chunk_rank(s, 0) != ts_chunk_rank(s, head)) return -1;
    return 0;
}

/* Does action a use chunk c's weights and gradients? */
static bool uses(const ts_action *a, int c, int head, int tied_chunk)
{
    return a->chunk == c || (c == tied_chunk && a->chunk == head);
}

static int cmp_span(const void *x, const void *y)
{
    const ts_residency_span *a = x, *b = y;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return (a->chunk > b->chunk) - (a->chunk < b->chunk);
}

void ts_residency_build(const ts_schedule *s, int rank, int tied_chunk, const bool *held_to_end,
                        ts_residency *r)
{
    memset(r, 0, sizeof *r);
    const int n = s->n_actions[rank], C = s->n_chunks, head = C - 1;
    const ts_action *acts = s->actions[rank];
    r->n_actions = n;
    r->n_chunks = C;
    r->gathers = ts_calloc((size_t)C, sizeof(int));
    r->grad_alloc = ts_malloc((size_t)C * sizeof(int));
    r->grad_free = ts_malloc((size_t)C * sizeof(int));
    r->grad_last = ts_malloc((size_t)C * sizeof(int));
    r->spans = ts_calloc((size_t)C * 2 + 1, sizeof *r->spans);
    for (int c = 0; c < C; c++) {
        r->grad_alloc[c] = r->grad_free[c] = r->grad_last[c] = -1;
        if (ts_chunk_rank(s, c) != rank) continue;
        int f0 = -1, f1 = -1, b0 = -1, b1 = -1;
        for (int i = 0; i < n; i++) {
            if (!uses(&acts[i], c, head, tied_chunk)) continue;
            if (acts[i].kind == TS_ACT_F) {
                if (f0 < 0) f0 = i;
                f1 = i;
            } else {
                if (b0 < 0) b0 = i;
                b1 = i;
            }
        }
        if (f0 < 0 && b0 < 0) continue; /* a chunk with no actions (m = 0 cannot happen) */
        r->grad_alloc[c] = b0;
        r->grad_last[c] = b1;
        if (f0 >= 0 && b0 >= 0 && b0 > f1 + 1) { /* two residencies */
            r->spans[r->n_spans++] = (ts_residency_span){c, f0, f1, 0};
            r->spans[r->n_spans++] = (ts_residency_span){c, b0, b1, 0};
            r->gathers[c] = 2;
        } else {
            int lo = f0 >= 0 ? f0 : b0, hi = b1 > f1 ? b1 : f1;
            r->spans[r->n_spans++] = (ts_residency_span){c, lo, hi, 0};
            r->gathers[c] = 1;
        }
    }
    /* Prefetch points; a chunk's backward residency whose gather would be issued while
     * its forward residency still holds the weights keeps them instead (one residency),
     * until no such pair is left. */
    for (bool merged = true; merged;) {
        merged = false;
        qsort(r->spans, (size_t)r->n_spans, sizeof *r->spans, cmp_span);
        for (int k = 0; k < r->n_spans; k++) r->spans[k].issue = k == 0 ? 0 : r->spans[k - 1].first;
        for (int k = 0; k < r->n_spans && !merged; k++)
            for (int j = 0; j < k && !merged; j++)
                if (r->spans[j].chunk == r->spans[k].chunk && r->spans[k].issue <= r->spans[j].last) {
                    r->spans[j].last = r->spans[k].last;
                    r->gathers[r->spans[k].chunk]--;
                    r->spans[k] = r->spans[--r->n_spans];
                    merged = true;
                }
    }

    /* Gradient buffers: freed just before the second allocation after the last backward.
     * Allocations per action first (at most one chunk's per action: its first backward),
     * so that the walk is O(actions) per chunk, not O(actions x chunks): the planner
     * builds this for every rank of every grid it searches. */
    int *alloc_at = ts_calloc((size_t)n + 1, sizeof(int));
    for (int c = 0; c < C; c++)
        if (r->grad_alloc[c] >= 0) alloc_at[r->grad_alloc[c]]++;
    for (int c = 0; c < C; c++) {
        if (r->grad_alloc[c] < 0) continue;
        int after = 0;
        r->grad_free[c] = n;
        if (held_to_end && held_to_end[c]) continue;
        for (int i = r->grad_last[c] + 1; i < n; i++) {
            after += alloc_at[i];
            if (after >= 2) {
                r->grad_free[c] = i;
                break;
            }
        }
    }
    free(alloc_at);
    /* A chunk used by the head's actions keeps its gradient buffer as long as the head's
     * does (its last backward-use covers them already: uses()). */
}

void ts_residency_free(ts_residency *r)
{
    free(r->spans);
    free(r->gathers);
    free(r->grad_alloc);
    free(r->grad_free);
    free(r->grad_last);
    memset(r, 0, sizeof *r);
}

double ts_residency_peak_bytes(const ts_residency *r, const double *param_bytes,
                               const double *grad_bytes)
{
    /* The bytes each action changes, gathered first (O(actions + chunks + spans), not
     * their product: the planner calls this for every rank of every grid it searches):
     * before action i, gradient frees, then allocations, then weight gathers issued;
     * after it, weights whose residency ends there. */
    const int n = r->n_actions;
    double *before = ts_calloc((size_t)n + 1, sizeof(double));
    double *after = ts_calloc((size_t)n + 1, sizeof(double));
    double *freed = ts_calloc((size_t)n + 1, sizeof(double));
    for (int c = 0; c < r->n_chunks; c++) {
        if (r->grad_alloc[c] < 0) continue;
        freed[r->grad_free[c]] += grad_bytes[c];
        before[r->grad_alloc[c]] += grad_bytes[c];
    }
    if (param_bytes)
        for (int k = 0; k < r->n_spans; k++) {
            before[r->spans[k].issue] += param_bytes[r->spans[k].chunk];
            after[r->spans[k].last] += param_bytes[r->spans[k].chunk];
        }
    double live = 0.0, peak = 0.0;
    for (int i = 0; i < n; i++) {
        live -= freed[i];
        live += before[i];
        if (live > peak) peak = live;
        live -= after[i];
    }
    free(before);
    free(after);
    free(freed);
    return peak;
}
