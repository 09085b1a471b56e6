/* Multi-token prediction (DeepSeek-V3 sec. 2.2; model.h's mtp_* fields): D modules after
 * the last block, run inside the head's layer after the head's own loss. Module k (1..D)
 * at position i:
 *     h'_i  = eh_proj([enorm(Emb(t_{i+k})) ; hnorm(h^{k-1}_i)])      (embedding first,
 *                                         as DeepSeek's checkpoint, Megatron and vLLM)
 *     h^k   = Block_k(h')                 (the model's block: block.c, its attention and
 *                                         MLP or MoE, on every grid as any block)
 *     loss_k(i) = CE(OutHead(shared_head.norm(h^k_i)), t_{i+k+1})  for i + k + 1 <= T
 * h^0 is the last block's output before the final norm (torchtitan's "MTP consumes the
 * last decoder-layer output"; Megatron's hnorm of the decoder output). Emb and OutHead
 * are the model's own (the embedding and the LM head weight: gradients add). Each depth's
 * per-token losses weigh as the main loss's, 1 / (global batch * seq_len) times
 * mtp_coef = lambda / D: the report's L = L_main + lambda/D sum_k (1/T) sum_i CE, whose
 * denominator is every position of the batch whatever the grid or the micro-batches
 * (positions past the window add nothing: their loss and logit gradient are zeroed).
 * Under tensor parallelism the norms and eh_proj are replicated and each rank runs its
 * rows (all of them, or under sequence parallelism its own, whose weight gradients are
 * then summed over tp: ts_mtp_sum_sequence_grads); the embedding and the head are
 * vocab-parallel as the model's. */
#include <stdlib.h>
#include <string.h>

#include "model/act_layout.h"
#include "model/block.h"
#include "model/model.h"
#include "tensor/cp.h"
#include "tensor/tp.h"

/* A module's own tensors after its block's (model.c add_mtp_params' order). */
enum { TS_MTP_ENORM, TS_MTP_HNORM, TS_MTP_EH_PROJ, TS_MTP_SHARED_NORM };

static int module_layer(const ts_model *m, int k) { return m->n_layers + k - 1; }
static int module_param(const ts_model *m, int k, int which)
{
    const ts_layer *L = &m->layers[module_layer(m, k)];
    return L->first_param + L->n_params + which;
}

/* Depth k's rows of a [B, Tl] micro-batch whose target lies past the window (global
 * position + k + 1 > T): runs at the end of each sequence (or of each context-parallel
 * chunk of it), as (first row, rows) pairs into runs when given; returns their count. */
static int past_window_runs(const ts_model *m, int B, int Tl, int k, int *runs)
{
    const int T = m->cp.size > 1 ? m->cp.T : Tl;
    const int N = B * Tl;
    int r = 0, n = 0;
    while (r < N) {
        const int t = r % Tl;
        const int pos = m->cp.size > 1 ? ts_cp_position(&m->cp, t) : t;
        if (pos + k + 1 <= T) {
            r++;
            continue;
        }
        int end = r + 1; /* the run: consecutive rows past the window */
        while (end < N && end % Tl != 0) {
            const int te = end % Tl;
            const int pe = m->cp.size > 1 ? ts_cp_position(&m->cp, te) : te;
            if (pe + k + 1 <= T || pe != pos + (end - r)) break;
            end++;
        }
        if (runs) {
            runs[2 * n] = r;
            runs[2 * n + 1] = end - r;
        }
        n++;
        r = end;
    }
    return n;
}

