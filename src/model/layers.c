/* Forward and backward of the three layer kinds, one micro-batch at a time.
 * A block reads like nanoGPT's:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x)).
 * The backward runs the residual stream's gradient `dx` through in place: each
 * LayerNorm backward adds its input gradient to it (the residual branch's identity
 * path is the "+ dx" for free).
 *
 * Tensor parallelism (Megatron) hides in four places, each next to the matmul it
 * belongs to: c_attn and c_fc are column-parallel (this rank's heads / MLP columns;
 * their input gradient is all-reduced), the two c_proj are row-parallel (their output
 * is all-reduced, and their replicated bias is added by tp rank 0 only, so the sum
 * counts it once); the embedding and the LM head are vocab-parallel. With tp == 1
 * every collective is skipped and the code is the unsharded model's. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "model/model.h"

/* Saved activations of one block, views into ts_acts.mem. Cl = C/tp (local heads),
 * F = 4C/tp (local MLP width). */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
    float *qkv;                       /* [N,3Cl] this rank's heads of q, k and v */
    float *atty;                      /* [N,Cl] attention output before c_proj */
    float *att;                       /* [B,NH/tp,T,T] softmax probabilities */
    float *res2;                      /* [N,C] x + attn(...) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* [N,F] */
    float *out;                       /* [N,C] block output (res3) */
} block_acts;

typedef struct {
    float *lnf, *lnf_mean, *lnf_rstd;
    float *losses;                    /* [N] */
    float *rowmax, *sumexp, *tlogit;  /* [N] vocab-parallel cross-entropy statistics */
    float *logits;                    /* [N,V/tp]: logits, then dlogits in place */
} head_acts;

/* Local widths. */
static size_t attn_width(const ts_model *m) { return (size_t)m->n_embd / m->tp; }
static size_t mlp_width(const ts_model *m) { return 4 * (size_t)m->n_embd / m->tp; }
static int head_size(const ts_model *m) { return m->n_embd / m->n_head; }

static void tp_sum(const ts_model *m, float *buf, size_t n)
{
    if (m->tp > 1) ts_allreduce_sum_f32(m->tp_comm, buf, n);
}

static size_t layer_floats(const ts_model *m, ts_layer_kind kind, int B, int T)
{
    size_t N = (size_t)B * T, C = (size_t)m->n_embd, Cl = attn_width(m), F = mlp_width(m);
    switch (kind) {
    case TS_LAYER_EMBED: return N * C;
    case TS_LAYER_BLOCK:
        return N * C * 5 + N * (3 * Cl + Cl + 2 * F) + 4 * N +
               (size_t)B * m->local_heads * T * T;
    case TS_LAYER_HEAD: return N * C + 6 * N + N * (size_t)m->local_vocab;
    }
    return 0;
}

static block_acts block_views(const ts_model *m, const ts_acts *a, int l)
{
    size_t N = (size_t)a->B * a->T, C = (size_t)m->n_embd, Cl = attn_width(m), F = mlp_width(m);
    float *p = a->mem + a->layer_off[l - a->l0];
    block_acts b;
    b.ln1 = p, p += N * C;
    b.ln1_mean = p, p += N;
    b.ln1_rstd = p, p += N;
    b.qkv = p, p += 3 * N * Cl;
    b.atty = p, p += N * Cl;
    b.att = p, p += (size_t)a->B * m->local_heads * a->T * a->T;
    b.res2 = p, p += N * C;
    b.ln2 = p, p += N * C;
    b.ln2_mean = p, p += N;
    b.ln2_rstd = p, p += N;
    b.fch = p, p += N * F;
    b.fch_gelu = p, p += N * F;
    b.out = p;
    return b;
}

static head_acts head_views(const ts_model *m, const ts_acts *a, int l)
{
    size_t N = (size_t)a->B * a->T, C = (size_t)m->n_embd;
    float *p = a->mem + a->layer_off[l - a->l0];
    head_acts h;
    h.lnf = p, p += N * C;
    h.lnf_mean = p, p += N;
    h.lnf_rstd = p, p += N;
    h.losses = p, p += N;
    h.rowmax = p, p += N;
    h.sumexp = p, p += N;
    h.tlogit = p, p += N;
    h.logits = p;
    return h;
}

