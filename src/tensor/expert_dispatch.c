/* The token exchange of expert parallelism (expert_dispatch.h): one all-to-all of the
 * per-expert counts on the control plane, then one variable all-to-all of the rows each
 * way, and a reorder between source order (what the all-to-all delivers: all of ep rank
 * 0's rows, then rank 1's, each block by local expert) and expert order (what the
 * experts' GEMMs want: each local expert's rows together). The reorder is E_local * ep
 * contiguous block copies (the backend's memcpy_d2d), no kernel of its own: a block is
 * one (source rank, local expert) pair. The plan and everything an exchange holds
 * between its start and finish are the caller's (expert_dispatch.h); the struct keeps
 * only the setup, the list of exchanges in flight and the step's times. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "tensor/expert_dispatch.h"

ts_status ts_expert_dispatch_init(ts_expert_dispatch *d, const ts_comm *ep,
                                  const ts_kernels *k, int E, int C, ts_dtype type)
{
    memset(d, 0, sizeof *d);
    const int S = ep->size > 1 ? ep->size : 1;
    if (E < 1 || E % S != 0)
        return ts_fail("model.moe_experts = %d must divide by parallel.ep = %d (each ep rank "
                       "holds the same number of whole experts)",
                       E, S);
    d->ep = ep;
    d->k = k;
    d->E = E;
    d->E_local = E / S;
    d->C = C;
    d->type = type;
    return TS_OK;
}

void ts_expert_dispatch_free(ts_expert_dispatch *d)
{
    TS_ASSERT(d->n_inflight == 0);
    memset(d, 0, sizeof *d);
}

static int group_size(const ts_expert_dispatch *d) { return d->ep->size > 1 ? d->ep->size : 1; }

void ts_expert_plan_make(const ts_expert_dispatch *d, ts_expert_plan *p, const int *counts)
{
    const int S = group_size(d), L = d->E_local;
    /* One allocation: recv_counts_e [S*L], expert_rows [L], the four [S] arrays. */
    int *a = ts_calloc((size_t)S * L + L + 4 * (size_t)S, sizeof(int));
    p->recv_counts_e = a;
    p->expert_rows = a + (size_t)S * L;
    p->send_counts = p->expert_rows + L;
    p->send_displs = p->send_counts + S;
    p->recv_counts = p->send_displs + S;
    p->recv_displs = p->recv_counts + S;
    /* recv_counts_e[j * L + l]: what rank j routes to my local expert l = its counts[my
     * block][l]. The all-to-all of L counts per peer delivers exactly that. */
    ts_host_alltoall_i32(d->ep, counts, p->recv_counts_e, (size_t)L);
    p->n_send = p->n_recv = 0;
    for (int j = 0; j < S; j++) {
        int rows_to_j = 0, rows_from_j = 0;
        for (int l = 0; l < L; l++) {
            rows_to_j += counts[j * L + l];
            rows_from_j += p->recv_counts_e[j * L + l];
            p->expert_rows[l] += p->recv_counts_e[j * L + l];
        }
        TS_ASSERT((long long)(p->n_send + rows_to_j) * d->C <= 0x7fffffffLL);
        TS_ASSERT((long long)(p->n_recv + rows_from_j) * d->C <= 0x7fffffffLL);
        p->send_counts[j] = rows_to_j * d->C;
        p->send_displs[j] = p->n_send * d->C;
        p->recv_counts[j] = rows_from_j * d->C;
        p->recv_displs[j] = p->n_recv * d->C;
        p->n_send += rows_to_j;
        p->n_recv += rows_from_j;
    }
}

void ts_expert_plan_free(ts_expert_plan *p)
{
    free(p->recv_counts_e);
    memset(p, 0, sizeof *p);
}

/* Block copies between source order (src_major) and expert order; `to_expert` says
 * which way. Both buffers hold n_recv rows. */
static void reorder(const ts_expert_dispatch *d, const ts_expert_plan *p, void *dst,
                    const void *src, bool to_expert)
{
    const int S = group_size(d), L = d->E_local;
    const size_t row = (size_t)d->C * ts_dtype_bytes(d->type);
    size_t expert_base = 0; /* first row of local expert l in expert order */
    for (int l = 0; l < L; l++) {
        size_t at_expert = expert_base;
        for (int j = 0; j < S; j++) {
            /* rank j's block starts at recv_displs[j]; its rows for experts < l first */
            size_t at_source = (size_t)p->recv_displs[j] / (size_t)d->C;
            for (int m = 0; m < l; m++) at_source += (size_t)p->recv_counts_e[j * L + m];
            const size_t n = (size_t)p->recv_counts_e[j * L + l];
            if (n) {
                if (to_expert)
                    d->k->memcpy_d2d((char *)dst + at_expert * row, (const char *)src + at_source * row,
                                     n * row);
                else
                    d->k->memcpy_d2d((char *)dst + at_source * row, (const char *)src + at_expert * row,
                                     n * row);
            }
            at_expert += n;
        }
        expert_base += (size_t)p->expert_rows[l];
    }
}

