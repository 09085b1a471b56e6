/* Exchange programs (src/pipeline/exchange.c): for every built-in schedule, the
 * checked-in CSV and random CSV schedules, pp 1..4, v 1..2, several m, the program is
 * complete (each cross-rank transfer one send and one receive), in time (sends after
 * their producer, receives right before their consumer) and runs to the end on an
 * independent replay written here: per ordered pair of ranks a FIFO of posted sends and
 * one of posted receives, matched head to head with no tags (contents must agree), a
 * group done once all its ops are matched (rendezvous), and every action checking that
 * its input has arrived. Negative cases: swapped receives are a mismatch, and a naive
 * program (send as soon as produced) deadlocks where ts_xchg_build's does not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/exchange.h"
#include "pipeline/schedule.h"
#include "support/xchg_dump.h"
#include "test_util.h"

static char g_dir[256];

static bool msg_has(const char *needle) { return strstr(ts_error_message(), needle) != NULL; }

/* ---- Independent model of the transfers ---------------------------------------- */

/* pos[kind][chunk * m + mb]: index of the action in its rank's list, or -1. */
typedef struct {
    int m, n_chunks, pp, cells;
    int *pos[4];
    const int *rank;     /* the schedule's chunk -> rank */
    const ts_schedule *s;
} where;

static void where_init(where *w, const ts_schedule *s)
{
    w->m = s->m;
    w->n_chunks = s->n_chunks;
    w->pp = s->pp;
    w->cells = s->n_chunks * s->m;
    w->rank = s->chunk_rank;
    w->s = s;
    for (int k = 0; k < 4; k++) {
        w->pos[k] = malloc(sizeof(int) * (size_t)w->cells);
        for (int j = 0; j < w->cells; j++) w->pos[k][j] = -1;
    }
    for (int r = 0; r < s->pp; r++)
        for (int j = 0; j < s->n_actions[r]; j++) {
            ts_action a = s->actions[r][j];
            w->pos[a.kind][a.chunk * s->m + a.mb] = j;
        }
}

static void where_free(where *w)
{
    for (int k = 0; k < 4; k++) free(w->pos[k]);
}

/* The transfer of (dir, chunk, mb) (chunk = the consumer's): false when it does not
 * cross ranks or does not exist. Fills producer/consumer ranks and action indices. */
static bool transfer_of(const where *w, ts_xchg_dir dir, int chunk, int mb, int *from, int *p,
                        int *to, int *c)
{
    int src = dir == TS_XCHG_ACT ? chunk - 1 : chunk + 1;
    if (src < 0 || src >= w->n_chunks) return false;
    *from = w->rank[src];
    *to = w->rank[chunk];
    if (*from == *to) return false;
    int cell = chunk * w->m + mb, scell = src * w->m + mb;
    if (dir == TS_XCHG_ACT) {
        *p = w->pos[TS_ACT_F][scell];
        *c = w->pos[TS_ACT_F][cell];
    } else {
        *p = w->pos[TS_ACT_B][scell] >= 0 ? w->pos[TS_ACT_B][scell] : w->pos[TS_ACT_I][scell];
        *c = w->pos[TS_ACT_B][cell] >= 0 ? w->pos[TS_ACT_B][cell] : w->pos[TS_ACT_I][cell];
    }
    return true;
}

/* Complete and in time: every transfer one send (after its producer; an activation
 * before the sender's backward of it) and one receive (in the step of its consumer);
 * no other op. */