void ts_acts_init(ts_acts *a, const ts_model *m, int l0, int l1, int B, int T)
{
    TS_ASSERT(0 <= l0 && l0 < l1 && l1 <= m->n_layers && T <= m->max_seq_len);
    memset(a, 0, sizeof *a);
    a->l0 = l0;
    a->l1 = l1;
    a->B = B;
    a->T = T;
    a->tokens = ts_calloc((size_t)B * T, sizeof(int));
    a->targets = ts_calloc((size_t)B * T, sizeof(int));
    a->layer_off = ts_calloc((size_t)(l1 - l0), sizeof(size_t));
    size_t total = 0;
    for (int l = l0; l < l1; l++) {
        a->layer_off[l - l0] = total;
        total += (layer_floats(m, m->layers[l].kind, B, T) + 15) / 16 * 16;
    }
    TS_ASSERT(total == ts_acts_floats(m, l0, l1, B, T));
    a->floats = total;
    a->mem = ts_alloc_floats(total);
}

size_t ts_acts_floats(const ts_model *m, int l0, int l1, int B, int T)
{
    size_t total = 0;
    for (int l = l0; l < l1; l++) total += (layer_floats(m, m->layers[l].kind, B, T) + 15) / 16 * 16;
    return total;
}

void ts_acts_free(ts_acts *a)
{
    free(a->wstash);
    free(a->tokens);
    free(a->targets);
    free(a->layer_off);
    free(a->mem);
    memset(a, 0, sizeof *a);
}

float *ts_acts_output(const ts_model *m, const ts_acts *a, int l)
{
    switch (m->layers[l].kind) {
    case TS_LAYER_EMBED: return a->mem + a->layer_off[l - a->l0];
    case TS_LAYER_BLOCK: return block_views(m, a, l).out;
    case TS_LAYER_HEAD: break;
    }
    TS_ASSERT(!"the head has no activation output");
    return NULL;
}

const float *ts_acts_losses(const ts_model *m, const ts_acts *a)
{
    TS_ASSERT(a->l1 == m->n_layers);
    return head_views(m, a, m->n_layers - 1).losses;
}

static const float *layer_input(const ts_model *m, const ts_acts *a, int l)
{
    return l == a->l0 ? a->input : ts_acts_output(m, a, l - 1);
}

size_t ts_scratch_floats(const ts_model *m, int B, int T)
{
    size_t N = (size_t)B * T, C = (size_t)m->n_embd;
    return N * mlp_width(m) + N * C + (size_t)B * m->local_heads * T * T;
}

void ts_scratch_init(ts_scratch *s, const ts_model *m, int B, int T)
{
    s->floats = ts_scratch_floats(m, B, T);
    s->mem = ts_alloc_floats(s->floats);
}

void ts_scratch_free(ts_scratch *s)
{
    free(s->mem);
    s->mem = NULL;
}

/* ---------------------------------------------------------------- forward */

static void embed_forward(const ts_model *m, const ts_acts *a, int l)
{
    const ts_layer *L = &m->layers[l];
    float *out = ts_acts_output(m, a, l);
    const float *wte = ts_param_data(m, L->first_param), *wpe = ts_param_data(m, L->first_param + 1);
    if (m->tp == 1) {
        m->k->encoder_forward(out, a->tokens, wte, wpe, a->B, a->T, m->n_embd);
        return;
    }
    /* This rank's vocabulary rows, plus the positions on rank 0 only; the all-reduce
     * assembles the full embedding on every rank. */
    m->k->vocab_embed_forward(out, a->tokens, wte, m->tp_rank == 0 ? wpe : NULL, m->vocab_start,
                              m->local_vocab, a->B, a->T, m->n_embd);
    tp_sum(m, out, (size_t)a->B * a->T * m->n_embd);
}

