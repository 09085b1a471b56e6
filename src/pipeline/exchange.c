/* Exchange programs (exchange.h): built from a schedule's action lists, checked by a
 * rendezvous replay.
 *
 * Construction. The schedule is first timed on a unit cost model: F = I = W = 1, B = 2,
 * free communication; each rank runs its list in order, an action starting once its
 * rank is free and its input from another chunk is done. This gives start[r][j] for
 * every action, strictly increasing along each rank's list. A transfer X gets the time
 * t(X) = the start of the action that consumes it. On every rank r, the group of step g
 * (the gap before action g) owns the times (start[r][g-1], start[r][g]], with -inf
 * before the first action and +inf after the last: the gaps of a rank cut the time line
 * into disjoint, increasing intervals. X goes, on each of its two ranks, into the gap
 * that owns t(X). On the consumer that is the gap right before the consuming action
 * (just in time). On the producer it is the gap before its first action that starts
 * at or after t(X): after the producing action, since t(X) >= the producer's end >
 * its start; and for an activation, before the sender's backward of the same chunk and
 * micro-batch, which starts after the receiver's backward, itself after t. Within a
 * group ops are sorted by t; t differs between two messages from one rank to another
 * (they feed different actions of the receiver), so on both sides a pair's messages
 * go in the order of t: the order that matches them.
 *
 * Why it cannot deadlock. Suppose the rendezvous replay gets stuck; among the stuck
 * ranks take one whose current group G has the smallest upper end sup(G) of its
 * interval. An op of G waits for its partner in a group P of another rank that is not
 * posted yet: that rank is stuck at a group H before P. The op's time t lies in both
 * G's and P's intervals, and H's interval lies below P's, so sup(H) < t <= sup(G):
 * a smaller current group, a contradiction. The timing model decides only where a
 * send lands (how well the program overlaps); any timing where starts increase along
 * each rank and an action starts after its inputs end gives a deadlock-free program. In 1F1B's steady state it puts a forward's send and the
 * next backward's receive at the same time, so into one group: Megatron's
 * send_forward_recv_backward (and send_backward_recv_forward on the other side).
 *
 * Checking (ts_xchg_validate) does not trust the construction: it recomputes the
 * transfers from the schedule, matches every pair's sends and receives by order, and
 * replays all ranks with rendezvous semantics. */
#include "pipeline/exchange.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const long k_cost[4] = { 1, 2, 1, 1 }; /* F, B, I, W on the timing model */

/* ---- the schedule's transfers --------------------------------------------------- */

/* Where each (kind, chunk, mb) is in its rank's list: at[kind][chunk * m + mb], or -1. */
typedef struct {
    int m, n_cells;
    int *at[4];
} action_index;

static void index_init(action_index *ix, const ts_schedule *s)
{
    ix->m = s->m;
    ix->n_cells = s->n_chunks * s->m;
    for (int k = 0; k < 4; k++) {
        ix->at[k] = ts_malloc((size_t)ix->n_cells * sizeof(int));
        for (int j = 0; j < ix->n_cells; j++) ix->at[k][j] = -1;
    }
    for (int r = 0; r < s->pp; r++)
        for (int j = 0; j < s->n_actions[r]; j++) {
            ts_action a = s->actions[r][j];
            ix->at[a.kind][a.chunk * s->m + a.mb] = j;
        }
}

static void index_free(action_index *ix)
{
    for (int k = 0; k < 4; k++) free(ix->at[k]);
}

/* The kind of the backward of (chunk, mb) that sends the input gradient: B or I. */
static ts_action_kind backward_kind(const action_index *ix, int chunk, int mb)
{
    return ix->at[TS_ACT_B][chunk * ix->m + mb] >= 0 ? TS_ACT_B : TS_ACT_I;
}

typedef struct {
    ts_xchg_dir dir;
    int chunk, mb; /* the consuming chunk and the micro-batch */
    int from, to;  /* producing and consuming pipeline ranks */
    int p, c;      /* the producing action's index on `from`, the consuming one's on `to` */
} transfer;