static bool check_complete(const ts_xchg *x, const ts_schedule *s, char *why, size_t n)
{
    where w;
    where_init(&w, s);
    int *sends = calloc(2 * (size_t)w.cells, sizeof(int)), *recvs = calloc(2 * (size_t)w.cells, sizeof(int));
    bool ok = x->pp == s->pp;
    int total = 0;
    for (int r = 0; ok && r < s->pp; r++) {
        ok = x->n_steps[r] == s->n_actions[r] + 1;
        for (int k = 0; ok && k < x->n_steps[r]; k++)
            for (int i = 0; ok && i < x->steps[r][k].n_ops; i++) {
                const ts_xchg_op *op = &x->steps[r][k].ops[i];
                int from, p, to, c;
                total++;
                ok = transfer_of(&w, op->dir, op->chunk, op->mb, &from, &p, &to, &c);
                if (ok && op->kind == TS_XCHG_SEND) {
                    ok = r == from && op->peer == to && k > p;
                    if (ok && op->dir == TS_XCHG_ACT) { /* before the sender's backward */
                        int bc = (op->chunk - 1) * w.m + op->mb;
                        ok = k <= (w.pos[TS_ACT_B][bc] >= 0 ? w.pos[TS_ACT_B][bc]
                                                            : w.pos[TS_ACT_I][bc]);
                    }
                    sends[op->dir * w.cells + op->chunk * w.m + op->mb]++;
                } else if (ok) {
                    /* just in time, or in an overlapped pair's first group */
                    ok = r == to && op->peer == from &&
                         (k == c || (k == c - 1 && s->actions[r][k].overlap));
                    recvs[op->dir * w.cells + op->chunk * w.m + op->mb]++;
                }
                if (!ok)
                    snprintf(why, n, "rank %d step %d: op (kind %d dir %d c%d mb%d peer %d) is "
                             "no transfer or out of time", r, k, (int)op->kind, (int)op->dir,
                             op->chunk, op->mb, op->peer);
            }
    }
    int needed = 0;
    for (int d = 0; ok && d < 2; d++)
        for (int j = 0; ok && j < w.cells; j++) {
            int from, p, to, c;
            bool is = transfer_of(&w, (ts_xchg_dir)d, j / w.m, j % w.m, &from, &p, &to, &c);
            needed += is;
            ok = sends[d * w.cells + j] == is && recvs[d * w.cells + j] == is;
            if (!ok) snprintf(why, n, "dir %d c%d mb%d: %d sends, %d receives", d, j / w.m, j % w.m,
                              sends[d * w.cells + j], recvs[d * w.cells + j]);
        }
    if (ok && (total != 2 * needed || ts_xchg_total_ops(x) != total)) {
        snprintf(why, n, "%d ops (ts_xchg_total_ops %d) for %d transfers", total,
                 ts_xchg_total_ops(x), needed);
        ok = false;
    }
    free(sends);
    free(recvs);
    where_free(&w);
    return ok;
}

/* ---- Independent rendezvous replay over FIFO channels ------------------------------ */

typedef struct {
    const ts_xchg_op **q;
    int *owner_idx; /* index of the op in its rank's op array */
    int head, tail;
} fifo;

/* Runs all ranks: a rank posts its current group (a send only of data it has produced),
 * the heads of each pair's send and receive FIFOs are matched (same contents, or a
 * mismatch), a group whose ops are all matched completes, and its action runs (checking
 * its inputs have arrived). Returns true when every rank reaches its end. */
