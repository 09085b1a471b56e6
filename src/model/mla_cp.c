/* Multi-head latent attention under context parallelism: the latent's exchange, its
 * expansion over every position, the prefix attention and their backward (mla_cp.h). */
#include "model/mla_cp.h"

#include "tensor/cp.h"

#define ALIGN64(x) (((x) + 63) / 64 * 64)

/* This rank's attention heads: one k/v head per q head, q/k of nope + rope, v of HSV. */
static ts_att_heads heads_of(const block_sub *b)
{
    const act_dims *d = b->d;
    return (ts_att_heads){.NH = (int)d->H, .NKV = (int)d->H, .HS = (int)d->HS,
                          .HSV = (int)d->HSV, .scale = b->m->att_scale,
                          .doc_start = b->doc_start};
}

/* The work, in order: over the G = B*T gathered positions the expanded kv rows [G, KVW]
 * (KVW = H (HS + HSV)) and their gradient, kv_b_proj's output [G, KVB] (then its
 * gradient), the packed latent [G, RKV] (kv_b_proj's input) and its gradient, the k
 * heads' rope-channel gradients [G, H RR] and their sum [G, RR], the gathered latent's
 * gradient [G, RKV + RR]; over the local rows N the latent rows [N, RKV + RR] (sent,
 * then the reduce-scattered gradient); the exchange's own work. */
enum { W_KVX, W_DKVX, W_KVB, W_LAT, W_DLAT, W_PE, W_DPE, W_DLATG, W_LOCAL, W_ROWS, W_PARTS };

static void part_bytes(const ts_cp *cp, const act_dims *d, int B, size_t part[W_PARTS])
{
    const size_t G = (size_t)B * cp->T, N = (size_t)B * ts_cp_local_len(cp), ab = d->ab;
    const size_t W = d->RKV + d->RR, KVW = d->H * (d->HS + d->HSV);
    part[W_KVX] = ALIGN64(G * KVW * ab);
    part[W_DKVX] = ALIGN64(G * KVW * ab);
    part[W_KVB] = ALIGN64(G * d->KVB * ab);
    part[W_LAT] = ALIGN64(G * d->RKV * ab);
    part[W_DLAT] = ALIGN64(G * d->RKV * ab);
    part[W_PE] = ALIGN64(G * d->H * d->RR * ab);
    part[W_DPE] = ALIGN64(G * d->RR * ab);
    part[W_DLATG] = ALIGN64(G * W * ab);
    part[W_LOCAL] = ALIGN64(N * W * ab);
    part[W_ROWS] = ALIGN64(ts_cp_rows_work_bytes(cp, B, W, ab));
}

size_t ts_mla_cp_work_bytes(const ts_cp *cp, const act_dims *d, int B)
{
    if (cp->size == 1) return 0;
    size_t part[W_PARTS], total = 0;
    part_bytes(cp, d, B, part);
    for (int i = 0; i < W_PARTS; i++) total += part[i];
    return total;
}

size_t ts_mla_cp_latent_elems(const ts_cp *cp, const act_dims *d, int B)
{
    return ts_cp_rows_elems(cp, B, d->RKV + d->RR);
}

typedef struct {
    unsigned char *p[W_PARTS];
} mla_cp_work;

static mla_cp_work work_of(const block_sub *b)
{
    size_t part[W_PARTS];
    part_bytes(&b->m->cp, b->d, b->B, part);
    mla_cp_work w;
    unsigned char *at = b->cp_work;
    for (int i = 0; i < W_PARTS; i++) {
        w.p[i] = at;
        at += part[i];
    }
    return w;
}

/* Element offsets into row-major buffers, in bytes. */
static size_t el(const act_dims *d, size_t n) { return n * d->ab; }

/* The gathered latent latg [G, RKV + RR] through kv_b_proj into the prefix kernels' kv
 * rows [G, H HS k | H HSV v]: k head h = [its k_nope | the shared k_pe], v head h. */
static void expand(const block_sub *b, mla_cp_work *w, const void *latg)
{
    const ts_kernels *k = b->m->k;
    const act_dims *d = b->d;
    const size_t G = (size_t)b->B * b->m->cp.T, W = d->RKV + d->RR;
    const size_t H = d->H, HS = d->HS, HSV = d->HSV, RR = d->RR, nope = HS - RR;
    const size_t KVW = H * (HS + HSV), KVB = d->KVB, kvb_head = nope + HSV;
    unsigned char *kvx = w->p[W_KVX], *kvb = w->p[W_KVB];
    const unsigned char *lat = latg;
    k->memcpy_2d(w->p[W_LAT], el(d, d->RKV), lat, el(d, W), el(d, d->RKV), G);
    k->matmul_forward(kvb, w->p[W_LAT], ts_block_weight(b, b->r.mla_kvb_w), NULL, (int)G,
                      (int)d->RKV, (int)KVB);
    for (size_t h = 0; h < H; h++) {
        k->memcpy_2d(kvx + el(d, h * HS), el(d, KVW), kvb + el(d, h * kvb_head), el(d, KVB),
                     el(d, nope), G);
        k->memcpy_2d(kvx + el(d, h * HS + nope), el(d, KVW), lat + el(d, d->RKV), el(d, W),
                     el(d, RR), G);
        k->memcpy_2d(kvx + el(d, H * HS + h * HSV), el(d, KVW),
                     kvb + el(d, h * kvb_head + nope), el(d, KVB), el(d, HSV), G);
    }
}