/* The message action j of rank r consumes from another rank, if any (into *t). */
static bool consumed_transfer(const ts_schedule *s, const action_index *ix, int r, int j,
                              transfer *t)
{
    ts_action a = s->actions[r][j];
    int src;
    ts_action_kind src_kind;
    if (a.kind == TS_ACT_F && a.chunk > 0) {
        t->dir = TS_XCHG_ACT;
        src = a.chunk - 1;
        src_kind = TS_ACT_F;
    } else if ((a.kind == TS_ACT_B || a.kind == TS_ACT_I) && a.chunk < s->n_chunks - 1) {
        t->dir = TS_XCHG_GRAD;
        src = a.chunk + 1;
        src_kind = backward_kind(ix, src, a.mb);
    } else {
        return false;
    }
    t->from = ts_chunk_rank(s, src);
    if (t->from == r) return false; /* same rank: a copy, not a message */
    t->chunk = a.chunk;
    t->mb = a.mb;
    t->to = r;
    t->c = j;
    t->p = ix->at[src_kind][src * s->m + a.mb];
    return true;
}

/* Every cross-rank transfer of a validated schedule, in consumer order; *n of them. */
static transfer *list_transfers(const ts_schedule *s, const action_index *ix, int *n)
{
    int total = 0;
    for (int r = 0; r < s->pp; r++) total += s->n_actions[r];
    transfer *tr = ts_malloc((size_t)total * sizeof *tr);
    *n = 0;
    for (int r = 0; r < s->pp; r++)
        for (int j = 0; j < s->n_actions[r]; j++)
            if (consumed_transfer(s, ix, r, j, &tr[*n])) (*n)++;
    return tr;
}

/* Index of a transfer by what it carries: dir * n_cells + chunk * m + mb. */
static int transfer_key(const action_index *ix, ts_xchg_dir dir, int chunk, int mb)
{
    return (int)dir * ix->n_cells + chunk * ix->m + mb;
}

/* ---- construction ----------------------------------------------------------------- */

/* start[r][j] on the unit cost model (top of file). The schedule is validated, so the
 * replay reaches the end. */
static long **time_actions(const ts_schedule *s, const action_index *ix)
{
    const int pp = s->pp, m = s->m;
    long *end = ts_malloc((size_t)ix->n_cells * 4 * sizeof(long)); /* [kind][cell] */
    for (int j = 0; j < ix->n_cells * 4; j++) end[j] = -1;
    long *free_at = ts_calloc((size_t)pp, sizeof(long));
    int *next = ts_calloc((size_t)pp, sizeof(int));
    long **start = ts_malloc((size_t)pp * sizeof *start);
    int left = 0;
    for (int r = 0; r < pp; r++) {
        start[r] = ts_malloc((size_t)s->n_actions[r] * sizeof(long));
        left += s->n_actions[r];
    }
    for (bool progress = true; left > 0 && progress;) {
        progress = false;
        for (int r = 0; r < pp; r++)
            for (; next[r] < s->n_actions[r]; next[r]++, left--, progress = true) {
                ts_action a = s->actions[r][next[r]];
                long ready = 0; /* same-rank inputs come earlier in the list */
                if (a.kind == TS_ACT_F && a.chunk > 0)
                    ready = end[TS_ACT_F * ix->n_cells + (a.chunk - 1) * m + a.mb];
                else if ((a.kind == TS_ACT_B || a.kind == TS_ACT_I) && a.chunk < s->n_chunks - 1)
                    ready = end[backward_kind(ix, a.chunk + 1, a.mb) * ix->n_cells +
                                (a.chunk + 1) * m + a.mb];
                if (ready < 0) break;
                long t = ready > free_at[r] ? ready : free_at[r];
                start[r][next[r]] = t;
                free_at[r] = t + k_cost[a.kind];
                end[a.kind * ix->n_cells + a.chunk * m + a.mb] = free_at[r];
            }
    }
    TS_ASSERT(left == 0); /* ts_schedule_validate's replay would have failed */
    free(end);
    free(free_at);
    free(next);
    return start;
}

/* The gap of a rank (0 .. n) that owns time t: before its first action starting at or
 * after t; n when none does. */
static int gap_of(const long *start, int n, long t)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (start[mid] >= t)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

typedef struct {
    int gap;
    long t;
    ts_xchg_op op;
} placed_op;

static int cmp_placed(const void *pa, const void *pb)
{
    const placed_op *a = pa, *b = pb;
    const long ka[] = { a->gap, a->t, a->op.kind, a->op.peer, a->op.dir, a->op.chunk, a->op.mb };
    const long kb[] = { b->gap, b->t, b->op.kind, b->op.peer, b->op.dir, b->op.chunk, b->op.mb };
    for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++)
        if (ka[i] != kb[i]) return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