void ts_mtp_acts_init(const ts_model *m, ts_acts *a)
{
    const int D = m->mtp_layers, cps = m->cp.size > 1 ? m->cp.size : 1;
    const size_t N = (size_t)a->B * a->T;
    a->mtp_whole_cap = N * (size_t)cps;
    a->mtp_host = ts_malloc((a->mtp_whole_cap + N) * sizeof(int));
    /* The runs depend on B, T, the cp rank's positions and the depth alone: found once,
     * here, not every micro-batch. */
    int total = 0;
    for (int k = 1; k <= D; k++) total += past_window_runs(m, a->B, a->T, k, NULL);
    a->mtp_runs = ts_malloc((size_t)(D + 1 + 2 * total) * sizeof(int));
    int *pairs = a->mtp_runs + D + 1;
    a->mtp_runs[0] = 0;
    for (int k = 1; k <= D; k++)
        a->mtp_runs[k] = a->mtp_runs[k - 1] +
                         past_window_runs(m, a->B, a->T, k, pairs + 2 * a->mtp_runs[k - 1]);
}

void ts_acts_set_mtp_ids(const ts_model *m, ts_acts *a, const int *targets_host, int seq_len)
{
    if (!a->mtp_ids) return;
    const int B = a->B, T = seq_len;
    const size_t N = (size_t)B * a->T;
    TS_ASSERT((size_t)B * T <= a->mtp_whole_cap);
    /* The acts' host scratch (ts_mtp_acts_init): whole sequences, then this rank's rows. */
    int *whole = a->mtp_host, *local = a->mtp_host + a->mtp_whole_cap;
    for (int k = 1; k <= m->mtp_layers; k++)
        for (int which = 0; which < 2; which++) { /* t_{i+k} = targets[i+k-1], then +1 */
            for (int b = 0; b < B; b++)
                for (int i = 0; i < T; i++) {
                    const int j = i + k - 1 + which;
                    whole[(size_t)b * T + i] = j < T ? targets_host[(size_t)b * T + j] : 0;
                }
            const int *src = whole;
            if (m->cp.size > 1) {
                ts_cp_select(&m->cp, local, whole, B);
                src = local;
            }
            m->k->memcpy_h2d(a->mtp_ids + (size_t)(2 * (k - 1) + which) * N, src,
                             N * sizeof(int));
        }
}

/* Zero depth k's losses and logit gradients [N, Vl] at the rows whose target lies past
 * the window: the runs ts_mtp_acts_init found. */
static void zero_past_window(const ts_model *m, const ts_acts *a, const act_dims *d,
                             const mtp_acts *v, int k)
{
    const int *pairs = a->mtp_runs + m->mtp_layers + 1;
    for (int i = a->mtp_runs[k - 1]; i < a->mtp_runs[k]; i++) {
        const int r = pairs[2 * i], n = pairs[2 * i + 1];
        m->k->memset_zero(v->mtp_losses + r, (size_t)n * sizeof(float));
        m->k->memset_zero(act_at(d, v->mtp_logits, (size_t)r * d->Vl),
                          (size_t)n * d->Vl * d->ab);
    }
}

