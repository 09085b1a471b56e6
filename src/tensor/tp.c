/* Tensor-parallel layers (tp.h): each is the plain kernel plus the one collective that
 * makes the sharded result equal the unsharded one. */
#include "tensor/tp.h"

#include <stdlib.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/timer.h"

ts_tp ts_tp_make(int size, int rank, const struct ts_comm_s *comm, const ts_kernels *k)
{
    TS_ASSERT(size >= 1 && rank >= 0 && rank < size && k != NULL);
    TS_ASSERT(comm == NULL || (comm->size == size && comm->rank == rank));
    return (ts_tp){.size = size, .rank = rank, .comm = size > 1 ? comm : NULL, .k = k,
                   .sub = 1};
}

ts_tp ts_tp_overlap(ts_tp tp, int sub)
{
    TS_ASSERT(sub >= 1);
    tp.sub = sub;
    return tp;
}

/* ---------------------------------------------------- collectives in flight */

/* Equal pieces of n elements per rank, at rank * n (the group's counts and offsets). */
static void pending_pieces(const ts_tp *tp, ts_tp_pending *p, size_t n)
{
    TS_ASSERT(n <= (size_t)INT32_MAX / (size_t)tp->size);
    p->counts = ts_malloc((size_t)tp->size * sizeof(int));
    p->displs = ts_malloc((size_t)tp->size * sizeof(int));
    for (int r = 0; r < tp->size; r++) {
        p->counts[r] = (int)n;
        p->displs[r] = (int)((size_t)r * n);
    }
}

static void pending_begin(ts_tp_pending *p)
{
    TS_ASSERT(!p->active);
    *p = (ts_tp_pending){.active = true};
}

void ts_tp_poll(ts_tp_pending *p)
{
    if (p && p->active) ts_request_test(&p->req);
}

void ts_tp_finish(const ts_tp *tp, ts_tp_pending *p)
{
    if (!p || !p->active) return;
    const double t0 = ts_now_ms();
    ts_request_wait(&p->req);
    if (tp->comm && tp->comm->busy_ms) *tp->comm->busy_ms += ts_now_ms() - t0;
    if (p->dst) tp->k->memcpy_d2d(p->dst, p->src, p->bytes);
    free(p->counts);
    free(p->displs);
    *p = (ts_tp_pending){0};
}

ts_tp ts_tp_sequence_parallel(ts_tp tp, bool on)
{
    TS_ASSERT(!on || tp.size > 1);
    tp.sp = on;
    return tp;
}

/* The sum over the tp ranks of a buffer every rank holds a part of (Megatron's g in
 * forward, f's conjugate in backward). Nothing to do on one rank. */
static void tp_sum(const ts_tp *tp, float *buf, size_t n)
{
    if (tp->size == 1) return;
    TS_ASSERT(tp->comm != NULL); /* a layout-only context cannot run */
    ts_allreduce_sum_f32(tp->comm, buf, n);
}

/* tp_sum on activations, in their element type (bf16 sums round once per pair). */
static void tp_sum_act(const ts_tp *tp, void *buf, size_t n)
{
    if (tp->size == 1) return;
    TS_ASSERT(tp->comm != NULL);
    ts_allreduce_sum_act(tp->comm, buf, n, tp->k->act_dtype);
}

static void tp_max(const ts_tp *tp, float *buf, size_t n)
{
    if (tp->size == 1) return;
    TS_ASSERT(tp->comm != NULL);
    ts_allreduce_max_f32(tp->comm, buf, n);
}

/* Sequence parallelism's pair: this rank's rows of the sum of full[N, C] over the
 * ranks (into local), and the rows of every rank into full. In flight (p), the
 * reduce-scatter runs in place in full (its result lands at full's start, moved to local
 * on finish), the all-gather in place after this rank's rows are copied to their slot. */
static void seq_scatter_sum(const ts_tp *tp, void *local, void *full, int N, int C,
                            ts_tp_pending *p)
{
    TS_ASSERT(tp->sp && tp->comm != NULL && N % tp->size == 0);
    const size_t n = (size_t)(N / tp->size) * C;
    if (!p) {
        ts_reduce_scatter_sum_act(tp->comm, full, local, n, tp->k->act_dtype);
        return;
    }
    pending_begin(p);
    pending_pieces(tp, p, n);
    p->dst = local;
    p->src = full;
    p->bytes = n * ts_dtype_bytes(tp->k->act_dtype);
    ts_ireduce_scatter_sum_act(tp->comm, full, p->counts, tp->k->act_dtype, &p->req);
}

const void *ts_tp_seq_gather(const ts_tp *tp, void *full, const void *local, int N, int C,
                             ts_tp_pending *p)
{
    if (!tp->sp) return local;
    TS_ASSERT(tp->comm != NULL && full != NULL && N % tp->size == 0);
    const size_t n = (size_t)(N / tp->size) * C;
    if (!p) {
        ts_allgather_act(tp->comm, local, full, n, tp->k->act_dtype);
        return full;
    }
    pending_begin(p);
    pending_pieces(tp, p, n);
    const size_t eb = ts_dtype_bytes(tp->k->act_dtype);
    tp->k->memcpy_d2d((unsigned char *)full + (size_t)tp->rank * n * eb, local, n * eb);
    ts_iallgather_act(tp->comm, full, p->counts, p->displs, tp->k->act_dtype, &p->req);
    return full;
}