/* Fill x from each rank's placed ops (sorted here). */
static void fill_program(ts_xchg *x, const ts_schedule *s, placed_op **pl, const int *n_pl)
{
    const int pp = s->pp;
    x->pp = pp;
    x->n_steps = ts_calloc((size_t)pp, sizeof(int));
    x->steps = ts_calloc((size_t)pp, sizeof *x->steps);
    x->n_ops = ts_calloc((size_t)pp, sizeof(int));
    x->ops = ts_calloc((size_t)pp, sizeof *x->ops);
    for (int r = 0; r < pp; r++) {
        qsort(pl[r], (size_t)n_pl[r], sizeof *pl[r], cmp_placed);
        const int n_steps = s->n_actions[r] + 1;
        x->n_steps[r] = n_steps;
        x->n_ops[r] = n_pl[r];
        x->ops[r] = ts_malloc((size_t)n_pl[r] * sizeof(ts_xchg_op));
        x->steps[r] = ts_calloc((size_t)n_steps, sizeof(ts_xchg_step));
        int o = 0;
        for (int k = 0; k < n_steps; k++) {
            ts_xchg_step *st = &x->steps[r][k];
            st->ops = x->ops[r] + o;
            st->action = k < s->n_actions[r] ? k : -1;
            for (; o < n_pl[r] && pl[r][o].gap == k; o++) {
                x->ops[r][o] = pl[r][o].op;
                st->n_ops++;
            }
        }
        TS_ASSERT(o == n_pl[r]);
    }
}

/* The gap of the receive that feeds action c of rank r: right before it, or, when it is
 * the second action of an overlapped pair and `hoist`, before the pair's first action,
 * so that on a backend with a communication stream (NCCL) the message arrives while the
 * first action computes (DualPipe's overlap). */
static int recv_gap(const ts_schedule *s, int r, int c, bool hoist)
{
    return hoist && c > 0 && s->actions[r][c - 1].overlap ? c - 1 : c;
}

static ts_status build_program(ts_xchg *x, const ts_schedule *s, bool hoist);

ts_status ts_xchg_build(ts_xchg *x, const ts_schedule *s)
{
    memset(x, 0, sizeof *x);
    if (ts_schedule_validate(s, NULL) != TS_OK)
        return ts_error_prefix("exchange program of schedule \"%s\": ", s->name);
    bool pairs = false;
    for (int r = 0; r < s->pp && !pairs; r++)
        for (int j = 0; j < s->n_actions[r] && !pairs; j++) pairs = s->actions[r][j].overlap;
    /* Hoisting a pair's receive makes its group wait for the sender earlier; where that
     * could deadlock (the validator's rendezvous replay says so), the pairs keep their
     * receives just in time and run as two plain actions. */
    if (pairs && build_program(x, s, true) == TS_OK) return TS_OK;
    return build_program(x, s, false);
}

static ts_status build_program(ts_xchg *x, const ts_schedule *s, bool hoist)
{
    memset(x, 0, sizeof *x);
    const int pp = s->pp;
    action_index ix;
    index_init(&ix, s);
    int n_tr;
    transfer *tr = list_transfers(s, &ix, &n_tr);
    long **start = time_actions(s, &ix);

    placed_op **pl = ts_calloc((size_t)pp, sizeof *pl);
    int *n_pl = ts_calloc((size_t)pp, sizeof(int));
    for (int r = 0; r < pp; r++) pl[r] = ts_malloc((size_t)(2 * n_tr) * sizeof(placed_op));
    for (int k = 0; k < n_tr; k++) {
        const transfer *t = &tr[k];
        const long when = start[t->to][t->c];
        const int send_gap = gap_of(start[t->from], s->n_actions[t->from], when);
        TS_ASSERT(send_gap > t->p); /* when >= end of the producer > its start */
        pl[t->from][n_pl[t->from]++] = (placed_op){
            send_gap, when, { TS_XCHG_SEND, t->dir, t->to, t->chunk, t->mb }
        };
        pl[t->to][n_pl[t->to]++] = (placed_op){
            recv_gap(s, t->to, t->c, hoist), when, { TS_XCHG_RECV, t->dir, t->from, t->chunk, t->mb }
        };
    }
    fill_program(x, s, pl, n_pl);

    for (int r = 0; r < pp; r++) {
        free(pl[r]);
        free(start[r]);
    }
    free(pl);
    free(n_pl);
    free(start);
    free(tr);
    index_free(&ix);

    if (ts_xchg_validate(x, s) != TS_OK) { /* a bug here, not in the schedule */
        ts_xchg_free(x);
        return ts_error_prefix("internal error: the exchange program built for schedule "
                               "\"%s\" (pp = %d, v = %d, m = %d) is invalid: ",
                               s->name, s->pp, s->v, s->m);
    }
    return TS_OK;
}

