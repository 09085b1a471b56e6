/* Forward and backward of the three layer kinds, one micro-batch at a time.
 * A block reads like nanoGPT's:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x)).
 * The backward runs the residual stream's gradient `dx` through in place: each
 * LayerNorm backward adds its input gradient to it (the residual branch's identity
 * path is the "+ dx" for free). */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* Saved activations of one block, views into ts_acts.mem. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
    float *qkv;                       /* [N,3C] */
    float *atty;                      /* [N,C] attention output before c_proj */
    float *att;                       /* [B,NH,T,T] softmax probabilities */
    float *res2;                      /* [N,C] x + attn(...) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* [N,4C] */
    float *out;                       /* [N,C] block output (res3) */
} block_acts;

typedef struct {
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                    /* [N,V]: logits, then dlogits in place */
    float *losses;                    /* [N] */
} head_acts;

static size_t layer_floats(const ts_model *m, ts_layer_kind kind, int B, int T)
{
    size_t N = (size_t)B * T, C = (size_t)m->n_embd;
    switch (kind) {
    case TS_LAYER_EMBED: return N * C;
    case TS_LAYER_BLOCK:
        return N * C * (1 + 3 + 1 + 1 + 1 + 4 + 4 + 1) + 4 * N +
               (size_t)B * m->n_head * T * T;
    case TS_LAYER_HEAD: return N * C + 3 * N + N * (size_t)m->vocab_size;
    }
    return 0;
}

static block_acts block_views(const ts_model *m, const ts_acts *a, int l)
{
    size_t N = (size_t)a->B * a->T, C = (size_t)m->n_embd;
    float *p = a->mem + a->layer_off[l - a->l0];
    block_acts b;
    b.ln1 = p, p += N * C;
    b.ln1_mean = p, p += N;
    b.ln1_rstd = p, p += N;
    b.qkv = p, p += 3 * N * C;
    b.atty = p, p += N * C;
    b.att = p, p += (size_t)a->B * m->n_head * a->T * a->T;
    b.res2 = p, p += N * C;
    b.ln2 = p, p += N * C;
    b.ln2_mean = p, p += N;
    b.ln2_rstd = p, p += N;
    b.fch = p, p += 4 * N * C;
    b.fch_gelu = p, p += 4 * N * C;
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
    a->floats = total;
    a->mem = ts_alloc_floats(total);
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

void ts_scratch_init(ts_scratch *s, const ts_model *m, int B, int T)
{
    size_t N = (size_t)B * T, C = (size_t)m->n_embd;
    s->floats = 4 * N * C + N * C + (size_t)B * m->n_head * T * T;
    s->mem = ts_alloc_floats(s->floats);
}

void ts_scratch_free(ts_scratch *s)
{
    free(s->mem);
    s->mem = NULL;
}

/* ---------------------------------------------------------------- forward */

static void block_forward(const ts_model *m, const ts_acts *a, int l, const float *x)
{
    const ts_kernels *k = m->k;
    const int B = a->B, T = a->T, C = m->n_embd, NH = m->n_head, N = B * T;
    const int p0 = m->layers[l].first_param;
#define W(i) ts_param_data(m, p0 + (i))
    block_acts s = block_views(m, a, l);

    k->layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x, W(TS_B_LN1_W), W(TS_B_LN1_B), N, C);
    k->matmul_forward(s.qkv, s.ln1, W(TS_B_QKV_W), W(TS_B_QKV_B), N, C, 3 * C);
    k->attention_forward(s.atty, s.att, s.qkv, B, T, NH, C / NH);
    k->matmul_forward(s.res2, s.atty, W(TS_B_ATTPROJ_W), W(TS_B_ATTPROJ_B), N, C, C);
    k->residual_forward(s.res2, s.res2, x, (size_t)N * C);

    k->layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, W(TS_B_LN2_W), W(TS_B_LN2_B), N, C);
    k->matmul_forward(s.fch, s.ln2, W(TS_B_FC_W), W(TS_B_FC_B), N, C, 4 * C);
    k->gelu_forward(s.fch_gelu, s.fch, (size_t)N * 4 * C);
    k->matmul_forward(s.out, s.fch_gelu, W(TS_B_FCPROJ_W), W(TS_B_FCPROJ_B), N, 4 * C, C);
    k->residual_forward(s.out, s.out, s.res2, (size_t)N * C);
