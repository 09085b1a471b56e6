/* Forward and backward of the three layer kinds, one micro-batch at a time, for both
 * architectures: the embedding and the head here, the transformer block in block.c
 * (nanoGPT's x = x + attn(norm_1(x)); x = x + mlp(norm_2(x)), with its attention and MLP
 * phases in attention.c and mlp.c). The backward runs the residual stream's gradient
 * `dx` through in place: each norm's backward adds its input gradient to it (the
 * residual branch's identity path is the "+ dx" for free). Where each layer's saved
 * buffers are is act_layout.h's.
 *
 * Tensor parallelism (Megatron) is in the calls, not here: the q|k|v and MLP input
 * projections and the LM head are column-parallel linears, the attention and MLP output
 * projections row-parallel, the embedding and the cross-entropy vocab-parallel
 * (tensor/tp.h holds their collectives). The same code runs the unsharded model when
 * tp.size == 1. */
#include <stdlib.h>
#include <string.h>

#include "model/act_layout.h"
#include "model/block.h"
#include "model/model.h"
#include "tensor/tp.h"

/* ---------------------------------------------------------------- forward */

static void embed_forward(const ts_model *m, const ts_acts *a, int l)
{
    const int p0 = m->layers[l].first_param;
    const float *wpe = m->arch == TS_ARCH_LLAMA ? NULL : ts_param_data(m, p0 + 1);
    TS_ASSERT(!m->tp.sp || a->sp_work);
    TS_ASSERT(m->cp.size == 1 || a->cp_work);
    int B = a->B, T = a->T;
    if (wpe && a->doc_wpe) {
        /* Packed documents: each local row's position row at its restarted position,
         * gathered run by run; the rows are then one sequence of B*T (the kernels index
         * the table by row). */
        const size_t C = (size_t)m->n_embd;
        for (int i = 0; i < a->n_doc_seg; i++) {
            const int *g = a->doc_seg + 3 * i;
            m->k->memcpy_d2d(a->doc_wpe + (size_t)g[0] * C, wpe + (size_t)g[2] * C,
                             (size_t)g[1] * C * sizeof(float));
        }
        wpe = a->doc_wpe;
        T = B * T;
        B = 1;
    } else if (wpe) {
        /* Context parallelism: the position embedding's rows at this rank's positions. */
        wpe = ts_cp_positions_table(&m->cp, a->cp_work, wpe, m->n_embd);
    }
    ts_tp_embed_forward(&m->tp, ts_embed_views(m, a, l).out, a->tokens, ts_param_data(m, p0),
                        m->vocab_start, m->local_vocab, wpe, B, T, m->n_embd, a->sp_work);
}

/* The head's norm parameters (weight; bias for gpt2's LayerNorm, NULL for llama). */
static const float *head_norm_w(const ts_model *m, int l)
{
    return ts_param_data(m, m->layers[l].first_param);
}
static const float *head_norm_b(const ts_model *m, int l)
{
    return m->arch == TS_ARCH_LLAMA ? NULL : ts_param_data(m, m->layers[l].first_param + 1);
}

static void head_forward(const ts_model *m, const ts_acts *a, int l, const void *x, float dloss,
                         double *loss_acc)
{
    const int N = a->B * a->T, C = m->n_embd, NL = ts_tp_rows(&m->tp, N);
    head_acts h = ts_head_views(m, a, l);

    ts_norm_forward(m, h.lnf, h.lnf_mean, h.lnf_rstd, x, head_norm_w(m, l), head_norm_b(m, l), NL);
    /* The LM head (the tied token embedding, or lm_head): logits = lnf @ W^T, this
     * rank's vocabulary columns, on every row (gathered under sequence parallelism);
     * then the loss, leaving the softmax's gradient in place of the logits. */
    TS_ASSERT(!m->tp.sp || a->sp_work);
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    const void *lnf = ts_gather_rows(m, &d, a->sp_work, h.lnf);
    ts_tp_col_forward(&m->tp, h.logits, lnf, ts_param_compute(m, m->head_wte_param), NULL, N, C,
                      m->local_vocab);
    ts_tp_cross_entropy(&m->tp, h.losses, h.logits, h.xent_stats, a->targets, m->vocab_start,
                        m->local_vocab, N, dloss);
    if (loss_acc) m->k->sum_into(loss_acc, h.losses, (size_t)N);
}

