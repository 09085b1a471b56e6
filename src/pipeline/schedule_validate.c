/* ts_schedule_validate: completeness, per-rank order, deadlock freedom, peak memory.
 *
 * Deadlock freedom is checked by a round-robin replay of the true data dependencies
 * (the engine posts receives early and sends without blocking, so buffer order cannot
 * deadlock; only a cycle of waits can): each pass lets every rank run its next actions
 * for as long as their inputs exist; a pass that moves no rank, with actions left,
 * is a deadlock. Actions in messages are numbered from 1 within their rank's list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/schedule.h"

char *ts_action_cell(char *buf, size_t size, ts_action a)
{
    snprintf(buf, size, "%d%c%d", a.chunk, "FBIW"[a.kind], a.mb);
    return buf;
}

/* Where each (chunk, mb) has its F, B, I and W: the index in its rank's list, or -1. */
typedef struct {
    int n_cells; /* n_chunks * m */
    int *at[4];  /* [kind][chunk * m + mb] */
} placement;

static void placement_free(placement *p)
{
    for (int k = 0; k < 4; k++) free(p->at[k]);
}

/* Action j of list[n] starts a valid overlapped pair: the next action exists, is not
 * paired on, and one of the two is a forward, the other a backward (B or I). */
static bool overlap_pair(const ts_action *list, int n, int j)
{
    if (j + 1 >= n || list[j + 1].overlap) return false;
    const ts_action_kind a = list[j].kind, b = list[j + 1].kind;
    const bool a_bwd = a == TS_ACT_B || a == TS_ACT_I, b_bwd = b == TS_ACT_B || b == TS_ACT_I;
    return (a == TS_ACT_F && b_bwd) || (a_bwd && b == TS_ACT_F);
}

/* Ranges, rank placement and duplicates, filling *p. */
static ts_status place_actions(const ts_schedule *s, placement *p)
{
    char cell[32];
    p->n_cells = s->n_chunks * s->m;
    for (int k = 0; k < 4; k++) {
        p->at[k] = ts_malloc((size_t)p->n_cells * sizeof(int));
        for (int j = 0; j < p->n_cells; j++) p->at[k][j] = -1;
    }
    for (int r = 0; r < s->pp; r++) {
        if (s->n_actions[r] < 0 || (s->n_actions[r] > 0 && !s->actions[r]))
            return ts_fail("rank %d has a broken action list (%d actions)", r, s->n_actions[r]);
        for (int j = 0; j < s->n_actions[r]; j++) {
            ts_action a = s->actions[r][j];
            if ((int)a.kind < TS_ACT_F || (int)a.kind > TS_ACT_W)
                return ts_fail("rank %d action %d has an unknown kind %d", r, j + 1, (int)a.kind);
            if (a.chunk < 0 || a.chunk >= s->n_chunks)
                return ts_fail("rank %d action %d (%s): chunk %d is out of range: pp * v = %d "
                               "chunks (0..%d)",
                               r, j + 1, ts_action_cell(cell, sizeof cell, a), a.chunk,
                               s->n_chunks, s->n_chunks - 1);
            if (a.mb < 0 || a.mb >= s->m)
                return ts_fail("rank %d action %d (%s): micro-batch %d is out of range: "
                               "m = %d micro-batches (0..%d)",
                               r, j + 1, ts_action_cell(cell, sizeof cell, a), a.mb, s->m,
                               s->m - 1);
            if (ts_chunk_rank(s, a.chunk) != r)
                return ts_fail("rank %d action %d (%s): chunk %d lives on pipeline rank %d "
                               "(the schedule's %s placement), not on rank %d",
                               r, j + 1, ts_action_cell(cell, sizeof cell, a), a.chunk,
                               ts_chunk_rank(s, a.chunk), ts_placement_names[s->placement], r);
            if (a.overlap && !overlap_pair(s->actions[r], s->n_actions[r], j))
                return ts_fail("rank %d action %d (%s): an overlapped pair is a forward and a "
                               "backward (B or I) of another chunk or micro-batch, one after "
                               "the other, and nothing more",
                               r, j + 1, ts_action_cell(cell, sizeof cell, a));
            int *slot = &p->at[a.kind][a.chunk * s->m + a.mb];
            if (*slot >= 0)
                return ts_fail("%.1s(chunk %d, mb %d) appears twice on rank %d: actions %d "
                               "and %d (%s)",
                               ts_action_letter(a.kind), a.chunk, a.mb, r, *slot + 1, j + 1,
                               ts_action_cell(cell, sizeof cell, a));
            *slot = j;
        }
    }
    return TS_OK;
}