static bool replay_fifo(const ts_xchg *x, const ts_schedule *s, char *why, size_t n)
{
    const int pp = s->pp, m = s->m, cells = s->n_chunks * m;
    int cap = ts_xchg_total_ops(x) + 1;
    fifo *sendq = calloc((size_t)pp * pp, sizeof(fifo)), *recvq = calloc((size_t)pp * pp, sizeof(fifo));
    for (int j = 0; j < pp * pp; j++) {
        sendq[j].q = malloc(sizeof(void *) * (size_t)cap);
        sendq[j].owner_idx = malloc(sizeof(int) * (size_t)cap);
        recvq[j].q = malloc(sizeof(void *) * (size_t)cap);
        recvq[j].owner_idx = malloc(sizeof(int) * (size_t)cap);
    }
    bool **done = calloc((size_t)pp, sizeof *done); /* [rank][op]: matched */
    for (int r = 0; r < pp; r++) done[r] = calloc((size_t)x->n_ops[r] + 1, sizeof(bool));
    bool *produced = calloc(4 * (size_t)cells, sizeof(bool)); /* [kind][cell] */
    bool *arrived = calloc(2 * (size_t)cells, sizeof(bool));  /* [dir][cell] */
    int *cur = calloc((size_t)pp, sizeof(int));
    bool *posted = calloc((size_t)pp, sizeof(bool));
    bool ok = true, progress = true;
    int left = pp;
#define PRODUCED(k, c, i) produced[(k) * cells + (c) * m + (i)]
#define BWD_DONE(c, i) (PRODUCED(TS_ACT_B, c, i) || PRODUCED(TS_ACT_I, c, i))
    while (ok && left > 0 && progress) {
        progress = false;
        for (int r = 0; ok && r < pp; r++) { /* post */
            if (cur[r] == x->n_steps[r] || posted[r]) continue;
            const ts_xchg_step *st = &x->steps[r][cur[r]];
            for (int i = 0; ok && i < st->n_ops; i++) {
                const ts_xchg_op *op = &st->ops[i];
                int idx = (int)(st->ops - x->ops[r]) + i;
                fifo *f;
                if (op->kind == TS_XCHG_SEND) {
                    bool have = op->dir == TS_XCHG_ACT ? PRODUCED(TS_ACT_F, op->chunk - 1, op->mb)
                                                       : BWD_DONE(op->chunk + 1, op->mb);
                    if (!have) {
                        snprintf(why, n, "rank %d step %d sends c%d mb%d before producing it", r,
                                 cur[r], op->chunk, op->mb);
                        ok = false;
                    }
                    f = &sendq[r * pp + op->peer];
                } else {
                    f = &recvq[op->peer * pp + r];
                }
                f->q[f->tail] = op;
                f->owner_idx[f->tail++] = idx;
            }
            posted[r] = true;
            progress = true;
        }
        for (int a = 0; ok && a < pp; a++) /* match heads, by order only */
            for (int b = 0; ok && b < pp; b++) {
                fifo *fs = &sendq[a * pp + b], *fr = &recvq[a * pp + b];
                for (; ok && fs->head < fs->tail && fr->head < fr->tail; fs->head++, fr->head++) {
                    const ts_xchg_op *so = fs->q[fs->head], *ro = fr->q[fr->head];
                    if (so->dir != ro->dir || so->chunk != ro->chunk || so->mb != ro->mb) {
                        snprintf(why, n, "mismatch %d->%d: sent dir %d c%d mb%d, received as dir "
                                 "%d c%d mb%d", a, b, (int)so->dir, so->chunk, so->mb, (int)ro->dir,
                                 ro->chunk, ro->mb);
                        ok = false;
                        break;
                    }
                    done[a][fs->owner_idx[fs->head]] = done[b][fr->owner_idx[fr->head]] = true;
                    arrived[so->dir * cells + so->chunk * m + so->mb] = true;
                    progress = true;
                }
            }
        for (int r = 0; ok && r < pp; r++) { /* complete groups, run actions */
            if (!posted[r]) continue;
            const ts_xchg_step *st = &x->steps[r][cur[r]];
            bool all = true;
            for (int i = 0; i < st->n_ops; i++) all = all && done[r][st->ops - x->ops[r] + i];
            if (!all) continue;
            if (st->action >= 0) {
                ts_action a = s->actions[r][st->action];
                int c = a.chunk, i = a.mb;
                bool in = true;
                if (a.kind == TS_ACT_F && c > 0)
                    in = ts_chunk_rank(s, c - 1) == r ? PRODUCED(TS_ACT_F, c - 1, i)
                                           : arrived[TS_XCHG_ACT * cells + c * m + i];
                if ((a.kind == TS_ACT_B || a.kind == TS_ACT_I) && c < s->n_chunks - 1)
                    in = ts_chunk_rank(s, c + 1) == r ? BWD_DONE(c + 1, i)
                                           : arrived[TS_XCHG_GRAD * cells + c * m + i];
                if (!in) {
                    snprintf(why, n, "rank %d runs %c c%d mb%d before its input arrived", r,
                             "FBIW"[a.kind], c, i);
                    ok = false;
                }
                PRODUCED(a.kind, c, i) = true;
            }
            posted[r] = false;
            if (++cur[r] == x->n_steps[r]) left--;
            progress = true;
        }
    }
#undef PRODUCED
#undef BWD_DONE
    if (ok && left > 0) {
        size_t len = (size_t)snprintf(why, n, "deadlock:");
        for (int r = 0; r < pp && len < n; r++)
            if (cur[r] < x->n_steps[r])
                len += (size_t)snprintf(why + len, n - len, " rank %d at step %d;", r, cur[r]);
        ok = false;
    }
    for (int j = 0; j < pp * pp; j++) {
        free(sendq[j].q);
        free(sendq[j].owner_idx);
        free(recvq[j].q);
        free(recvq[j].owner_idx);
    }
    for (int r = 0; r < pp; r++) free(done[r]);
    free(done);
    free(sendq);
    free(recvq);
    free(produced);
    free(arrived);
    free(cur);
    free(posted);
    return ok;
}

/* Both independent checks; on failure says why on stderr. */
static bool check_program(const ts_xchg *x, const ts_schedule *s)
{
    char why[512] = "";
    bool ok = check_complete(x, s, why, sizeof why) && replay_fifo(x, s, why, sizeof why);
    if (!ok) fprintf(stderr, "  %s pp=%d v=%d m=%d: %s\n", s->name, s->pp, s->v, s->m, why);
    return ok;
}

