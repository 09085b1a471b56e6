/* The MLP phase of a block (block.h): c_fc (gpt2; llama's gate|up) column-parallel, the
 * activation (GELU over [N,F]; SwiGLU from [N,2F] to [N,F]), c_proj (llama's down_proj)
 * row-parallel: its sum is the one collective of the forward. Its saved activations are
 * fch and fch_gelu. */
#include "model/block.h"

/* This phase's rows of the zero-bubble stash (NULL without one). */
static void *keep(const block_sub *b, int part, size_t width)
{
    if (!b->stash) return NULL;
    return ts_block_keep(b, ts_stash_mlp(b->m, b->stash, (int)b->d->N), part, width);
}

/* c_fc's output gradient [N,FI]: kept in the stash for the weight pass, else `wide`. */
static void *dfch(const block_sub *b)
{
    return b->stash ? keep(b, 1, b->d->FI) : b->wide;
}

/* The activation's output gradient [N,F]: GELU's backward runs in place in dfch, SwiGLU's
 * reads it from `narrow` while writing dfch. */
static void *dact(const block_sub *b)
{
    return b->m->arch == TS_ARCH_LLAMA ? b->narrow : dfch(b);
}

void ts_mlp_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const int C = (int)d->C;
    const block_acts *v = &b->v;
    ts_tp_col_forward(&m->tp, v->fch, in, ts_block_weight(b, b->r.fc_w),
                      ts_block_param(b, b->r.fc_b), b->N, C, (int)d->FI);
    if (m->arch == TS_ARCH_LLAMA)
        m->k->swiglu_forward(v->fch_gelu, v->fch, b->N, m->local_ffn);
    else
        m->k->gelu_forward(v->fch_gelu, v->fch, (size_t)b->N * m->local_ffn);
    ts_tp_row_forward(&m->tp, out, v->fch_gelu, ts_block_weight(b, b->r.fcproj_w),
                      ts_block_param(b, b->r.fcproj_b), b->N, (int)d->F, C, b->gath, p);
}

void ts_mlp_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p)
{
    ts_block_output_grad(b, keep(b, 0, b->d->C), dout, p);
}

void ts_mlp_backward_core(const block_sub *b, const void *dout, const void *in_local,
                          ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    ts_tp_row_backward(&m->tp, dact(b), ts_block_weight_grad(b, b->r.fcproj_w),
                       ts_block_grad(b, b->r.fcproj_b),
                       ts_block_output_grad_at(b, keep(b, 0, d->C), dout), v->fch_gelu,
                       ts_block_weight(b, b->r.fcproj_w), b->N, (int)d->F, (int)d->C);
    if (m->arch == TS_ARCH_LLAMA)
        m->k->swiglu_backward(dfch(b), v->fch, dact(b), b->N, m->local_ffn);
    else
        m->k->gelu_backward(dfch(b), v->fch, dact(b), (size_t)b->N * m->local_ffn);
    ts_block_gather_input(b, in_local, p); /* again: only this rank's rows were kept */
}

void ts_mlp_backward_input(const block_sub *b, void *din, const void *in_local,
                           ts_tp_pending *p)
{
    const act_dims *d = b->d;
    ts_tp_col_backward(&b->m->tp, din, ts_block_weight_grad(b, b->r.fc_w),
                       ts_block_grad(b, b->r.fc_b), dfch(b), ts_block_input_at(b, in_local),
                       ts_block_weight(b, b->r.fc_w), b->N, (int)d->C, (int)d->FI, b->narrow, p);
}

void ts_mlp_backward_weight(const block_sub *b, const void *in)
{
    const act_dims *d = b->d;
    ts_tp_row_backward(&b->m->tp, NULL, ts_block_grad(b, b->r.fcproj_w), NULL, keep(b, 0, d->C),
                       b->v.fch_gelu, NULL, b->N, (int)d->F, (int)d->C);
    ts_tp_col_backward(&b->m->tp, NULL, ts_block_grad(b, b->r.fc_w), NULL, keep(b, 1, d->FI), in,
                       NULL, b->N, (int)d->C, (int)d->FI, NULL, NULL);
}