static void block_forward(const ts_model *m, const ts_acts *a, int l, const float *x)
{
    const ts_kernels *k = m->k;
    const int B = a->B, T = a->T, C = m->n_embd, N = B * T;
    const int Cl = (int)attn_width(m), F = (int)mlp_width(m);
    const int p0 = m->layers[l].first_param;
    const bool bias_here = m->tp_rank == 0; /* row-parallel biases: counted once */
#define W(i) ts_param_data(m, p0 + (i))
    block_acts s = block_views(m, a, l);

    k->layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x, W(TS_B_LN1_W), W(TS_B_LN1_B), N, C);
    k->matmul_forward(s.qkv, s.ln1, W(TS_B_QKV_W), W(TS_B_QKV_B), N, C, 3 * Cl);
    k->attention_forward(s.atty, s.att, s.qkv, B, T, m->local_heads, head_size(m));
    k->matmul_forward(s.res2, s.atty, W(TS_B_ATTPROJ_W), bias_here ? W(TS_B_ATTPROJ_B) : NULL, N,
                      Cl, C);
    tp_sum(m, s.res2, (size_t)N * C);
    k->residual_forward(s.res2, s.res2, x, (size_t)N * C);

    k->layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, W(TS_B_LN2_W), W(TS_B_LN2_B), N, C);
    k->matmul_forward(s.fch, s.ln2, W(TS_B_FC_W), W(TS_B_FC_B), N, C, F);
    k->gelu_forward(s.fch_gelu, s.fch, (size_t)N * F);
    k->matmul_forward(s.out, s.fch_gelu, W(TS_B_FCPROJ_W), bias_here ? W(TS_B_FCPROJ_B) : NULL, N,
                      F, C);
    tp_sum(m, s.out, (size_t)N * C);
    k->residual_forward(s.out, s.out, s.res2, (size_t)N * C);
#undef W
}

/* The loss, with the softmax's gradient left in place of the logits. Vocab-parallel:
 * reduce the row max and the target logit, then the sum of exponentials, across the
 * tp ranks; the logits themselves never leave their rank. */
static void cross_entropy(const ts_model *m, const ts_acts *a, const head_acts *h, float dloss)
{
    const ts_kernels *k = m->k;
    const int N = a->B * a->T;
    if (m->tp == 1) {
        k->crossentropy_forward_backward(h->losses, h->logits, a->targets, N, m->vocab_size, dloss);
        return;
    }
    k->xent_vp_stats(h->rowmax, h->tlogit, h->logits, a->targets, m->vocab_start, m->local_vocab,
                     N);
    ts_allreduce_max_f32(m->tp_comm, h->rowmax, (size_t)N);
    tp_sum(m, h->tlogit, (size_t)N);
    k->xent_vp_sumexp(h->sumexp, h->logits, h->rowmax, N, m->local_vocab);
    tp_sum(m, h->sumexp, (size_t)N);
    k->xent_vp_finish(h->losses, h->logits, a->targets, m->vocab_start, m->local_vocab, h->rowmax,
                      h->sumexp, h->tlogit, N, dloss);
}

static double head_forward(const ts_model *m, const ts_acts *a, int l, const float *x, float dloss)
{
    const int N = a->B * a->T, C = m->n_embd;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);

    m->k->layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, ts_param_data(m, p0),
                            ts_param_data(m, p0 + 1), N, C);
    /* LM head tied to the token embedding: logits = lnf @ wte^T (this rank's rows). */
    m->k->matmul_forward(h.logits, h.lnf, ts_param_data(m, m->head_wte_param), NULL, N, C,
                         m->local_vocab);
    cross_entropy(m, a, &h, dloss);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += h.losses[i];
    return sum;
}

void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_sum)
{
    for (int l = a->l0; l < a->l1; l++) {
        const ts_layer *L = &m->layers[l];
        TS_ASSERT(L->owned);
        switch (L->kind) {
        case TS_LAYER_EMBED:
            embed_forward(m, a, l);
            break;
        case TS_LAYER_BLOCK:
            block_forward(m, a, l, layer_input(m, a, l));
            break;
        case TS_LAYER_HEAD: {
            double s = head_forward(m, a, l, layer_input(m, a, l), dloss);
            if (loss_sum) *loss_sum = s;
            break;
        }
        }
    }
}

/* ---------------------------------------------------------------- backward */

static void embed_backward(const ts_model *m, const ts_acts *a, int l, const float *dout)
{
    const ts_layer *L = &m->layers[l];
    float *dwte = ts_param_grad(m, L->first_param), *dwpe = ts_param_grad(m, L->first_param + 1);
    if (m->tp == 1)
        m->k->encoder_backward(dwte, dwpe, dout, a->tokens, a->B, a->T, m->n_embd);
    else /* dout is the same on every tp rank, so the replicated wpe's gradient is too */
        m->k->vocab_embed_backward(dwte, dwpe, dout, a->tokens, m->vocab_start, m->local_vocab,
                                   a->B, a->T, m->n_embd);
}

/* The backward of a block. With `stash` (the zero-bubble input-gradient pass) the four
 * matmul weight gradients are not computed: their output gradients are kept in the
 * stash for block_backward_weight. */