void ts_mtp_forward(const ts_model *m, const ts_acts *a, float dloss, bool count)
{
    const int head = m->n_layers - 1, C = m->n_embd, N = a->B * a->T;
    TS_ASSERT(a->mtp_ids && a->l1 == m->n_layers);
    for (int k = 1; k <= m->mtp_layers; k++) {
        const int l = module_layer(m, k);
        const act_dims d = ts_act_dims(m, l, a->B, a->T);
        const int NL = (int)d.NL;
        const size_t row = (size_t)C * d.ab;
        const mtp_acts v = ts_mtp_views(m, a, l);
        const void *h_prev = k == 1 ? ts_acts_layer_input(m, a, head)
                                    : ts_block_views(m, a, l - 1).out;
        const int *ids = a->mtp_ids + (size_t)2 * (k - 1) * N, *targets = ids + N;
        /* [enorm(Emb(t_{i+k})) | hnorm(h^{k-1})], each norm through mtp_in (free until
         * eh_proj writes it). */
        ts_tp_embed_forward(&m->tp, v.mtp_emb, ids, ts_param_data(m, m->mtp_wte_param),
                            m->vocab_start, m->local_vocab, NULL, a->B, a->T, C, a->sp_work);
        m->k->rmsnorm_forward(v.mtp_in, v.mtp_e_rstd, v.mtp_emb,
                              ts_param_data(m, module_param(m, k, TS_MTP_ENORM)), NL, C,
                              m->norm_eps);
        m->k->memcpy_2d(v.mtp_cat, 2 * row, v.mtp_in, row, row, (size_t)NL);
        m->k->rmsnorm_forward(v.mtp_in, v.mtp_h_rstd, h_prev,
                              ts_param_data(m, module_param(m, k, TS_MTP_HNORM)), NL, C,
                              m->norm_eps);
        m->k->memcpy_2d(act_at(&d, v.mtp_cat, (size_t)C), 2 * row, v.mtp_in, row, row,
                        (size_t)NL);
        m->k->matmul_forward(v.mtp_in, v.mtp_cat,
                             ts_param_compute(m, module_param(m, k, TS_MTP_EH_PROJ)), NULL, NL,
                             2 * C, C);
        ts_block_forward(m, a, l, v.mtp_in);
        /* The shared head: shared_head.norm, then the model's LM head and loss (as the
         * head's, layers.c). */
        m->k->rmsnorm_forward(v.mtp_fn, v.mtp_fn_rstd, ts_block_views(m, a, l).out,
                              ts_param_data(m, module_param(m, k, TS_MTP_SHARED_NORM)), NL, C,
                              m->norm_eps);
        const void *fn = ts_gather_rows(m, &d, a->sp_work, v.mtp_fn);
        ts_tp_col_forward(&m->tp, v.mtp_logits, fn, ts_param_compute(m, m->head_wte_param), NULL,
                          N, C, m->local_vocab);
        ts_tp_cross_entropy(&m->tp, v.mtp_losses, v.mtp_logits, v.mtp_xent_stats, targets,
                            m->vocab_start, m->local_vocab, N, dloss * m->mtp_coef);
        zero_past_window(m, a, &d, &v, k);
        if (count) m->k->sum_into(m->mtp_sums + (k - 1), v.mtp_losses, (size_t)N);
    }
}

/* Module k's backward: its loss's gradient through the shared head into dL/dh^k (which
 * module k+1 left in mtp_dh), the block, eh_proj, enorm into the embedding and hnorm
 * into dprev (dL/dh^{k-1}: module k-1's mtp_dh, or the head's input gradient). */