#undef W
}

static double head_forward(const ts_model *m, const ts_acts *a, int l, const float *x, float dloss)
{
    const ts_kernels *k = m->k;
    const int N = a->B * a->T, C = m->n_embd, V = m->vocab_size;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);

    k->layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, ts_param_data(m, p0),
                         ts_param_data(m, p0 + 1), N, C);
    /* LM head tied to the token embedding: logits = lnf @ wte^T. */
    k->matmul_forward(h.logits, h.lnf, ts_param_data(m, m->head_wte_param), NULL, N, C, V);
    k->crossentropy_forward_backward(h.losses, h.logits, a->targets, N, V, dloss);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += h.losses[i];
    return sum;
}

void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_sum)
{
    const ts_kernels *k = m->k;
    for (int l = a->l0; l < a->l1; l++) {
        const ts_layer *L = &m->layers[l];
        TS_ASSERT(L->owned);
        switch (L->kind) {
        case TS_LAYER_EMBED:
            k->encoder_forward(ts_acts_output(m, a, l), a->tokens, ts_param_data(m, L->first_param),
                               ts_param_data(m, L->first_param + 1), a->B, a->T, m->n_embd);
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

static void block_backward(const ts_model *m, const ts_acts *a, int l, const float *x, float *dx,
                          ts_scratch *sc)
{
    const ts_kernels *k = m->k;
    const int B = a->B, T = a->T, C = m->n_embd, NH = m->n_head, N = B * T;
    const int p0 = m->layers[l].first_param;
#define W(i) ts_param_data(m, p0 + (i))
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    float *buf4 = sc->mem;                        /* [N,4C] */
    float *bufc = buf4 + (size_t)4 * N * C;       /* [N,C] */
    float *att_scratch = bufc + (size_t)N * C;    /* [B,NH,T,T] */

    /* MLP: dx is the gradient of the block output. */
    k->matmul_backward(buf4, G(TS_B_FCPROJ_W), G(TS_B_FCPROJ_B), dx, s.fch_gelu, W(TS_B_FCPROJ_W),
                       N, 4 * C, C);
    k->gelu_backward(buf4, s.fch, buf4, (size_t)N * 4 * C);
    k->matmul_backward(bufc, G(TS_B_FC_W), G(TS_B_FC_B), buf4, s.ln2, W(TS_B_FC_W), N, C, 4 * C);
    k->layernorm_backward(dx, G(TS_B_LN2_W), G(TS_B_LN2_B), bufc, s.res2, W(TS_B_LN2_W),
                          s.ln2_mean, s.ln2_rstd, N, C);
    /* Attention: dx is now the gradient of res2. */
    k->matmul_backward(bufc, G(TS_B_ATTPROJ_W), G(TS_B_ATTPROJ_B), dx, s.atty, W(TS_B_ATTPROJ_W),
                       N, C, C);
    k->attention_backward(buf4, att_scratch, bufc, s.qkv, s.att, B, T, NH, C / NH);
    k->matmul_backward(bufc, G(TS_B_QKV_W), G(TS_B_QKV_B), buf4, s.ln1, W(TS_B_QKV_W), N, C, 3 * C);
    k->layernorm_backward(dx, G(TS_B_LN1_W), G(TS_B_LN1_B), bufc, x, W(TS_B_LN1_W), s.ln1_mean,
                          s.ln1_rstd, N, C);
#undef W
#undef G
}

static void head_backward(const ts_model *m, const ts_acts *a, int l, const float *x, float *dx,
                          ts_scratch *sc)
{
    const ts_kernels *k = m->k;
    const int N = a->B * a->T, C = m->n_embd, V = m->vocab_size;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);
    float *dlnf = sc->mem;

    /* The forward left dlogits in place of the logits. */
    k->matmul_backward(dlnf, ts_param_grad(m, m->head_wte_param), NULL, h.logits, h.lnf,
                       ts_param_data(m, m->head_wte_param), N, C, V);
    memset(dx, 0, (size_t)N * C * sizeof *dx);
    k->layernorm_backward(dx, ts_param_grad(m, p0), ts_param_grad(m, p0 + 1), dlnf, x,
                          ts_param_data(m, p0), h.lnf_mean, h.lnf_rstd, N, C);
}

void ts_model_backward(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        const ts_layer *L = &m->layers[l];
        switch (L->kind) {
        case TS_LAYER_EMBED:
            m->k->encoder_backward(ts_param_grad(m, L->first_param),
                                   ts_param_grad(m, L->first_param + 1), dx, a->tokens, a->B, a->T,
                                   m->n_embd);
            break;
        case TS_LAYER_BLOCK:
            block_backward(m, a, l, layer_input(m, a, l), dx, s);
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, layer_input(m, a, l), dx, s);
            break;
        }
        if (layer_done) layer_done(ctx, l);
    }
}

