/* Expert tensor parallelism's exchange (expert_tp.h): the counts all-gathered on the
 * control plane, one variable all-to-all of the rows each way, and a reorder between
 * rank order (what the all-to-all delivers: all of etp rank 0's rows, then rank 1's, each
 * block by local expert) and gathered order (each local expert's rows together), as
 * etp * L contiguous block copies by the backend's memcpy_d2d. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tensor/expert_tp.h"

void ts_expert_tp_init(ts_expert_tp *t, const ts_comm *etp, const ts_kernels *k, int L, int C,
                       ts_dtype type)
{
    /* The sum's adds are the backend's residual_forward, in its activation type. */
    TS_ASSERT(etp && etp->size > 1 && L >= 1 && C >= 1 && type == k->act_dtype);
    memset(t, 0, sizeof *t);
    const size_t S = (size_t)etp->size;
    t->etp = etp;
    t->k = k;
    t->L = L;
    t->C = C;
    t->type = type;
    t->rows_e = ts_calloc(S * (size_t)L, sizeof(int));
    t->expert_rows = ts_calloc((size_t)L, sizeof(int));
    t->mine_counts = ts_calloc(S, sizeof(int));
    t->zero_displs = ts_calloc(S, sizeof(int));
    t->mine_displs = ts_calloc(S, sizeof(int));
    t->peer_counts = ts_calloc(S, sizeof(int));
    t->peer_displs = ts_calloc(S, sizeof(int));
}

void ts_expert_tp_free(ts_expert_tp *t)
{
    free(t->rows_e);
    free(t->expert_rows);
    free(t->mine_counts);
    free(t->zero_displs);
    free(t->mine_displs);
    free(t->peer_counts);
    free(t->peer_displs);
    memset(t, 0, sizeof *t);
}

void ts_expert_tp_plan(ts_expert_tp *t, const int *rows)
{
    const int S = t->etp->size, L = t->L, me = t->etp->rank;
    ts_allgather_bytes(t->etp, rows, (size_t)L * sizeof(int), t->rows_e);
    for (int l = 0; l < L; l++) t->expert_rows[l] = 0;
    t->n_all = 0;
    for (int j = 0; j < S; j++) {
        int n = 0;
        for (int l = 0; l < L; l++) {
            n += t->rows_e[j * L + l];
            t->expert_rows[l] += t->rows_e[j * L + l];
        }
        TS_ASSERT((long long)(t->n_all + n) * t->C <= 0x7fffffffLL);
        t->peer_counts[j] = n * t->C;
        t->peer_displs[j] = t->n_all * t->C;
        t->n_all += n;
    }
    t->n_mine = t->peer_counts[me] / t->C;
    t->n_buf = S * t->n_mine > t->n_all ? S * t->n_mine : t->n_all;
    for (int j = 0; j < S; j++) {
        t->mine_counts[j] = t->n_mine * t->C;
        t->mine_displs[j] = j * t->n_mine * t->C;
    }
}

/* Block copies between rank order and gathered order; `to_gathered` says which way. */
static void reorder(const ts_expert_tp *t, void *dst, const void *src, bool to_gathered)
{
    const int S = t->etp->size, L = t->L;
    const size_t row = (size_t)t->C * ts_dtype_bytes(t->type);
    size_t at_gathered = 0;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < S; j++) {
            /* rank j's block starts at peer_displs[j]; its rows for experts < l first */
            size_t at_rank = (size_t)t->peer_displs[j] / (size_t)t->C;
            for (int m = 0; m < l; m++) at_rank += (size_t)t->rows_e[j * L + m];
            const size_t n = (size_t)t->rows_e[j * L + l];
            if (n) {
                char *d = (char *)dst + (to_gathered ? at_gathered : at_rank) * row;
                const char *s = (const char *)src + (to_gathered ? at_rank : at_gathered) * row;
                t->k->memcpy_d2d(d, s, n * row);
            }
            at_gathered += n;
        }
}

void ts_expert_tp_gather(const ts_expert_tp *t, void *out, const void *in, void *work)
{
    /* One block, this rank's rows, to every peer (the send pieces overlap). */
    ts_alltoallv_act(t->etp, in, t->mine_counts, t->zero_displs, work, t->peer_counts,
                     t->peer_displs, t->type);
    reorder(t, out, work, true);
}

void ts_expert_tp_reduce(const ts_expert_tp *t, void *out, void *partial, void *work)
{
    reorder(t, work, partial, false);
    /* Peer j's rows' partials to peer j; each peer's partials of my rows into partial's
     * j-th block of n_mine rows. */
    ts_alltoallv_act(t->etp, work, t->peer_counts, t->peer_displs, partial, t->mine_counts,
                     t->mine_displs, t->type);
    const size_t n = (size_t)t->n_mine * (size_t)t->C;
    if (n == 0) return;
    const size_t bytes = n * ts_dtype_bytes(t->type);
    t->k->memcpy_d2d(out, partial, bytes);
    for (int j = 1; j < t->etp->size; j++)
        t->k->residual_forward(out, out, (const char *)partial + (size_t)j * bytes, n);
}