/* Build, validate and check the exchange program of s; returns its op count or -1. */
static int exercise(const ts_schedule *s)
{
    ts_xchg x;
    ts_status st = ts_xchg_build(&x, s);
    CHECKF(st == TS_OK, "%s pp=%d v=%d m=%d: %s", s->name, s->pp, s->v, s->m, ts_error_message());
    if (st != TS_OK) return -1;
    CHECKF(ts_xchg_validate(&x, s) == TS_OK, "%s", ts_error_message());
    CHECK(check_program(&x, s));
    int n = ts_xchg_total_ops(&x);
    ts_xchg_free(&x);
    return n;
}

/* ---- Naive construction (for the negative test) ------------------------------------ */

typedef struct {
    int gap;
    ts_xchg_op op;
} naive_op;

static int cmp_naive(const void *pa, const void *pb)
{
    const naive_op *a = pa, *b = pb;
    if (a->gap != b->gap) return a->gap - b->gap;
    return (int)a->op.kind - (int)b->op.kind; /* sends first */
}

/* Each send right after the action that produces it, each receive right before the
 * action that consumes it: Megatron's pairing when the actions allow, nothing more. */
static void build_naive(ts_xchg *x, const ts_schedule *s)
{
    where w;
    where_init(&w, s);
    const int pp = s->pp;
    naive_op **pl = calloc((size_t)pp, sizeof *pl);
    int *n_pl = calloc((size_t)pp, sizeof(int));
    for (int r = 0; r < pp; r++) pl[r] = malloc(sizeof(naive_op) * 2 * (size_t)(w.cells * 2 + 1));
    for (int d = 0; d < 2; d++)
        for (int j = 0; j < w.cells; j++) {
            int from, p, to, c, chunk = j / w.m, mb = j % w.m;
            if (!transfer_of(&w, (ts_xchg_dir)d, chunk, mb, &from, &p, &to, &c)) continue;
            pl[from][n_pl[from]++] = (naive_op){ p + 1, { TS_XCHG_SEND, (ts_xchg_dir)d, to, chunk, mb } };
            pl[to][n_pl[to]++] = (naive_op){ c, { TS_XCHG_RECV, (ts_xchg_dir)d, from, chunk, mb } };
        }
    x->pp = pp;
    x->n_steps = calloc((size_t)pp, sizeof(int));
    x->steps = calloc((size_t)pp, sizeof *x->steps);
    x->n_ops = calloc((size_t)pp, sizeof(int));
    x->ops = calloc((size_t)pp, sizeof *x->ops);
    for (int r = 0; r < pp; r++) {
        qsort(pl[r], (size_t)n_pl[r], sizeof(naive_op), cmp_naive);
        x->n_steps[r] = s->n_actions[r] + 1;
        x->n_ops[r] = n_pl[r];
        x->ops[r] = malloc(sizeof(ts_xchg_op) * (size_t)(n_pl[r] + 1));
        x->steps[r] = calloc((size_t)x->n_steps[r], sizeof(ts_xchg_step));
        int o = 0;
        for (int k = 0; k < x->n_steps[r]; k++) {
            x->steps[r][k].ops = x->ops[r] + o;
            x->steps[r][k].action = k < s->n_actions[r] ? k : -1;
            for (; o < n_pl[r] && pl[r][o].gap == k; o++, x->steps[r][k].n_ops++)
                x->ops[r][o] = pl[r][o].op;
        }
        free(pl[r]);
    }
    free(pl);
    free(n_pl);
    where_free(&w);
}

/* ---- Random valid schedules --------------------------------------------------------- */