/* Every (chunk, mb): one F, and one B or one I + one W, in dependency order on its rank. */
static ts_status check_complete(const ts_schedule *s, const placement *p)
{
    for (int c = 0; c < s->n_chunks; c++) {
        int r = ts_chunk_rank(s, c);
        for (int i = 0; i < s->m; i++) {
            int j = c * s->m + i;
            int f = p->at[TS_ACT_F][j], b = p->at[TS_ACT_B][j];
            int in = p->at[TS_ACT_I][j], w = p->at[TS_ACT_W][j];
            if (f < 0)
                return ts_fail("incomplete schedule: rank %d never runs the forward "
                               "%dF%d (chunk %d, micro-batch %d)",
                               r, c, i, c, i);
            if (b >= 0 && (in >= 0 || w >= 0))
                return ts_fail("rank %d mixes a full backward %dB%d with split backward "
                               "passes (I/W) for chunk %d, micro-batch %d: use B, or I and W",
                               r, c, i, c, i);
            if (b < 0 && in < 0 && w < 0)
                return ts_fail("incomplete schedule: rank %d never runs a backward (B, or I "
                               "and W) for chunk %d, micro-batch %d",
                               r, c, i);
            if (b < 0 && (in < 0 || w < 0))
                return ts_fail("incomplete schedule: rank %d runs %d%c%d but not %d%c%d: a "
                               "split backward needs both I and W",
                               r, c, in >= 0 ? 'I' : 'W', i, c, in >= 0 ? 'W' : 'I', i);
            int bwd = b >= 0 ? b : in;
            if (bwd < f)
                return ts_fail("rank %d runs %d%s%d (action %d) before its forward %dF%d "
                               "(action %d)",
                               r, c, b >= 0 ? "B" : "I", i, bwd + 1, c, i, f + 1);
            if (b < 0 && w < in)
                return ts_fail("rank %d runs %dW%d (action %d) before its input-gradient pass "
                               "%dI%d (action %d)",
                               r, c, i, w + 1, c, i, in + 1);
        }
    }
    return TS_OK;
}

/* The action that `a` waits for on another rank, or false when it needs nothing there. */
static bool cross_dep(const ts_schedule *s, const placement *p, ts_action a, ts_action *dep)
{
    if (a.kind == TS_ACT_F) {
        if (a.chunk == 0) return false;
        *dep = (ts_action){ TS_ACT_F, a.chunk - 1, a.mb, false };
        return true;
    }
    if (a.kind == TS_ACT_W || a.chunk == s->n_chunks - 1) return false;
    int j = (a.chunk + 1) * s->m + a.mb;
    *dep = (ts_action){ p->at[TS_ACT_B][j] >= 0 ? TS_ACT_B : TS_ACT_I, a.chunk + 1, a.mb, false };
    return true;
}

/* Index into done[] of the cross-rank input of `a` (filling *dep), or -1 for none. */
static int dep_cell(const ts_schedule *s, const placement *p, ts_action a, ts_action *dep)
{
    if (!cross_dep(s, p, a, dep)) return -1;
    return dep->kind * p->n_cells + dep->chunk * s->m + dep->mb;
}