static void between_layers(const ts_model *m)
{
    for (int i = 0; i < TS_MODEL_BETWEEN_LAYERS_MAX && m->between_layers[i].fn; i++)
        m->between_layers[i].fn(m->between_layers[i].ctx);
}

void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_acc)
{
    a->dloss = dloss; /* the MoE blocks' auxiliary losses weigh by it in their backward */
    for (int l = a->l0; l < a->l1; l++) {
        const ts_layer *L = &m->layers[l];
        TS_ASSERT(L->owned);
        switch (L->kind) {
        case TS_LAYER_EMBED:
            embed_forward(m, a, l);
            break;
        case TS_LAYER_BLOCK:
            ts_block_forward(m, a, l, ts_acts_layer_input(m, a, l));
            break;
        case TS_LAYER_HEAD:
            head_forward(m, a, l, ts_acts_layer_input(m, a, l), dloss, loss_acc);
            /* Multi-token prediction's modules, in the head's layer. */
            if (m->mtp_layers > 0) ts_mtp_forward(m, a, dloss, loss_acc != NULL);
            break;
        }
        between_layers(m);
    }
}

/* ------------------------------------------------ forward for generation */

/* The head without the loss: the final norm and the LM head on each sequence's last
 * position only (a norm's row needs no other row), logits [B, V] in activation
 * elements. The rest of the head's buffers (losses, the other positions) are left
 * untouched. */
static void head_forward_logits(const ts_model *m, const ts_acts *a, int l, const void *x,
                                void *logits)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    const int C = m->n_embd, V = m->local_vocab;
    head_acts h = ts_head_views(m, a, l);
    for (int b = 0; b < a->B; b++) {
        const size_t row = (size_t)b * a->T + (size_t)(a->T - 1);
        ts_norm_forward(m, act_at(&d, h.lnf, row * C), h.lnf_mean ? h.lnf_mean + row : NULL,
                     h.lnf_rstd + row, act_at(&d, x, row * C), head_norm_w(m, l),
                     head_norm_b(m, l), 1);
        ts_tp_col_forward(&m->tp, act_at(&d, logits, (size_t)b * V), act_at(&d, h.lnf, row * C),
                          ts_param_compute(m, m->head_wte_param), NULL, 1, C, V);
    }
}

void ts_model_forward_logits(const ts_model *m, ts_acts *a, void *logits)
{
    const int head = m->n_layers - 1;
    TS_ASSERT(a->l0 == 0 && a->l1 == m->n_layers && m->tp.size == 1);
    for (int l = 0; l < m->n_layers; l++) TS_ASSERT(m->layers[l].owned);
    embed_forward(m, a, 0);
    for (int l = 1; l < head; l++) ts_block_forward(m, a, l, ts_acts_output(m, a, l - 1));
    head_forward_logits(m, a, head, ts_acts_output(m, a, head - 1), logits);
}

/* ---------------------------------------------------------------- backward */

static void embed_backward(const ts_model *m, const ts_acts *a, int l, const void *dout)
{
    const int p0 = m->layers[l].first_param;
    float *dwpe = m->arch == TS_ARCH_LLAMA ? NULL : ts_param_grad(m, p0 + 1);
    if (dwpe && a->doc_wpe) {
        /* Packed documents: each run of rows adds into the position rows it read. */
        const int C = m->n_embd;
        const size_t eb = ts_dtype_bytes(m->k->act_dtype);
        for (int i = 0; i < a->n_doc_seg; i++) {
            const int *g = a->doc_seg + 3 * i;
            ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0), dwpe + (size_t)g[2] * C,
                                 (const unsigned char *)dout + (size_t)g[0] * C * eb,
                                 a->tokens + g[0], m->vocab_start, m->local_vocab, 1, g[1], C);
        }
        return;
    }
    if (m->cp.size == 1 || !dwpe) {
        ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0), dwpe, dout, a->tokens,
                             m->vocab_start, m->local_vocab, a->B, a->T, m->n_embd);
        return;
    }
    /* Context parallelism: each chunk of each sequence adds into the position
     * embedding's rows at its global positions (tensor/cp.h). */
    const int c = a->T / 2, C = m->n_embd;
    const size_t eb = ts_dtype_bytes(m->k->act_dtype);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < 2; h++) {
            const size_t row0 = (size_t)b * a->T + (size_t)h * c;
            ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0),
                                 dwpe + (size_t)ts_cp_chunk(&m->cp, h) * c * C,
                                 (const unsigned char *)dout + row0 * C * eb, a->tokens + row0,
                                 m->vocab_start, m->local_vocab, 1, c, C);
        }
}