static unsigned next_rand(unsigned *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

/* A random topological order of all actions (each (chunk, mb) split into I and W with
 * probability 1/2), cut into the ranks' lists: valid by construction. */
/* A random valid schedule: random order, random split backwards, the placement
 * `placement` (loop, v, or with TS_PLACEMENT_OTHER a random chunk -> rank map), and
 * random overlapped F/B pairs among consecutive actions of a rank. */
static void random_schedule(ts_schedule *s, int pp, int v, int m, ts_placement placement,
                            unsigned *seed)
{
    ts_schedule_init(s, "random", pp, v, m);
    if (placement == TS_PLACEMENT_OTHER) {
        /* Every rank holds a chunk (a CSV line per rank), the rest anywhere: a shuffle. */
        for (int c = 0; c < pp * v; c++)
            s->chunk_rank[c] = c < pp ? c : (int)(next_rand(seed) % (unsigned)pp);
        for (int c = pp * v - 1; c > 0; c--) {
            const int k = (int)(next_rand(seed) % (unsigned)(c + 1)), t = s->chunk_rank[c];
            s->chunk_rank[c] = s->chunk_rank[k];
            s->chunk_rank[k] = t;
        }
        s->placement = ts_placement_of(s->chunk_rank, pp * v, pp);
    } else {
        ts_schedule_set_placement(s, placement);
    }
    const int n = pp * v, cells = n * m;
    /* A random map may give a rank more than v chunks: room for all of them. */
    for (int r = 0; r < pp; r++) s->actions[r] = calloc(3 * (size_t)(pp * v) * m, sizeof(ts_action));
    bool *split = malloc((size_t)cells), *f = calloc((size_t)cells, 1), *g = calloc((size_t)cells, 1),
         *wd = calloc((size_t)cells, 1);
    ts_action *ready = malloc(sizeof(ts_action) * 3 * (size_t)cells);
    for (int j = 0; j < cells; j++) split[j] = next_rand(seed) & 1;
    for (;;) {
        int n_ready = 0;
        for (int c = 0; c < n; c++)
            for (int i = 0; i < m; i++) {
                int j = c * m + i;
                if (!f[j] && (c == 0 || f[j - m])) ready[n_ready++] = (ts_action){ TS_ACT_F, c, i, false };
                if (f[j] && !g[j] && (c == n - 1 || g[j + m]))
                    ready[n_ready++] = (ts_action){ split[j] ? TS_ACT_I : TS_ACT_B, c, i, false };
                if (split[j] && g[j] && !wd[j]) ready[n_ready++] = (ts_action){ TS_ACT_W, c, i, false };
            }
        if (n_ready == 0) break;
        ts_action a = ready[next_rand(seed) % (unsigned)n_ready];
        int j = a.chunk * m + a.mb, r = ts_chunk_rank(s, a.chunk);
        s->actions[r][s->n_actions[r]++] = a;
        if (a.kind == TS_ACT_F) f[j] = true;
        else if (a.kind == TS_ACT_W) wd[j] = true;
        else g[j] = true;
    }
    for (int r = 0; r < pp; r++)
        for (int j = 0; j + 1 < s->n_actions[r]; j++) {
            ts_action *x = &s->actions[r][j], *y = x + 1;
            const bool xb = x->kind == TS_ACT_B || x->kind == TS_ACT_I;
            const bool yb = y->kind == TS_ACT_B || y->kind == TS_ACT_I;
            if (((x->kind == TS_ACT_F && yb) || (xb && y->kind == TS_ACT_F)) && next_rand(seed) % 2) {
                x->overlap = true;
                j++; /* a pair is two actions */
            }
        }
    free(split);
    free(f);
    free(g);
    free(wd);
    free(ready);
}

/* Some pair of ranks gets its messages in another order than the consumer uses them. */
static bool orders_differ(const ts_schedule *s)
{
    where w;
    where_init(&w, s);
    bool differ = false;
    for (int d = 0; d < 2 && !differ; d++)
        for (int j = 0; j < w.cells && !differ; j++)
            for (int k = 0; k < w.cells && !differ; k++) {
                int f1, p1, t1, c1, f2, p2, t2, c2;
                if (!transfer_of(&w, (ts_xchg_dir)d, j / w.m, j % w.m, &f1, &p1, &t1, &c1)) continue;
                for (int e = 0; e < 2 && !differ; e++)
                    if (transfer_of(&w, (ts_xchg_dir)e, k / w.m, k % w.m, &f2, &p2, &t2, &c2) &&
                        f1 == f2 && t1 == t2 && p1 < p2 && c1 > c2)
                        differ = true;
            }
    where_free(&w);
    return differ;
}

/* Receives of a pair's second action that the program moved into the pair's first
 * group (exchange.h): counted over every rank. */
static int hoisted_receives(const ts_schedule *s)
{
    ts_xchg x;
    if (ts_xchg_build(&x, s) != TS_OK) return 0;
    int n = 0;
    for (int r = 0; r < s->pp; r++)
        for (int k = 0; k + 1 < s->n_actions[r]; k++) {
            if (!s->actions[r][k].overlap) continue;
            const ts_xchg_step *st = &x.steps[r][k];
            for (int i = 0; i < st->n_ops; i++) {
                const ts_xchg_op *op = &st->ops[i];
                const ts_action b = s->actions[r][k + 1];
                const bool feeds_second = op->kind == TS_XCHG_RECV && op->chunk == b.chunk &&
                                          op->mb == b.mb &&
                                          (op->dir == TS_XCHG_ACT) == (b.kind == TS_ACT_F);
                n += feeds_second;
            }
        }
    ts_xchg_free(&x);
    return n;
}

/* ---- Tests ---------------------------------------------------------------------------- */

static void test_exchange_builtin_grid(void)
{
    const char *names[] = { "gpipe", "1f1b", "interleaved-1f1b", "zb-h1" };
    const int ms[] = { 1, 2, 3, 4, 5, 8, 12 };
    int built = 0;
    for (int pp = 1; pp <= 4; pp++)
        for (int v = 1; v <= 2; v++)
            for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
                for (int n = 0; n < 4; n++) {
                    int m = ms[k];
                    if (v > 1 && n != 2) continue;
                    if (v > 1 && m < pp) continue; /* interleaved needs m >= pp */
                    ts_schedule s;
                    if (ts_schedule_build(&s, names[n], pp, v, m) != TS_OK) {
                        CHECKF(0, "%s pp=%d v=%d m=%d: %s", names[n], pp, v, m, ts_error_message());
                        continue;
                    }
                    int ops = exercise(&s);
                    if (pp == 1) CHECKF(ops == 0, "pp = 1 has %d ops", ops);
                    if (pp > 1) /* every F but the last chunk's, every backward but chunk 0's */
                        CHECKF(ops == 2 * 2 * (pp * v - 1) * m, "%s pp=%d v=%d m=%d: %d ops",
                               names[n], pp, v, m, ops);
                    built++;
                    ts_schedule_free(&s);
                }
    printf("grid: %d built-in schedules exchanged and checked\n", built);
}

/* 1F1B's steady state pairs as Megatron's send_forward_recv_backward: rank r < pp-1
 * sends the output of the F just run in the group that receives the gradient of the
 * next B; rank r > 0 sends the gradient of the B just run with the receive of the next
 * F's input. */
static void test_exchange_1f1b_pairs(void)
{
    for (int pp = 2; pp <= 4; pp++)
        for (int m = pp; m <= 8; m++) {
            ts_schedule s;
            ts_xchg x;
            if (ts_schedule_build(&s, "1f1b", pp, 1, m) != TS_OK || ts_xchg_build(&x, &s) != TS_OK) {
                CHECKF(0, "%s", ts_error_message());
                continue;
            }
            int pairs = 0;
            for (int r = 0; r < pp; r++)
                for (int k = 1; k < s.n_actions[r]; k++) {
                    ts_action prev = s.actions[r][k - 1], a = s.actions[r][k];
                    const ts_xchg_step *st = &x.steps[r][k];
                    if (prev.kind == TS_ACT_F && a.kind == TS_ACT_B && r < pp - 1) {
                        CHECKF(st->n_ops == 2 && st->ops[0].kind == TS_XCHG_SEND &&
                                   st->ops[0].dir == TS_XCHG_ACT && st->ops[0].mb == prev.mb &&
                                   st->ops[1].kind == TS_XCHG_RECV &&
                                   st->ops[1].dir == TS_XCHG_GRAD && st->ops[1].mb == a.mb,
                               "1f1b pp=%d m=%d rank %d step %d: %d ops", pp, m, r, k, st->n_ops);
                        pairs++;
                    }
                    if (prev.kind == TS_ACT_B && a.kind == TS_ACT_F && r > 0) {
                        CHECKF(st->n_ops == 2 && st->ops[0].kind == TS_XCHG_SEND &&
                                   st->ops[0].dir == TS_XCHG_GRAD && st->ops[0].mb == prev.mb &&
                                   st->ops[1].kind == TS_XCHG_RECV &&
                                   st->ops[1].dir == TS_XCHG_ACT && st->ops[1].mb == a.mb,
                               "1f1b pp=%d m=%d rank %d step %d: %d ops", pp, m, r, k, st->n_ops);
                        pairs++;
                    }
                }
            CHECK(pairs > 0);
            ts_xchg_free(&x);
            ts_schedule_free(&s);
        }
}

/* The checked-in CSV; random valid schedules through the CSV reader. */
static void test_exchange_csv(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/schedules/example_1f1b_pp2.csv", src ? src : ".");
    ts_schedule s;
    CHECKF(ts_schedule_build(&s, path, 2, 1, 4) == TS_OK, "%s", ts_error_message());
    if (s.actions) {
        CHECK(exercise(&s) == 2 * 2 * 4);
        ts_schedule_free(&s);
    }

    char csv[512];
    snprintf(csv, sizeof csv, "%s/random.csv", g_dir);
    unsigned seed = 12345;
    int n = 0, reordered = 0, naive_stuck = 0;
    int placed[TS_N_PLACEMENTS] = { 0 }, pairs = 0, hoisted = 0;
    for (int pp = 2; pp <= 4; pp++)
        for (int v = 1; v <= 2; v++)
            for (int m = 1; m <= 8; m++)
                for (int rep = 0; rep < 6; rep++) {
                    ts_schedule gen;
                    const ts_placement want = (ts_placement)(rep % TS_N_PLACEMENTS);
                    random_schedule(&gen, pp, v, m, want, &seed);
                    CHECK(ts_schedule_write_csv(&gen, csv) == TS_OK);
                    if (ts_schedule_build(&s, csv, pp, v, m) != TS_OK) {
                        CHECKF(0, "random pp=%d v=%d m=%d: %s", pp, v, m, ts_error_message());
                        ts_schedule_free(&gen);
                        continue;
                    }
                    /* The CSV gives back the placement and the pairs. Chunks a random
                     * map leaves out of a rank still appear on the line of theirs. */
                    bool same = true; /* v = 1: the v placement is the loop one */
                    for (int c = 0; c < pp * v && same; c++) same = s.chunk_rank[c] == gen.chunk_rank[c];
                    for (int r = 0; r < pp && same; r++) {
                        same = s.n_actions[r] == gen.n_actions[r];
                        for (int j = 0; j < s.n_actions[r] && same; j++) {
                            const ts_action x = s.actions[r][j], y = gen.actions[r][j];
                            same = x.kind == y.kind && x.chunk == y.chunk && x.mb == y.mb &&
                                   x.overlap == y.overlap;
                            pairs += x.overlap;
                        }
                    }
                    CHECKF(same, "random pp=%d v=%d m=%d (%s placement): the CSV round trip "
                           "changed the schedule", pp, v, m, ts_placement_names[gen.placement]);
                    placed[s.placement]++;
                    ts_schedule_free(&gen);
                    hoisted += hoisted_receives(&s);
                    exercise(&s);
                    reordered += orders_differ(&s);
                    ts_xchg naive;
                    build_naive(&naive, &s);
                    if (ts_xchg_validate(&naive, &s) != TS_OK && msg_has("exchange deadlocks"))
                        naive_stuck++;
                    ts_xchg_free(&naive);
                    ts_schedule_free(&s);
                    n++;
                }
    printf("csv: %d random schedules (placement loop %d, v %d, other %d; %d overlapped "
           "pairs, %d receives hoisted into a pair's first group); %d with messages "
           "produced in another order than consumed; %d where the naive program deadlocks\n",
           n, placed[TS_PLACEMENT_LOOP], placed[TS_PLACEMENT_V], placed[TS_PLACEMENT_OTHER],
           pairs, hoisted, reordered, naive_stuck);
    CHECK(reordered > 0 && naive_stuck > 0); /* the random cases reach the hard parts */
    CHECK(placed[TS_PLACEMENT_V] > 0 && placed[TS_PLACEMENT_OTHER] > 0 && pairs > 0 && hoisted > 0);
}

static void test_exchange_swapped_receives(void)
{
    ts_schedule s;
    ts_xchg x;
    if (ts_schedule_build(&s, "1f1b", 2, 1, 4) != TS_OK || ts_xchg_build(&x, &s) != TS_OK) {
        CHECKF(0, "%s", ts_error_message());
        return;
    }
    /* Rank 1's first two receives (activations of mb 0 and 1) change places. */
    ts_xchg_op *first = NULL, *second = NULL;
    for (int i = 0; i < x.n_ops[1] && !second; i++)
        if (x.ops[1][i].kind == TS_XCHG_RECV) {
            if (!first) first = &x.ops[1][i];
            else second = &x.ops[1][i];
        }
    CHECK(first && second && first->mb == 0 && second->mb == 1);
    if (first && second) {
        ts_xchg_op tmp = *first;
        *first = *second;
        *second = tmp;
        ts_error_clear();
        CHECK(ts_xchg_validate(&x, &s) == TS_ERR && msg_has("mismatch") &&
              msg_has("from rank 0 to rank 1"));
        printf("swapped receives: %s\n", ts_error_message());
        char why[512] = "";
        CHECK(!replay_fifo(&x, &s, why, sizeof why) && strstr(why, "mismatch"));
        *second = *first;
        *first = tmp;
        CHECK(ts_xchg_validate(&x, &s) == TS_OK);
    }
    ts_xchg_free(&x);
    ts_schedule_free(&s);
}

/* Rank 1 runs W right after each I. Sending each output as soon as it is produced
 * deadlocks: rank 0 blocks sending mb 1 until rank 1 wants it (after W0), while rank 1
 * blocks sending the gradient of mb 0 until rank 0 wants it (after F2). */
static void test_exchange_naive_deadlock(void)
{
    const char *path = ts_test_write_file(g_dir, "zb_like.csv",
                                          "0F0,0F1,0F2,0I0,0W0,0I1,0W1,0I2,0W2\n"
                                          "1F0,1I0,1W0,1F1,1I1,1W1,1F2,1I2,1W2\n");
    ts_schedule s;
    if (ts_schedule_build(&s, path, 2, 1, 3) != TS_OK) {
        CHECKF(0, "%s", ts_error_message());
        return;
    }
    ts_xchg naive;
    build_naive(&naive, &s);
    ts_error_clear();
    CHECK(ts_xchg_validate(&naive, &s) == TS_ERR && msg_has("exchange deadlocks") &&
          msg_has("rank 0 at step 2 (send act(c1,mb1)->1) waits for rank 1"));
    printf("naive program: %s\n", ts_error_message());
    char why[512] = "";
    CHECK(!replay_fifo(&naive, &s, why, sizeof why) && strstr(why, "deadlock"));
    ts_xchg_free(&naive);
    CHECK(exercise(&s) == 2 * 2 * 3); /* ours delays the send to where rank 1 wants it */
    ts_schedule_free(&s);
}

static void test_exchange_dump(void)
{
    ts_schedule s;
    ts_xchg x;
    if (ts_schedule_build(&s, "1f1b", 2, 1, 4) != TS_OK || ts_xchg_build(&x, &s) != TS_OK) {
        CHECKF(0, "%s", ts_error_message());
        return;
    }
    char path[512], text[4096] = "";
    snprintf(path, sizeof path, "%s/dump.txt", g_dir);
    FILE *f = fopen(path, "w");
    ts_xchg_dump(&x, &s, f);
    fclose(f);
    f = fopen(path, "r");
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    const char *want =
        "exchange program of \"1f1b\" (pp = 2, v = 1, m = 4): 16 ops; each step: its group | "
        "its action\n"
        "rank 0:\n"
        "    0: | 0F0\n"
        "    1: send act(c1,mb0)->1 | 0F1\n"
        "    2: send act(c1,mb1)->1, recv grad(c0,mb0)<-1 | 0B0\n"
        "    3: | 0F2\n"
        "    4: send act(c1,mb2)->1, recv grad(c0,mb1)<-1 | 0B1\n"
        "    5: | 0F3\n"
        "    6: send act(c1,mb3)->1, recv grad(c0,mb2)<-1 | 0B2\n"
        "    7: recv grad(c0,mb3)<-1 | 0B3\n"
        "rank 1:\n"
        "    0: recv act(c1,mb0)<-0 | 1F0\n"
        "    1: | 1B0\n"
        "    2: send grad(c0,mb0)->0, recv act(c1,mb1)<-0 | 1F1\n"
        "    3: | 1B1\n"
        "    4: send grad(c0,mb1)->0, recv act(c1,mb2)<-0 | 1F2\n"
        "    5: | 1B2\n"
        "    6: send grad(c0,mb2)->0, recv act(c1,mb3)<-0 | 1F3\n"
        "    7: | 1B3\n"
        "    8: send grad(c0,mb3)->0 | end\n";
    CHECKF(strcmp(text, want) == 0, "dump:\n%s", text);
    ts_xchg_free(&x);
    ts_schedule_free(&s);
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_test_exchange");
    test_exchange_builtin_grid();
    test_exchange_1f1b_pairs();
    test_exchange_csv();
    test_exchange_swapped_receives();
    test_exchange_naive_deadlock();
    test_exchange_dump();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