void ts_mla_cp_assemble(const block_sub *b, void *qkv, const void *q)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const size_t H = d->H, HS = d->HS, RR = d->RR, nope = HS - RR, N = (size_t)b->N;
    m->k->memcpy_2d(qkv, el(d, d->QKV), q, el(d, d->QK), el(d, d->QK), N);
    /* k_pe into every k head's rope channels (RoPE rotates them all: the same values). */
    for (size_t h = 0; h < H; h++)
        m->k->memcpy_2d((unsigned char *)qkv + el(d, d->QK + h * HS + nope), el(d, d->QKV),
                        b->v.mla_kpe, el(d, RR), el(d, RR), N);
    ts_block_rope(b, qkv, heads_of(b), m->rope_dim, m->rope_interleaved, false);
}

void ts_mla_cp_forward(const block_sub *b, void *qkv, const void *q, void *att)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const ts_kernels *k = m->k;
    const size_t N = (size_t)b->N, W = d->RKV + d->RR, kpe = d->QK + d->HS - d->RR;
    mla_cp_work w = work_of(b);
    ts_mla_cp_assemble(b, qkv, q);
    /* This rank's latent rows: the normalised c_kv, then k_pe after RoPE (k head 0's). */
    unsigned char *local = w.p[W_LOCAL];
    k->memcpy_2d(local, el(d, W), b->v.mla_ckv, el(d, d->RKV), el(d, d->RKV), N);
    k->memcpy_2d(local + el(d, d->RKV), el(d, W), (const unsigned char *)qkv + el(d, kpe),
                 el(d, d->QKV), el(d, d->RR), N);
    ts_cp_rows_gather(&m->cp, b->v.kvg, w.p[W_ROWS], local, W, b->B, W);
    expand(b, &w, b->v.kvg);
    ts_cp_attention_recompute(&m->cp, b->v.atty, att, w.p[W_KVX], qkv, b->B, b->T,
                              heads_of(b));
}

void ts_mla_cp_backward(const block_sub *b, void *dqkv, void *dckv, const void *dout,
                        const void *qkv, const void *att)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const ts_kernels *k = m->k;
    const ts_att_heads hd = heads_of(b);
    const size_t N = (size_t)b->N, G = (size_t)b->B * m->cp.T, W = d->RKV + d->RR;
    const size_t H = d->H, HS = d->HS, HSV = d->HSV, RR = d->RR, nope = HS - RR;
    const size_t KVW = H * (HS + HSV), KVB = d->KVB, kvb_head = nope + HSV;
    mla_cp_work w = work_of(b);
    expand(b, &w, b->v.kvg); /* the forward's kv rows again: they are work, not kept */
    if (!att) { /* selective recompute: the attention state again, from the same inputs */
        void *rebuilt = ts_scratch_rebuilt(d, b->sc);
        ts_cp_attention_recompute(&m->cp, ts_scratch_rebuilt_out(d, b->sc), rebuilt,
                                  w.p[W_KVX], qkv, b->B, b->T, hd);
        att = rebuilt;
    }
    unsigned char *dkvx = w.p[W_DKVX], *dkvb = w.p[W_KVB], *pe = w.p[W_PE];
    ts_cp_attention_backward_gathered(&m->cp, dqkv, dkvx, ts_scratch_attention(d, b->sc), dout,
                                      qkv, w.p[W_KVX], att, b->B, b->T, hd);
    /* dK/dV of every position back to kv_b_proj's output and the k heads' rope channels. */
    for (size_t h = 0; h < H; h++) {
        k->memcpy_2d(dkvb + el(d, h * kvb_head), el(d, KVB), dkvx + el(d, h * HS), el(d, KVW),
                     el(d, nope), G);
        k->memcpy_2d(pe + el(d, h * RR), el(d, H * RR), dkvx + el(d, h * HS + nope),
                     el(d, KVW), el(d, RR), G);
        k->memcpy_2d(dkvb + el(d, h * kvb_head + nope), el(d, KVB),
                     dkvx + el(d, H * HS + h * HSV), el(d, KVW), el(d, HSV), G);
    }
    /* The shared k_pe's gradient: the sum over the heads (one fp32-accumulated GEMM with
     * the model's 0/1 matrix, as on one rank). */
    k->matmul_forward(w.p[W_DPE], pe, m->mla_pe_sum, NULL, (int)G, (int)(H * RR), (int)RR);
    k->matmul_backward(w.p[W_DLAT], ts_block_grad(b, b->r.mla_kvb_w), NULL, dkvb, w.p[W_LAT],
                       ts_block_weight(b, b->r.mla_kvb_w), (int)G, (int)d->RKV, (int)KVB);
    unsigned char *dlatg = w.p[W_DLATG], *local = w.p[W_LOCAL];
    k->memcpy_2d(dlatg, el(d, W), w.p[W_DLAT], el(d, d->RKV), el(d, d->RKV), G);
    k->memcpy_2d(dlatg + el(d, d->RKV), el(d, W), w.p[W_DPE], el(d, RR), el(d, RR), G);
    ts_cp_rows_reduce_scatter(&m->cp, local, W, w.p[W_ROWS], dlatg, b->B, W);
    /* The owners' rows: the latent's gradient, and k_pe's into k head 0's rope channels
     * with the other heads' zero (the one-rank RoPE backward and head sum then give it
     * unchanged; the k_nope and v columns are not read). */
    k->memcpy_2d(dckv, el(d, d->RKV), local, el(d, W), el(d, d->RKV), N);
    unsigned char *dk = (unsigned char *)dqkv + el(d, d->QK + nope), *zero = w.p[W_DPE];
    k->memcpy_2d(dk, el(d, d->QKV), local + el(d, d->RKV), el(d, W), el(d, RR), N);
    k->memset_zero(zero, el(d, N * RR));
    for (size_t h = 1; h < H; h++)
        k->memcpy_2d(dk + el(d, h * HS), el(d, d->QKV), zero, el(d, RR), el(d, RR), N);
}