/* ------------------------------------------- zero-bubble split: I then W */

/* Per block, the stash keeps: d_out (block output gradient, the c_proj of the MLP's
 * dout) [N,C], d_fch (c_fc's dout) [N,4C], d_res2 (attn c_proj's dout) [N,C], d_qkv
 * (c_attn's dout) [N,3C]: 9 N C floats. */
enum { STASH_PER_BLOCK = 9 };

static float *block_stash(const ts_model *m, const ts_acts *a, int l)
{
    int blocks_before = 0;
    for (int j = a->l0; j < l; j++) blocks_before += m->layers[j].kind == TS_LAYER_BLOCK;
    return a->wstash + (size_t)blocks_before * STASH_PER_BLOCK * a->B * a->T * m->n_embd;
}

static void block_backward_input(const ts_model *m, const ts_acts *a, int l, const float *x,
                                 float *dx, ts_scratch *sc)
{
    const ts_kernels *k = m->k;
    const int B = a->B, T = a->T, C = m->n_embd, NH = m->n_head, N = B * T;
    const size_t NC = (size_t)N * C;
    const int p0 = m->layers[l].first_param;
#define W(i) ts_param_data(m, p0 + (i))
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    float *st = block_stash(m, a, l);
    float *d_out = st, *d_fch = st + NC, *d_res2 = st + 5 * NC, *d_qkv = st + 6 * NC;
    float *bufc = sc->mem + 4 * NC;
    float *att_scratch = bufc + NC;

    memcpy(d_out, dx, NC * sizeof(float));
    k->matmul_backward(d_fch, NULL, G(TS_B_FCPROJ_B), d_out, s.fch_gelu, W(TS_B_FCPROJ_W), N,
                       4 * C, C);
    k->gelu_backward(d_fch, s.fch, d_fch, 4 * NC);
    k->matmul_backward(bufc, NULL, G(TS_B_FC_B), d_fch, s.ln2, W(TS_B_FC_W), N, C, 4 * C);
    k->layernorm_backward(dx, G(TS_B_LN2_W), G(TS_B_LN2_B), bufc, s.res2, W(TS_B_LN2_W),
                          s.ln2_mean, s.ln2_rstd, N, C);
    memcpy(d_res2, dx, NC * sizeof(float));
    k->matmul_backward(bufc, NULL, G(TS_B_ATTPROJ_B), d_res2, s.atty, W(TS_B_ATTPROJ_W), N, C, C);
    k->attention_backward(d_qkv, att_scratch, bufc, s.qkv, s.att, B, T, NH, C / NH);
    k->matmul_backward(bufc, NULL, G(TS_B_QKV_B), d_qkv, s.ln1, W(TS_B_QKV_W), N, C, 3 * C);
    k->layernorm_backward(dx, G(TS_B_LN1_W), G(TS_B_LN1_B), bufc, x, W(TS_B_LN1_W), s.ln1_mean,
                          s.ln1_rstd, N, C);
#undef W
#undef G
}