/* tp_sum_act, or started in flight. */
static void tp_sum_act_in(const ts_tp *tp, void *buf, size_t n, ts_tp_pending *p)
{
    if (!p || tp->size == 1) {
        tp_sum_act(tp, buf, n);
        return;
    }
    pending_begin(p);
    ts_iallreduce_sum_act(tp->comm, buf, n, tp->k->act_dtype, &p->req);
}

void ts_tp_seq_sum_grad(const ts_tp *tp, float *g, size_t n)
{
    if (tp->sp) tp_sum(tp, g, n);
}

void ts_tp_sum_grad(const ts_tp *tp, float *g, size_t n)
{
    tp_sum(tp, g, n);
}

/* ------------------------------------------------------------------ linears */

void ts_tp_col_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int C, int OCl)
{
    tp->k->matmul_forward(out, inp, w, b, N, C, OCl);
}

void ts_tp_col_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OCl, void *work,
                        ts_tp_pending *p)
{
    if (tp->sp && dinp) {
        tp->k->matmul_backward(work, dw, db, dout, inp, w, N, C, OCl);
        seq_scatter_sum(tp, dinp, work, N, C, p);
        return;
    }
    tp->k->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OCl);
    if (dinp) tp_sum_act_in(tp, dinp, (size_t)N * C, p);
}

void ts_tp_row_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int Cl, int OC, void *work, ts_tp_pending *p)
{
    if (tp->sp) {
        tp->k->matmul_forward(work, inp, w, tp->rank == 0 ? b : NULL, N, Cl, OC);
        seq_scatter_sum(tp, out, work, N, OC, p);
        return;
    }
    tp->k->matmul_forward(out, inp, w, tp->rank == 0 ? b : NULL, N, Cl, OC);
    tp_sum_act_in(tp, out, (size_t)N * OC, p);
}

void ts_tp_row_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int Cl, int OC)
{
    tp->k->matmul_backward(dinp, dw, db, dout, inp, w, N, Cl, OC);
}

/* ---------------------------------------------------- vocab-parallel layers */

void ts_tp_embed_forward(const ts_tp *tp, void *out, const int *tokens, const float *wte,
                         int v0, int nv, const float *wpe, int B, int T, int C, void *work)
{
    if (tp->size == 1) {
        tp->k->encoder_forward(out, tokens, wte, wpe, B, T, C);
        return;
    }
    /* This rank's vocabulary rows (zeros for other tokens), the positions on rank 0
     * only; the sum assembles the full embedding on every rank. */
    if (tp->sp) {
        /* Sub-batch by sub-batch: a rank's rows are its part of each in turn (tp.h). */
        tp->k->vocab_embed_forward(work, tokens, wte, tp->rank == 0 ? wpe : NULL, v0, nv, B, T,
                                   C);
        const int Ns = B * T / tp->sub;
        const size_t eb = ts_dtype_bytes(tp->k->act_dtype);
        for (int i = 0; i < tp->sub; i++)
            seq_scatter_sum(tp, (unsigned char *)out + (size_t)i * (Ns / tp->size) * C * eb,
                            (unsigned char *)work + (size_t)i * Ns * C * eb, Ns, C, NULL);
        return;
    }
    tp->k->vocab_embed_forward(out, tokens, wte, tp->rank == 0 ? wpe : NULL, v0, nv, B, T, C);
    tp_sum_act(tp, out, (size_t)B * T * C);
}

void ts_tp_embed_backward(const ts_tp *tp, float *dwte, float *dwpe, const void *dout,
                          const int *tokens, int v0, int nv, int B, int T, int C)
{
    if (tp->size == 1)
        tp->k->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    else
        tp->k->vocab_embed_backward(dwte, dwpe, dout, tokens, v0, nv, B, T, C);
}

void ts_tp_cross_entropy(const ts_tp *tp, float *losses, void *logits, float *stats,
                         const int *targets, int v0, int nv, int N, float dloss)
{
    const ts_kernels *k = tp->k;
    if (tp->size == 1) { /* the fused kernel: one pass fewer over the logits */
        k->crossentropy_forward_backward(losses, logits, targets, N, nv, dloss);
        return;
    }
    /* Three passes around the reductions: the row max and the target logit (0 off the
     * rank that holds it), then the sum of exp(x - max), then the losses and dlogits. */
    float *rowmax = stats, *sumexp = stats + N, *tlogit = stats + 2 * (size_t)N;
    k->xent_vp_stats(rowmax, tlogit, logits, targets, v0, nv, N);
    tp_max(tp, rowmax, (size_t)N);
    tp_sum(tp, tlogit, (size_t)N);
    k->xent_vp_sumexp(sumexp, logits, rowmax, N, nv);
    tp_sum(tp, sumexp, (size_t)N);
    k->xent_vp_finish(losses, logits, targets, v0, nv, rowmax, sumexp, tlogit, N, dloss);
}