enum { STASH_D_OUT, STASH_D_FCH, STASH_D_RES2, STASH_D_QKV };
static size_t stash_floats(const ts_model *m, int N)
{
    return (size_t)N * (2 * (size_t)m->n_embd + mlp_width(m) + 3 * attn_width(m));
}
static float *stash_part(const ts_model *m, float *st, int N, int part)
{
    size_t NC = (size_t)N * m->n_embd, NF = (size_t)N * mlp_width(m);
    switch (part) {
    case STASH_D_OUT: return st;
    case STASH_D_FCH: return st + NC;
    case STASH_D_RES2: return st + NC + NF;
    default: return st + 2 * NC + NF;
    }
}

static void block_backward(const ts_model *m, const ts_acts *a, int l, const float *x, float *dx,
                           ts_scratch *sc, float *stash)
{
    const ts_kernels *k = m->k;
    const int B = a->B, T = a->T, C = m->n_embd, N = B * T;
    const int Cl = (int)attn_width(m), F = (int)mlp_width(m);
    const size_t NC = (size_t)N * C;
    const int p0 = m->layers[l].first_param;
#define W(i) ts_param_data(m, p0 + (i))
#define G(i) ts_param_grad(m, p0 + (i))
#define GW(i) (stash ? NULL : G(i)) /* matmul weight gradients: deferred with a stash */
    block_acts s = block_views(m, a, l);
    float *dfch = stash ? stash_part(m, stash, N, STASH_D_FCH) : sc->mem;       /* [N,F] */
    float *dqkv = stash ? stash_part(m, stash, N, STASH_D_QKV) : sc->mem;       /* [N,3Cl] */
    float *bufc = sc->mem + (size_t)N * F;                                      /* [N,C] */
    float *att_scratch = bufc + NC;

    /* MLP: dx is the gradient of the block output (the same on every tp rank). */
    const float *d_out = dx;
    if (stash) {
        memcpy(stash_part(m, stash, N, STASH_D_OUT), dx, NC * sizeof(float));
        d_out = stash_part(m, stash, N, STASH_D_OUT);
    }
    k->matmul_backward(dfch, GW(TS_B_FCPROJ_W), G(TS_B_FCPROJ_B), d_out, s.fch_gelu,
                       W(TS_B_FCPROJ_W), N, F, C);
    k->gelu_backward(dfch, s.fch, dfch, (size_t)N * F);
    k->matmul_backward(bufc, GW(TS_B_FC_W), G(TS_B_FC_B), dfch, s.ln2, W(TS_B_FC_W), N, C, F);
    tp_sum(m, bufc, NC); /* column-parallel: the input gradient sums over the tp ranks */
    k->layernorm_backward(dx, G(TS_B_LN2_W), G(TS_B_LN2_B), bufc, s.res2, W(TS_B_LN2_W),
                          s.ln2_mean, s.ln2_rstd, N, C);

    /* Attention: dx is now the gradient of res2. */
    const float *d_res2 = dx;
    if (stash) {
        memcpy(stash_part(m, stash, N, STASH_D_RES2), dx, NC * sizeof(float));
        d_res2 = stash_part(m, stash, N, STASH_D_RES2);
    }
    float *datty = bufc; /* [N,Cl] */
    k->matmul_backward(datty, GW(TS_B_ATTPROJ_W), G(TS_B_ATTPROJ_B), d_res2, s.atty,
                       W(TS_B_ATTPROJ_W), N, Cl, C);
    k->attention_backward(dqkv, att_scratch, datty, s.qkv, s.att, B, T, m->local_heads,
                          head_size(m));
    k->matmul_backward(bufc, GW(TS_B_QKV_W), G(TS_B_QKV_B), dqkv, s.ln1, W(TS_B_QKV_W), N, C,
                       3 * Cl);
    tp_sum(m, bufc, NC);
    k->layernorm_backward(dx, G(TS_B_LN1_W), G(TS_B_LN1_B), bufc, x, W(TS_B_LN1_W), s.ln1_mean,
                          s.ln1_rstd, N, C);
#undef W
#undef G
#undef GW
}