static void block_backward_weight(const ts_model *m, const ts_acts *a, int l)
{
    const ts_kernels *k = m->k;
    const int C = m->n_embd, N = a->B * a->T;
    const size_t NC = (size_t)N * C;
    const int p0 = m->layers[l].first_param;
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    float *st = block_stash(m, a, l);
    k->matmul_backward(NULL, G(TS_B_FCPROJ_W), NULL, st, s.fch_gelu, NULL, N, 4 * C, C);
    k->matmul_backward(NULL, G(TS_B_FC_W), NULL, st + NC, s.ln2, NULL, N, C, 4 * C);
    k->matmul_backward(NULL, G(TS_B_ATTPROJ_W), NULL, st + 5 * NC, s.atty, NULL, N, C, C);
    k->matmul_backward(NULL, G(TS_B_QKV_W), NULL, st + 6 * NC, s.ln1, NULL, N, C, 3 * C);
#undef G
}

void ts_model_backward_input(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s)
{
    const size_t NC = (size_t)a->B * a->T * m->n_embd;
    int blocks = 0;
    for (int l = a->l0; l < a->l1; l++) blocks += m->layers[l].kind == TS_LAYER_BLOCK;
    TS_ASSERT(a->wstash == NULL);
    /* The blocks' stashes, then (for the first chunk) the embedding output's gradient. */
    a->wstash = ts_alloc_floats((size_t)blocks * STASH_PER_BLOCK * NC + (a->l0 == 0 ? NC : 0));
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        const ts_layer *L = &m->layers[l];
        const int N = a->B * a->T, C = m->n_embd, V = m->vocab_size;
        switch (L->kind) {
        case TS_LAYER_EMBED: /* no input gradient: keep its output gradient for W */
            memcpy(a->wstash + (size_t)blocks * STASH_PER_BLOCK * NC, dx, NC * sizeof(float));
            break;
        case TS_LAYER_BLOCK:
            block_backward_input(m, a, l, layer_input(m, a, l), dx, s);
            break;
        case TS_LAYER_HEAD: {
            head_acts h = head_views(m, a, l);
            const int p0 = L->first_param;
            m->k->matmul_backward(s->mem, NULL, NULL, h.logits, h.lnf,
                                  ts_param_data(m, m->head_wte_param), N, C, V);
            memset(dx, 0, (size_t)N * C * sizeof *dx);
            m->k->layernorm_backward(dx, ts_param_grad(m, p0), ts_param_grad(m, p0 + 1), s->mem,
                                     layer_input(m, a, l), ts_param_data(m, p0), h.lnf_mean,
                                     h.lnf_rstd, N, C);
            break;
        }
        }
    }
}

void ts_model_backward_weight(const ts_model *m, ts_acts *a)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        const ts_layer *L = &m->layers[l];
        const int N = a->B * a->T, C = m->n_embd, V = m->vocab_size;
        switch (L->kind) {
        case TS_LAYER_EMBED:
        {
            int blocks = 0;
            for (int j = a->l0; j < a->l1; j++) blocks += m->layers[j].kind == TS_LAYER_BLOCK;
            const float *dout = a->wstash + (size_t)blocks * STASH_PER_BLOCK * N * C;
            m->k->encoder_backward(ts_param_grad(m, L->first_param),
                                   ts_param_grad(m, L->first_param + 1), dout, a->tokens, a->B,
                                   a->T, C);
        }
            break;
        case TS_LAYER_BLOCK:
            block_backward_weight(m, a, l);
            break;
        case TS_LAYER_HEAD: {
            head_acts h = head_views(m, a, l);
            m->k->matmul_backward(NULL, ts_param_grad(m, m->head_wte_param), NULL, h.logits, h.lnf,
                                  NULL, N, C, V);
            break;
        }
        }
    }
    free(a->wstash);
    a->wstash = NULL;
}