void ts_xchg_free(ts_xchg *x)
{
    if (!x) return;
    for (int r = 0; r < x->pp; r++) {
        if (x->steps) free(x->steps[r]);
        if (x->ops) free(x->ops[r]);
    }
    free(x->n_steps);
    free(x->steps);
    free(x->n_ops);
    free(x->ops);
    memset(x, 0, sizeof *x);
}

int ts_xchg_total_ops(const ts_xchg *x)
{
    int n = 0;
    for (int r = 0; r < x->pp; r++) n += x->n_ops[r];
    return n;
}

/* ---- checking --------------------------------------------------------------------- */

const char *ts_xchg_op_str(char *buf, size_t size, const ts_xchg_op *op)
{
    const bool send = op->kind == TS_XCHG_SEND;
    snprintf(buf, size, "%s %s(c%d,mb%d)%s%d", send ? "send" : "recv",
             op->dir == TS_XCHG_ACT ? "act" : "grad", op->chunk, op->mb, send ? "->" : "<-",
             op->peer);
    return buf;
}

/* Steps n_actions + 1 with actions 0, 1, ..., -1; ops contiguous in x->ops[r]; fields
 * in range. */
static ts_status check_shape(const ts_xchg *x, const ts_schedule *s)
{
    if (x->pp != s->pp || !x->n_steps || !x->steps || !x->n_ops || !x->ops)
        return ts_fail("exchange program has pp = %d (schedule: %d) or no per-rank arrays",
                       x->pp, s->pp);
    char buf[64];
    for (int r = 0; r < s->pp; r++) {
        if (x->n_steps[r] != s->n_actions[r] + 1 || !x->steps[r])
            return ts_fail("rank %d has %d exchange steps for %d actions: there must be one "
                           "per action and a last one",
                           r, x->n_steps[r], s->n_actions[r]);
        int o = 0;
        for (int k = 0; k < x->n_steps[r]; k++) {
            const ts_xchg_step *st = &x->steps[r][k];
            if (st->action != (k < s->n_actions[r] ? k : -1))
                return ts_fail("rank %d step %d runs action %d, not %d", r, k, st->action,
                               k < s->n_actions[r] ? k : -1);
            if (st->n_ops < 0 || (st->n_ops > 0 && st->ops != x->ops[r] + o))
                return ts_fail("rank %d step %d: its ops are not the next %d of the rank's "
                               "op array",
                               r, k, st->n_ops);
            for (int i = 0; i < st->n_ops; i++) {
                const ts_xchg_op *op = &st->ops[i];
                if ((op->kind != TS_XCHG_SEND && op->kind != TS_XCHG_RECV) ||
                    (op->dir != TS_XCHG_ACT && op->dir != TS_XCHG_GRAD) || op->peer < 0 ||
                    op->peer >= s->pp || op->peer == r || op->chunk < 0 ||
                    op->chunk >= s->n_chunks || op->mb < 0 || op->mb >= s->m)
                    return ts_fail("rank %d step %d: op %s (kind %d, dir %d) is out of range "
                                   "(pp = %d, %d chunks, m = %d)",
                                   r, k, ts_xchg_op_str(buf, sizeof buf, op), (int)op->kind,
                                   (int)op->dir, s->pp, s->n_chunks, s->m);
            }
            o += st->n_ops;
        }
        if (o != x->n_ops[r] || (o > 0 && !x->ops[r]))
            return ts_fail("rank %d: its steps hold %d ops, its op array %d", r, o, x->n_ops[r]);
    }
    return TS_OK;
}

/* One side of an ordered pair (a, b): a's sends to b, or b's receives from a, in
 * program order, with their steps. */
typedef struct {
    int n;
    const ts_xchg_op **op;
    int *step;
} op_seq;

static void collect(const ts_xchg *x, int rank, ts_xchg_kind kind, int peer, op_seq *q)
{
    q->n = 0;
    for (int k = 0; k < x->n_steps[rank]; k++)
        for (int i = 0; i < x->steps[rank][k].n_ops; i++) {
            const ts_xchg_op *op = &x->steps[rank][k].ops[i];
            if (op->kind != kind || op->peer != peer) continue;
            q->op[q->n] = op;
            q->step[q->n++] = k;
        }
}