/* The head's backward: the forward left dlogits in place of the logits. With
 * `defer_weight`, the LM head's weight gradient waits for the W pass. */
static void head_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                          ts_scratch *sc, bool defer_weight)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    const int C = m->n_embd, S = (int)d.S, Ns = (int)(d.N / d.S), NLs = (int)(d.NL / d.S);
    const int p0 = m->layers[l].first_param;
    head_acts h = ts_head_views(m, a, l);
    /* Under sequence parallelism: lnf gathered again, the partial input gradients [N,C]
     * in the scratch's second buffer, this rank's rows of their sum in its own, sub-batch
     * by sub-batch (this rank's rows are its part of each: tensor/tp.h). */
    void *dlnf = d.sp ? ts_scratch_local(&d, sc) : ts_scratch_wide(&d, sc);
    void *work = ts_scratch_narrow(&d, sc);
    const void *lnf = ts_gather_rows(m, &d, ts_scratch_gather(&d, sc), h.lnf);
    const int parts = d.sp ? S : 1, rows = d.sp ? Ns : (int)d.N;
    for (int i = 0; i < parts; i++)
        ts_tp_col_backward(&m->tp, act_at(&d, dlnf, (size_t)i * NLs * C),
                           defer_weight ? NULL : ts_param_grad(m, m->head_wte_param), NULL,
                           act_at(&d, h.logits, (size_t)i * rows * d.Vl),
                           act_at(&d, lnf, (size_t)i * rows * C),
                           ts_param_compute(m, m->head_wte_param), rows, C, m->local_vocab,
                           act_at(&d, work, (size_t)i * rows * C), NULL);
    m->k->memset_zero(dx, d.NL * d.C * d.ab);
    ts_norm_backward(m, dx, ts_param_grad(m, p0),
                  m->arch == TS_ARCH_LLAMA ? NULL : ts_param_grad(m, p0 + 1), dlnf, x,
                  head_norm_w(m, l), h.lnf_mean, h.lnf_rstd, (int)d.NL);
}

void ts_model_backward(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: {
            const act_dims d = ts_act_dims(m, l, a->B, a->T);
            embed_backward(m, a, l, ts_gather_rows(m, &d, ts_scratch_gather(&d, s), dx));
            break;
        }
        case TS_LAYER_BLOCK:
            ts_block_backward(m, a, l, ts_acts_layer_input(m, a, l), dx, s, NULL);
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, ts_acts_layer_input(m, a, l), dx, s, false);
            if (m->mtp_layers > 0) ts_mtp_backward(m, a, dx, s);
            break;
        }
        if (layer_done) layer_done(ctx, l);
        between_layers(m);
    }
}

/* Sequence parallelism: each rank's norm weight gradients (and an MoE block's routed
 * ones, below) hold its rows' part; once the
 * step's last backward has left layer l they are summed over the tp group (Megatron's
 * finalize-time all-reduce of the norms, here per layer so the data-parallel buckets
 * that follow see final values). The other replicated gradients (row-parallel biases,
 * wpe) came from gathered full gradients: already the same on every rank. qk_norm's
 * weights (replicated, applied per head) get each rank's heads' part, with or without
 * sequence parallelism: summed the same way. (With tp > n_kv_head a key/value head's
 * replicas each hold the part of its query heads; the sum is whole then too.) */
static void sum_layer_grads(const ts_model *m, int l);

void ts_model_sum_sequence_grads(const ts_model *m, int l)
{
    sum_layer_grads(m, l);
    if (m->mtp_layers > 0 && m->layers[l].kind == TS_LAYER_HEAD)
        ts_mtp_sum_sequence_grads(m, sum_layer_grads);
}

