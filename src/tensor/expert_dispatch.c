/* The token exchange of expert parallelism (expert_dispatch.h): one all-to-all of the
 * per-expert counts on the control plane, then one variable all-to-all of the rows each
 * way, and a reorder between source order (what the all-to-all delivers: all of ep rank
 * 0's rows, then rank 1's, each block by local expert) and expert order (what the
 * experts' GEMMs want: each local expert's rows together). The reorder is E_local * ep
 * contiguous block copies (the backend's memcpy_d2d), no kernel of its own: a block is
 * one (source rank, local expert) pair. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
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
    d->recv_counts_e = ts_calloc((size_t)S * (size_t)d->E_local, sizeof(int));
    d->expert_rows = ts_calloc((size_t)d->E_local, sizeof(int));
    d->send_counts = ts_calloc((size_t)S, sizeof(int));
    d->send_displs = ts_calloc((size_t)S, sizeof(int));
    d->recv_counts = ts_calloc((size_t)S, sizeof(int));
    d->recv_displs = ts_calloc((size_t)S, sizeof(int));
    return TS_OK;
}

void ts_expert_dispatch_free(ts_expert_dispatch *d)
{
    free(d->recv_counts_e);
    free(d->expert_rows);
    free(d->send_counts);
    free(d->send_displs);
    free(d->recv_counts);
    free(d->recv_displs);
    memset(d, 0, sizeof *d);
}

static int group_size(const ts_expert_dispatch *d) { return d->ep->size > 1 ? d->ep->size : 1; }

void ts_expert_dispatch_plan(ts_expert_dispatch *d, const int *counts)
{
    const int S = group_size(d), L = d->E_local;
    /* recv_counts_e[j * L + l]: what rank j routes to my local expert l = its counts[my
     * block][l]. The all-to-all of L counts per peer delivers exactly that. */
    ts_host_alltoall_i32(d->ep, counts, d->recv_counts_e, (size_t)L);
    d->n_send = d->n_recv = 0;
    for (int l = 0; l < L; l++) d->expert_rows[l] = 0;
    for (int j = 0; j < S; j++) {
        int rows_to_j = 0, rows_from_j = 0;
        for (int l = 0; l < L; l++) {
            rows_to_j += counts[j * L + l];
            rows_from_j += d->recv_counts_e[j * L + l];
            d->expert_rows[l] += d->recv_counts_e[j * L + l];
        }
        TS_ASSERT((long long)(d->n_send + rows_to_j) * d->C <= 0x7fffffffLL);
        TS_ASSERT((long long)(d->n_recv + rows_from_j) * d->C <= 0x7fffffffLL);
        d->send_counts[j] = rows_to_j * d->C;
        d->send_displs[j] = d->n_send * d->C;
        d->recv_counts[j] = rows_from_j * d->C;
        d->recv_displs[j] = d->n_recv * d->C;
        d->n_send += rows_to_j;
        d->n_recv += rows_from_j;
    }
}

/* Block copies between source order (src_major) and expert order; `to_expert` says
 * which way. Both buffers hold n_recv rows. */
static void reorder(const ts_expert_dispatch *d, void *dst, const void *src, bool to_expert)
{
    const int S = group_size(d), L = d->E_local;
    const size_t row = (size_t)d->C * ts_dtype_bytes(d->type);
    size_t expert_base = 0; /* first row of local expert l in expert order */
    for (int l = 0; l < L; l++) {
        size_t at_expert = expert_base;
        for (int j = 0; j < S; j++) {
            /* rank j's block starts at recv_displs[j]; its rows for experts < l first */
            size_t at_source = (size_t)d->recv_displs[j] / (size_t)d->C;
            for (int m = 0; m < l; m++) at_source += (size_t)d->recv_counts_e[j * L + m];
            const size_t n = (size_t)d->recv_counts_e[j * L + l];
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
        expert_base += (size_t)d->expert_rows[l];
    }
}

void ts_expert_dispatch_forward(const ts_expert_dispatch *d, void *out, const void *xp,
                                void *work)
{
    ts_alltoallv_act(d->ep, xp, d->send_counts, d->send_displs, work, d->recv_counts,
                     d->recv_displs, d->type);
    reorder(d, out, work, true);
}

void ts_expert_dispatch_combine(const ts_expert_dispatch *d, void *yp, const void *y,
                                void *work)
{
    reorder(d, work, y, false);
    ts_alltoallv_act(d->ep, work, d->recv_counts, d->recv_displs, yp, d->send_counts,
                     d->send_displs, d->type);
}