/* Match every pair's sends and receives by order; the partner of op i of rank r (its
 * index in x->ops[r]) is in step partner[r][i] of rank op->peer. */
static ts_status check_pairs(const ts_xchg *x, int **partner)
{
    int most = 0;
    for (int r = 0; r < x->pp; r++) most = x->n_ops[r] > most ? x->n_ops[r] : most;
    op_seq sq = { 0, ts_malloc((size_t)most * sizeof(void *)), ts_malloc((size_t)most * sizeof(int)) };
    op_seq rq = { 0, ts_malloc((size_t)most * sizeof(void *)), ts_malloc((size_t)most * sizeof(int)) };
    ts_status st = TS_OK;
    char b1[64], b2[64];
    for (int a = 0; a < x->pp && st == TS_OK; a++)
        for (int b = 0; b < x->pp && st == TS_OK; b++) {
            if (a == b) continue;
            collect(x, a, TS_XCHG_SEND, b, &sq);
            collect(x, b, TS_XCHG_RECV, a, &rq);
            for (int j = 0; j < sq.n && j < rq.n && st == TS_OK; j++) {
                const ts_xchg_op *so = sq.op[j], *ro = rq.op[j];
                if (so->dir != ro->dir || so->chunk != ro->chunk || so->mb != ro->mb)
                    st = ts_fail("mismatch: message %d from rank %d to rank %d is %s (rank %d "
                                 "step %d) on the sender but %s (rank %d step %d) on the "
                                 "receiver; order-matched transfers need the same order on "
                                 "both sides",
                                 j + 1, a, b, ts_xchg_op_str(b1, sizeof b1, so), a, sq.step[j],
                                 ts_xchg_op_str(b2, sizeof b2, ro), b, rq.step[j]);
                partner[a][so - x->ops[a]] = rq.step[j];
                partner[b][ro - x->ops[b]] = sq.step[j];
            }
            if (st == TS_OK && sq.n != rq.n)
                st = ts_fail("mismatch: rank %d sends %d messages to rank %d, which receives "
                             "%d from it",
                             a, sq.n, b, rq.n);
        }
    free(sq.op);
    free(sq.step);
    free(rq.op);
    free(rq.step);
    return st;
}

/* Every op is a transfer of the schedule, on the right ranks, sent after its producer
 * (an activation also before the sender's backward of that chunk and micro-batch) and
 * received no later than its consumer; every transfer is sent and received once. */
static ts_status check_transfers(const ts_xchg *x, const ts_schedule *s)
{
    action_index ix;
    index_init(&ix, s);
    int n_tr;
    transfer *tr = list_transfers(s, &ix, &n_tr);
    int *of_key = ts_malloc((size_t)ix.n_cells * 2 * sizeof(int));
    for (int j = 0; j < ix.n_cells * 2; j++) of_key[j] = -1;
    for (int k = 0; k < n_tr; k++) of_key[transfer_key(&ix, tr[k].dir, tr[k].chunk, tr[k].mb)] = k;
    char *seen = ts_calloc((size_t)n_tr * 2, 1); /* [transfer][send, recv] */
    ts_status st = TS_OK;
    char buf[64], cell[32];
    for (int r = 0; r < s->pp && st == TS_OK; r++)
        for (int k = 0; k < x->n_steps[r] && st == TS_OK; k++)
            for (int i = 0; i < x->steps[r][k].n_ops && st == TS_OK; i++) {
                const ts_xchg_op *op = &x->steps[r][k].ops[i];
                const bool send = op->kind == TS_XCHG_SEND;
                const int id = of_key[transfer_key(&ix, op->dir, op->chunk, op->mb)];
                const transfer *t = id >= 0 ? &tr[id] : NULL;
                ts_xchg_op_str(buf, sizeof buf, op);
                if (!t || (send ? t->from : t->to) != r || (send ? t->to : t->from) != op->peer)
                    st = ts_fail("rank %d step %d: %s is not a transfer of schedule \"%s\" "
                                 "between these ranks",
                                 r, k, buf, s->name);
                else if (seen[2 * id + !send]++)
                    st = ts_fail("rank %d step %d: %s appears twice", r, k, buf);
                else if (send && k <= t->p)
                    st = ts_fail("rank %d step %d: %s comes before the action that produces "
                                 "it (%s, action %d)",
                                 r, k, buf, ts_action_cell(cell, sizeof cell, s->actions[r][t->p]),
                                 t->p);
                else if (send && op->dir == TS_XCHG_ACT &&
                         k > ix.at[backward_kind(&ix, op->chunk - 1, op->mb)]
                                  [(op->chunk - 1) * s->m + op->mb])
                    st = ts_fail("rank %d step %d: %s comes after the backward of the chunk "
                                 "that produced it, which frees its activations",
                                 r, k, buf);
                else if (!send && k > t->c)
                    st = ts_fail("rank %d step %d: %s comes after the action that consumes "
                                 "it (%s, action %d)",
                                 r, k, buf, ts_action_cell(cell, sizeof cell, s->actions[r][t->c]),
                                 t->c);
            }
    for (int k = 0; k < n_tr && st == TS_OK; k++)
        if (!seen[2 * k] || !seen[2 * k + 1])
            st = ts_fail("incomplete exchange: %s(c%d,mb%d) from rank %d to rank %d is never "
                         "%s",
                         tr[k].dir == TS_XCHG_ACT ? "act" : "grad", tr[k].chunk, tr[k].mb,
                         tr[k].from, tr[k].to, !seen[2 * k] ? "sent" : "received");
    free(seen);
    free(of_key);
    free(tr);
    index_free(&ix);
    return st;
}