static void block_backward_weight(const ts_model *m, const ts_acts *a, int l, const float *stash)
{
    const ts_kernels *k = m->k;
    const int C = m->n_embd, N = a->B * a->T;
    const int Cl = (int)attn_width(m), F = (int)mlp_width(m);
    const int p0 = m->layers[l].first_param;
    float *st = (float *)stash;
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    k->matmul_backward(NULL, G(TS_B_FCPROJ_W), NULL, stash_part(m, st, N, STASH_D_OUT), s.fch_gelu,
                       NULL, N, F, C);
    k->matmul_backward(NULL, G(TS_B_FC_W), NULL, stash_part(m, st, N, STASH_D_FCH), s.ln2, NULL, N,
                       C, F);
    k->matmul_backward(NULL, G(TS_B_ATTPROJ_W), NULL, stash_part(m, st, N, STASH_D_RES2), s.atty,
                       NULL, N, Cl, C);
    k->matmul_backward(NULL, G(TS_B_QKV_W), NULL, stash_part(m, st, N, STASH_D_QKV), s.ln1, NULL,
                       N, C, 3 * Cl);
#undef G
}

/* The head's backward: the forward left dlogits in place of the logits. With
 * `defer_weight`, the LM head's (tied embedding's) weight gradient waits for the W pass. */
static void head_backward(const ts_model *m, const ts_acts *a, int l, const float *x, float *dx,
                          ts_scratch *sc, bool defer_weight)
{
    const ts_kernels *k = m->k;
    const int N = a->B * a->T, C = m->n_embd;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);
    float *dlnf = sc->mem;

    k->matmul_backward(dlnf, defer_weight ? NULL : ts_param_grad(m, m->head_wte_param), NULL,
                       h.logits, h.lnf, ts_param_data(m, m->head_wte_param), N, C, m->local_vocab);
    tp_sum(m, dlnf, (size_t)N * C); /* vocab-parallel: each rank saw its columns only */
    memset(dx, 0, (size_t)N * C * sizeof *dx);
    k->layernorm_backward(dx, ts_param_grad(m, p0), ts_param_grad(m, p0 + 1), dlnf, x,
                          ts_param_data(m, p0), h.lnf_mean, h.lnf_rstd, N, C);
}

void ts_model_backward(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, dx);
            break;
        case TS_LAYER_BLOCK:
            block_backward(m, a, l, layer_input(m, a, l), dx, s, NULL);
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, layer_input(m, a, l), dx, s, false);
            break;
        }
        if (layer_done) layer_done(ctx, l);
    }
}

/* ------------------------------------------- zero-bubble split: I then W */

/* The stash holds, per block, the output gradients of its four matmuls, then (for the
 * first chunk) the embedding output's gradient. */
static size_t stash_offset(const ts_model *m, const ts_acts *a, int l)
{
    int blocks_before = 0;
    for (int j = a->l0; j < l; j++) blocks_before += m->layers[j].kind == TS_LAYER_BLOCK;
    return (size_t)blocks_before * stash_floats(m, a->B * a->T);
}

size_t ts_acts_stash_floats(const ts_model *m, int l0, int l1, int B, int T)
{
    int blocks = 0;
    for (int l = l0; l < l1; l++) blocks += m->layers[l].kind == TS_LAYER_BLOCK;
    return (size_t)blocks * stash_floats(m, B * T) + (l0 == 0 ? (size_t)B * T * m->n_embd : 0);
}

void ts_model_backward_input(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s)
{
    const size_t NC = (size_t)a->B * a->T * m->n_embd;
    TS_ASSERT(a->wstash == NULL);
    size_t embed_at = stash_offset(m, a, a->l1);
    a->wstash = ts_alloc_floats(embed_at + (a->l0 == 0 ? NC : 0));
    TS_ASSERT(embed_at + (a->l0 == 0 ? NC : 0) == ts_acts_stash_floats(m, a->l0, a->l1, a->B, a->T));
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: /* no input gradient: keep its output gradient for W */
            memcpy(a->wstash + embed_at, dx, NC * sizeof(float));
            break;
        case TS_LAYER_BLOCK:
            block_backward(m, a, l, layer_input(m, a, l), dx, s, a->wstash + stash_offset(m, a, l));
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, layer_input(m, a, l), dx, s, true);
            break;
        }
    }
}

void ts_model_backward_weight(const ts_model *m, ts_acts *a)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, a->wstash + stash_offset(m, a, a->l1));
            break;
        case TS_LAYER_BLOCK:
            block_backward_weight(m, a, l, a->wstash + stash_offset(m, a, l));
            break;
        case TS_LAYER_HEAD: {
            head_acts h = head_views(m, a, l);
            m->k->matmul_backward(NULL, ts_param_grad(m, m->head_wte_param), NULL, h.logits, h.lnf,
                                  NULL, a->B * a->T, m->n_embd, m->local_vocab);
            break;
        }
        }
    }
    free(a->wstash);
    a->wstash = NULL;
}