static void sum_layer_grads(const ts_model *m, int l)
{
    const ts_layer *L = &m->layers[l];
    const int p0 = L->first_param;
    if (m->qk_norm && m->tp.size > 1 && L->kind == TS_LAYER_BLOCK) {
        const block_roles r = ts_block_roles(m, l);
        const size_t HS = (size_t)m->head_dim;
        ts_tp_sum_grad(&m->tp, ts_param_grad(m, p0 + r.q_norm_w), HS);
        ts_tp_sum_grad(&m->tp, ts_param_grad(m, p0 + r.k_norm_w), HS);
    }
    /* MLA's latent trunk (replicated: q_a_proj, kv_a_proj_with_mqa, their norms) gets
     * each rank's heads' part, with or without sequence parallelism: summed the same way
     * (model/mla.c). q_proj (no q latent) is column-parallel: this rank's alone. */
    if (m->mla_kv_rank > 0 && m->tp.size > 1 && L->kind == TS_LAYER_BLOCK) {
        const block_roles r = ts_block_roles(m, l);
        const int trunk[4] = {m->mla_q_rank > 0 ? r.mla_qa_w : -1, r.mla_kva_w,
                              r.mla_q_norm_w, r.mla_kv_norm_w};
        for (int i = 0; i < 4; i++)
            if (trunk[i] >= 0)
                ts_tp_sum_grad(&m->tp, ts_param_grad(m, p0 + trunk[i]),
                               m->params[p0 + trunk[i]].numel);
    }
    if (!m->tp.sp) return;
    const size_t C = (size_t)m->n_embd;
    if (L->kind == TS_LAYER_HEAD) {
        ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0), C);
        if (m->arch != TS_ARCH_LLAMA) ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0 + 1), C);
    } else if (L->kind == TS_LAYER_BLOCK) {
        const block_roles r = ts_block_roles(m, l);
        const int norms[4] = {r.norm1_w, r.norm1_b, r.norm2_w, r.norm2_b};
        for (int i = 0; i < 4; i++)
            if (norms[i] >= 0) ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0 + norms[i]), C);
        /* An MoE block routes each tp rank's rows (moe.c): its router's and shared
         * experts' gradients, and its experts' with ep = 1 (each tp rank's copy of every
         * expert), are each rank's rows' part. Under ep or etp the experts' are summed
         * over their edp group instead (the reducer), which holds every copy of them. */
        if (L->moe)
            for (int p = p0 + r.moe_router_w; p < p0 + L->n_params; p++)
                if (!m->params[p].expert || (m->moe_ep == 1 && m->moe_etp == 1))
                    ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p), m->params[p].numel);
    }
}

/* ------------------------------------------- zero-bubble split: I then W */

void ts_model_backward_input(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s)
{
    const act_dims d = ts_act_dims(m, -1, a->B, a->T);
    const size_t NC = (size_t)a->B * a->T * m->n_embd;
    TS_ASSERT(a->wstash == NULL);
    a->wstash = m->k->dev_alloc(ts_acts_stash_bytes(m, a->l0, a->l1, a->B, a->T));
    void *embed_stash = ts_stash_embed(m, a);
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: /* no input gradient: keep its output gradient for W */
            if (d.sp)
                ts_gather_rows(m, &d, embed_stash, dx);
            else
                m->k->memcpy_d2d(embed_stash, dx, NC * d.ab);
            break;
        case TS_LAYER_BLOCK:
            ts_block_backward(m, a, l, ts_acts_layer_input(m, a, l), dx, s,
                           ts_stash_block(m, a, l));
            break;
        case TS_LAYER_HEAD:
            /* The MTP modules' weight gradients are made here, not deferred: the W pass
             * keeps only the head's own LM head product. */
            head_backward(m, a, l, ts_acts_layer_input(m, a, l), dx, s, true);
            if (m->mtp_layers > 0) ts_mtp_backward(m, a, dx, s);
            break;
        }
        between_layers(m);
    }
}

void ts_model_backward_weight(const ts_model *m, ts_acts *a, ts_scratch *s)
{
    const act_dims d = ts_act_dims(m, -1, a->B, a->T);
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, ts_stash_embed(m, a));
            break;
        case TS_LAYER_BLOCK:
            ts_block_backward_weight(m, a, l, ts_stash_block(m, a, l), s);
            break;
        case TS_LAYER_HEAD: {
            head_acts h = ts_head_views(m, a, l);
            const int N = a->B * a->T;
            const void *lnf = ts_gather_rows(m, &d, ts_scratch_gather(&d, s), h.lnf);
            ts_tp_col_backward(&m->tp, NULL, ts_param_grad(m, m->head_wte_param), NULL, h.logits,
                               lnf, NULL, N, m->n_embd, m->local_vocab, NULL, NULL);
            break;
        }
        }
        between_layers(m);
    }
    m->k->dev_free(a->wstash);
    a->wstash = NULL;
}