static void module_backward(const ts_model *m, const ts_acts *a, int k, void *dprev,
                            const ts_scratch *sc)
{
    const int head = m->n_layers - 1, l = module_layer(m, k), C = m->n_embd;
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    const int NL = (int)d.NL, N = (int)d.N, S = (int)d.S, Ns = N / S, NLs = NL / S;
    const size_t row = (size_t)C * d.ab;
    const mtp_acts v = ts_mtp_views(m, a, l);
    const void *h_prev = k == 1 ? ts_acts_layer_input(m, a, head)
                                : ts_block_views(m, a, l - 1).out;
    const int *ids = a->mtp_ids + (size_t)2 * (k - 1) * N;
    void *g = v.mtp_dh;
    /* The LM head (the head's backward's steps, layers.c): dfn from the logits'
     * gradient, the head weight's gradient added. */
    void *dfn = d.sp ? ts_scratch_local(&d, sc) : ts_scratch_wide(&d, sc);
    void *work = ts_scratch_narrow(&d, sc);
    const void *fn = ts_gather_rows(m, &d, ts_scratch_gather(&d, sc), v.mtp_fn);
    const int parts = d.sp ? S : 1, rows = d.sp ? Ns : N;
    for (int i = 0; i < parts; i++)
        ts_tp_col_backward(&m->tp, act_at(&d, dfn, (size_t)i * NLs * C),
                           ts_param_grad(m, m->head_wte_param), NULL,
                           act_at(&d, v.mtp_logits, (size_t)i * rows * d.Vl),
                           act_at(&d, fn, (size_t)i * rows * C),
                           ts_param_compute(m, m->head_wte_param), rows, C, m->local_vocab,
                           act_at(&d, work, (size_t)i * rows * C), NULL);
    const int sn = module_param(m, k, TS_MTP_SHARED_NORM);
    m->k->rmsnorm_backward(g, ts_param_grad(m, sn), dfn, ts_block_views(m, a, l).out,
                           ts_param_data(m, sn), v.mtp_fn_rstd, NL, C);
    ts_block_backward(m, a, l, v.mtp_in, g, sc, NULL); /* g: dL/dh' */
    /* eh_proj: its weight's gradient from cat, then cat's gradient in its place. */
    const int eh = module_param(m, k, TS_MTP_EH_PROJ);
    m->k->matmul_backward(NULL, ts_param_grad(m, eh), NULL, g, v.mtp_cat,
                          ts_param_compute(m, eh), NL, 2 * C, C);
    m->k->matmul_backward(v.mtp_cat, NULL, NULL, g, NULL, ts_param_compute(m, eh), NL, 2 * C, C);
    /* enorm into the embedding's rows (gathered under sequence parallelism, as the
     * embedding's backward takes them), through mtp_in and mtp_fn (free now). */
    const int en = module_param(m, k, TS_MTP_ENORM), hn = module_param(m, k, TS_MTP_HNORM);
    m->k->memcpy_2d(v.mtp_in, row, v.mtp_cat, 2 * row, row, (size_t)NL);
    m->k->memset_zero(v.mtp_fn, (size_t)NL * row);
    m->k->rmsnorm_backward(v.mtp_fn, ts_param_grad(m, en), v.mtp_in, v.mtp_emb,
                           ts_param_data(m, en), v.mtp_e_rstd, NL, C);
    ts_tp_embed_backward(&m->tp, ts_param_grad(m, m->mtp_wte_param), NULL,
                         ts_gather_rows(m, &d, ts_scratch_gather(&d, sc), v.mtp_fn), ids,
                         m->vocab_start, m->local_vocab, a->B, a->T, C);
    m->k->memcpy_2d(v.mtp_in, row, act_at(&d, v.mtp_cat, (size_t)C), 2 * row, row, (size_t)NL);
    m->k->rmsnorm_backward(dprev, ts_param_grad(m, hn), v.mtp_in, h_prev, ts_param_data(m, hn),
                           v.mtp_h_rstd, NL, C);
}

void ts_mtp_backward(const ts_model *m, const ts_acts *a, void *dx, const ts_scratch *sc)
{
    for (int k = 1; k <= m->mtp_layers; k++) {
        const int l = module_layer(m, k);
        const act_dims d = ts_act_dims(m, l, a->B, a->T);
        m->k->memset_zero(ts_mtp_views(m, a, l).mtp_dh, d.NL * d.C * d.ab);
    }
    for (int k = m->mtp_layers; k >= 1; k--)
        module_backward(m, a, k,
                        k > 1 ? ts_mtp_views(m, a, module_layer(m, k - 1)).mtp_dh : dx, sc);
}

void ts_mtp_sum_sequence_grads(const ts_model *m, void (*sum_block)(const ts_model *, int))
{
    for (int k = 1; k <= m->mtp_layers; k++) {
        sum_block(m, module_layer(m, k));
        if (!m->tp.sp) continue;
        /* The module's own tensors, replicated, ran on this rank's rows. */
        for (int w = TS_MTP_ENORM; w <= TS_MTP_SHARED_NORM; w++) {
            const int p = module_param(m, k, w);
            ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p), m->params[p].numel);
        }
    }
}

void ts_model_mtp_begin(const ts_model *m)
{
    if (m->mtp_sums) m->k->memset_zero(m->mtp_sums, (size_t)m->mtp_layers * sizeof(double));
}

void ts_model_mtp_read(const ts_model *m, double *sums)
{
    for (int k = 0; k < m->mtp_layers; k++) sums[k] = 0.0;
    if (m->mtp_sums && m->layers[m->n_layers - 1].owned)
        m->k->memcpy_d2h(sums, m->mtp_sums, (size_t)m->mtp_layers * sizeof(double));
}