static ts_status check_deadlock(const ts_schedule *s, const placement *p)
{
    int pp = s->pp, m = s->m, left = 0;
    int *next = ts_calloc((size_t)pp, sizeof(int));
    bool *done = ts_calloc((size_t)p->n_cells * 4, sizeof(bool)); /* [kind][cell] */
    for (int r = 0; r < pp; r++) left += s->n_actions[r];
    bool progress = true;
    while (left > 0 && progress) {
        progress = false;
        for (int r = 0; r < pp; r++)
            while (next[r] < s->n_actions[r]) {
                ts_action a = s->actions[r][next[r]], dep;
                int need = dep_cell(s, p, a, &dep);
                if (need >= 0 && !done[need]) break;
                done[a.kind * p->n_cells + a.chunk * m + a.mb] = true; /* same-rank deps: */
                next[r]++;                                             /* checked by order */
                left--;
                progress = true;
            }
    }
    ts_status st = TS_OK;
    if (left > 0) {
        char msg[1536], cell[32];
        size_t len = (size_t)snprintf(msg, sizeof msg, "schedule deadlocks:");
        int shown = 0;
        for (int r = 0; r < pp && len < sizeof msg - 1; r++) {
            if (next[r] >= s->n_actions[r]) continue;
            ts_action a = s->actions[r][next[r]], dep = a;
            cross_dep(s, p, a, &dep);
            if (shown++ == 8) {
                snprintf(msg + len, sizeof msg - len, " ...");
                break;
            }
            len += (size_t)snprintf(msg + len, sizeof msg - len,
                                    "%s rank %d waits for %.1s(chunk %d, mb %d) at its action "
                                    "%d (%s)",
                                    shown > 1 ? ";" : "", r, ts_action_letter(dep.kind),
                                    dep.chunk, dep.mb, next[r] + 1,
                                    ts_action_cell(cell, sizeof cell, a));
        }
        st = ts_fail("%s; reorder the actions so that each rank's next action can get its "
                     "input (the forward of the previous chunk, the backward of the next)",
                     msg);
    }
    free(next);
    free(done);
    return st;
}

static void fill_report(const ts_schedule *s, ts_schedule_report *rep)
{
    rep->pp = s->pp;
    rep->peak_activations = ts_calloc((size_t)s->pp, sizeof(int));
    rep->total_peak = 0;
    for (int r = 0; r < s->pp; r++) {
        int held = 0, peak = 0;
        for (int j = 0; j < s->n_actions[r]; j++) {
            ts_action_kind k = s->actions[r][j].kind;
            held += k == TS_ACT_F ? 1 : (k == TS_ACT_B || k == TS_ACT_W) ? -1 : 0;
            if (held > peak) peak = held;
        }
        rep->peak_activations[r] = peak;
        if (peak > rep->total_peak) rep->total_peak = peak;
    }
}

ts_status ts_schedule_validate(const ts_schedule *s, ts_schedule_report *rep)
{
    if (rep) memset(rep, 0, sizeof *rep);
    if (s->pp < 1 || s->v < 1 || s->m < 1 || s->n_chunks != s->pp * s->v)
        return ts_fail("schedule \"%s\" has pp = %d, v = %d, m = %d, n_chunks = %d: all must "
                       "be >= 1 and n_chunks = pp * v",
                       s->name, s->pp, s->v, s->m, s->n_chunks);
    if (!s->n_actions || !s->actions)
        return ts_fail("schedule \"%s\" has no action lists", s->name);
    if (!s->chunk_rank || (int)s->placement < 0 || s->placement >= TS_N_PLACEMENTS)
        return ts_fail("schedule \"%s\" has no placement of its chunks on ranks", s->name);
    for (int c = 0; c < s->n_chunks; c++)
        if (s->chunk_rank[c] < 0 || s->chunk_rank[c] >= s->pp)
            return ts_fail("schedule \"%s\" places chunk %d on pipeline rank %d of pp = %d",
                           s->name, c, s->chunk_rank[c], s->pp);
    placement p = { 0 };
    ts_status st = place_actions(s, &p);
    if (st == TS_OK) st = check_complete(s, &p);
    if (st == TS_OK) st = check_deadlock(s, &p);
    placement_free(&p);
    if (st == TS_OK && rep) fill_report(s, rep);
    return st;
}

void ts_schedule_report_free(ts_schedule_report *rep)
{
    if (!rep) return;
    free(rep->peak_activations);
    memset(rep, 0, sizeof *rep);
}