/* The rendezvous replay: a rank at step k has posted the group of step k; the group
 * completes once every op's partner is posted (its rank is at or past the partner's
 * step); then the action runs and the rank moves to step k+1. */
static ts_status replay(const ts_xchg *x, const ts_schedule *s, int *const *partner)
{
    const int pp = x->pp;
    int *cur = ts_calloc((size_t)pp, sizeof(int));
    int left = pp;
    for (bool progress = true; left > 0 && progress;) {
        progress = false;
        for (int r = 0; r < pp; r++) {
            while (cur[r] < x->n_steps[r]) {
                const ts_xchg_step *st = &x->steps[r][cur[r]];
                bool done = true;
                for (int i = 0; i < st->n_ops && done; i++)
                    done = cur[st->ops[i].peer] >= partner[r][st->ops - x->ops[r] + i];
                if (!done) break;
                if (++cur[r] == x->n_steps[r]) left--;
                progress = true;
            }
        }
    }
    ts_status st = TS_OK;
    if (left > 0) {
        char msg[1536], buf[64];
        size_t len = (size_t)snprintf(msg, sizeof msg, "exchange deadlocks:");
        for (int r = 0, shown = 0; r < pp && len < sizeof msg - 1; r++) {
            if (cur[r] == x->n_steps[r]) continue;
            const ts_xchg_step *step = &x->steps[r][cur[r]];
            for (int i = 0; i < step->n_ops; i++) {
                const ts_xchg_op *op = &step->ops[i];
                const int need = partner[r][step->ops - x->ops[r] + i];
                if (cur[op->peer] >= need) continue;
                if (shown++ == 8) {
                    snprintf(msg + len, sizeof msg - len, " ...");
                    r = pp;
                    break;
                }
                len += (size_t)snprintf(msg + len, sizeof msg - len,
                                        "%s rank %d at step %d (%s) waits for rank %d, which "
                                        "is at step %d, to reach its step %d",
                                        shown > 1 ? ";" : "", r, cur[r],
                                        ts_xchg_op_str(buf, sizeof buf, op), op->peer,
                                        cur[op->peer], need);
                break; /* one op per rank */
            }
        }
        st = ts_fail("%s (schedule \"%s\")", msg, s->name);
    }
    free(cur);
    return st;
}

ts_status ts_xchg_validate(const ts_xchg *x, const ts_schedule *s)
{
    if (ts_schedule_validate(s, NULL) != TS_OK) return TS_ERR;
    ts_status st = check_shape(x, s);
    if (st != TS_OK) return st;
    int **partner = ts_calloc((size_t)x->pp, sizeof *partner);
    for (int r = 0; r < x->pp; r++) partner[r] = ts_calloc((size_t)x->n_ops[r], sizeof(int));
    st = check_pairs(x, partner);
    if (st == TS_OK) st = check_transfers(x, s);
    if (st == TS_OK) st = replay(x, s, partner);
    for (int r = 0; r < x->pp; r++) free(partner[r]);
    free(partner);
    return st;
}