/* x is seen complete: when, for its span. */
static void mark_done(ts_expert_xfer *x) { x->span.done_ms = ts_now_ms(); }

/* Start one all-to-all: blocking (overlap off: complete on return, the time all
 * exposed) or non-blocking, listed in flight until its finish. */
static void start(ts_expert_dispatch *d, ts_expert_xfer *x, const void *send, const int *sc,
                  const int *sd, void *recv, const int *rc, const int *rd, const char *what,
                  char pass, int block)
{
    TS_ASSERT(!x->started);
    x->span = (ts_expert_span){.what = what, .pass = pass, .block = block,
                               .start_ms = ts_now_ms()};
    x->started = 1;
    if (!d->overlap) {
        ts_alltoallv_act(d->ep, send, sc, sd, recv, rc, rd, d->type);
        x->span.done_ms = ts_now_ms();
        x->span.wait_ms = x->span.done_ms - x->span.start_ms;
        memset(&x->req, 0, sizeof x->req); /* inactive: nothing to wait for */
        return;
    }
    ts_ialltoallv_act(d->ep, send, sc, sd, recv, rc, rd, d->type, &x->req);
    if (!x->req.active) mark_done(x); /* one rank: the copy is made */
    TS_ASSERT(d->n_inflight < TS_EXPERT_INFLIGHT_MAX);
    d->inflight[d->n_inflight++] = x;
}

/* Wait for x (what progress has not completed yet), off the in-flight list; its times
 * to the totals and its span to on_span. */
static void finish(ts_expert_dispatch *d, ts_expert_xfer *x)
{
    TS_ASSERT(x->started);
    if (d->overlap) {
        int i = 0;
        while (i < d->n_inflight && d->inflight[i] != x) i++;
        TS_ASSERT(i < d->n_inflight);
        d->inflight[i] = d->inflight[--d->n_inflight];
        if (x->req.active) {
            const double t0 = ts_now_ms();
            ts_request_wait(&x->req);
            mark_done(x);
            x->span.wait_ms = x->span.done_ms - t0;
        }
    }
    x->started = 0;
    d->a2a_ms += x->span.done_ms - x->span.start_ms;
    d->wait_ms += x->span.wait_ms;
    if (d->on_span) d->on_span(d->on_span_ctx, &x->span);
}

void ts_expert_dispatch_start(ts_expert_dispatch *d, const ts_expert_plan *p,
                              ts_expert_xfer *x, const void *xp, void *work, char pass,
                              int block)
{
    x->work = work;
    start(d, x, xp, p->send_counts, p->send_displs, work, p->recv_counts, p->recv_displs,
          "dispatch", pass, block);
}

void ts_expert_dispatch_finish(ts_expert_dispatch *d, const ts_expert_plan *p,
                               ts_expert_xfer *x, void *out)
{
    finish(d, x);
    reorder(d, p, out, x->work, true);
}

void ts_expert_combine_start(ts_expert_dispatch *d, const ts_expert_plan *p,
                             ts_expert_xfer *x, void *yp, const void *y, void *work, char pass,
                             int block)
{
    reorder(d, p, work, y, false);
    x->work = work;
    start(d, x, work, p->recv_counts, p->recv_displs, yp, p->send_counts, p->send_displs,
          "combine", pass, block);
}

void ts_expert_combine_finish(ts_expert_dispatch *d, ts_expert_xfer *x) { finish(d, x); }

void ts_expert_dispatch_progress(void *ctx)
{
    ts_expert_dispatch *d = ctx;
    for (int i = 0; i < d->n_inflight; i++) {
        ts_expert_xfer *x = d->inflight[i];
        if (x->req.active && ts_request_test(&x->req)) mark_done(x);
    }
}

void ts_expert_dispatch_take_times(ts_expert_dispatch *d, double *a2a_ms, double *wait_ms)
{
    *a2a_ms = d->a2a_ms;
    *wait_ms = d->wait_ms;
    d->a2a_ms = d->wait_ms = 0.0;
}
