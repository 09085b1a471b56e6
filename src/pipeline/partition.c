/* Cutting the layer list into pipeline chunks: explicit lists, the exact balancer, and
 * the per-layer costs it balances (modelled or measured with the real model code). */
#include "pipeline/partition.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sysmem.h"
#include "core/timer.h"
#include "model/model.h"

/* ------------------------------------------------------------ layer costs -- */

static void costs_alloc(ts_layer_costs *c, int n_layers, ts_cost_source source)
{
    c->n_layers = n_layers;
    c->fwd_ms = ts_calloc((size_t)n_layers, sizeof(double));
    c->bwd_ms = ts_calloc((size_t)n_layers, sizeof(double));
    c->act_bytes = ts_calloc((size_t)n_layers, sizeof(double));
    c->source = source;
}

void ts_layer_costs_free(ts_layer_costs *c)
{
    free(c->fwd_ms);
    free(c->bwd_ms);
    free(c->act_bytes);
    memset(c, 0, sizeof *c);
}

void ts_layer_costs_copy(ts_layer_costs *dst, const ts_layer_costs *src)
{
    costs_alloc(dst, src->n_layers, src->source);
    size_t bytes = (size_t)src->n_layers * sizeof(double);
    memcpy(dst->fwd_ms, src->fwd_ms, bytes);
    memcpy(dst->bwd_ms, src->bwd_ms, bytes);
    memcpy(dst->act_bytes, src->act_bytes, bytes);
}

/* Saved activation bytes of one micro-batch on one rank (the layout is layers.c's), as
 * the fp32 CPU backend holds them: the partition balances relative costs, which the
 * precision scales alike. */
static double act_bytes(const ts_model_config *mc, ts_layer_kind kind, int micro_batch)
{
    return (double)ts_layer_act_bytes(mc, kind, micro_batch, mc->seq_len, 1, 0, &ts_kernels_cpu);
}

static ts_layer_kind kind_of(int layer, int n_layers)
{
    return layer == 0 ? TS_LAYER_EMBED : layer == n_layers - 1 ? TS_LAYER_HEAD : TS_LAYER_BLOCK;
}

/* Milliseconds for `flops` floating-point operations and `bytes` of memory traffic on
 * the assumed machine (the two simply add: a roofline without overlap). */
static double model_ms(double flops, double bytes)
{
    return flops / (TS_MODEL_GFLOPS * 1e6) + bytes / (TS_MODEL_GBS * 1e6);
}

void ts_layer_costs_model(ts_layer_costs *c, const ts_model_config *mc, int micro_batch)
{
    const int n_layers = mc->n_layer + 2;
    costs_alloc(c, n_layers, TS_COST_MODELLED);
    const double B = micro_batch, T = mc->seq_len, C = mc->n_embd, V = mc->vocab_size;
    const double N = B * T, F = 4.0; /* bytes per float */

    /* Embedding: gather N rows of wte plus wpe, write [N,C]; backward reads the output
     * gradient and scatter-adds it into dwte rows (read-modify-write) and dwpe. */
    double emb_f = F * (N * C + T * C + N * C) + 4.0 * N;
    double emb_b = F * (N * C + 2 * N * C + 2 * T * C) + 4.0 * N;

    /* Block: GEMMs 2*N per weight element (gpt2: QKV 3C^2, projection C^2, MLP 2CF =
     * 24*N*C^2 at F = 4C; llama: q and o C*Q each, k and v C*KV each, SwiGLU 3CF) and
     * attention 4*N*T*Q forward (per query head); the backward computes two GEMMs per
     * forward GEMM. Traffic: the saved activations are written once and read back in
     * backward (and their gradients streamed), the weights read in both passes and their
     * gradients read and written. */
    const double HS = ts_model_head_dim(mc), Q = mc->n_head * HS, KV = ts_model_kv_heads(mc) * HS,
                 FF = ts_model_ffn(mc);
    const bool llama = ts_model_arch(mc) == TS_ARCH_LLAMA;
    const double blk_weights = llama ? 2.0 * C * Q + 2.0 * C * KV + 3.0 * C * FF
                                     : 4.0 * C * C + 2.0 * C * FF;
    double blk_flops = 2.0 * N * blk_weights + 4.0 * N * T * Q;
    double blk_act = act_bytes(mc, TS_LAYER_BLOCK, micro_batch);
    double blk_par = F * blk_weights;
    double blk_f = model_ms(blk_flops, blk_act + blk_par);
    double blk_b = model_ms(2.0 * blk_flops, 2.0 * blk_act + 3.0 * blk_par);

    /* Head: LayerNorm, logits = lnf @ wte^T (2*N*C*V), fused softmax + cross-entropy over
     * N*V (in place: logits written, read and rewritten as dlogits; ~8 flops per entry
     * counting the exp); backward: two GEMMs (dinput, dwte) reading dlogits again. */
    double hd_f = model_ms(2.0 * N * C * V + 8.0 * N * C + 8.0 * N * V,
                           F * (3.0 * N * V + V * C + 3.0 * N * C));
    double hd_b = model_ms(4.0 * N * C * V + 10.0 * N * C,
                           F * (2.0 * N * V + 3.0 * V * C + 4.0 * N * C));

    for (int l = 0; l < n_layers; l++) {
        ts_layer_kind k = kind_of(l, n_layers);
        c->act_bytes[l] = act_bytes(mc, k, micro_batch);
        switch (k) {
        case TS_LAYER_EMBED:
            c->fwd_ms[l] = model_ms(N * C, emb_f);
            c->bwd_ms[l] = model_ms(2.0 * N * C, emb_b);
            break;
        case TS_LAYER_BLOCK:
            c->fwd_ms[l] = blk_f;
            c->bwd_ms[l] = blk_b;
            break;
        case TS_LAYER_HEAD:
            c->fwd_ms[l] = hd_f;
            c->bwd_ms[l] = hd_b;
            break;
        }
    }
}

/* splitmix64: a fixed stream of test inputs (the values do not matter, only that
 * tokens are in range and activations are finite). */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_uniform(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(mix(s) >> 11) * 0x1p-53 - 0.5);
}

/* Time forward and backward of layers [l0, l1) of `m`: the fastest of a few runs. The
 * first run warms caches and thread pools; it still counts in the minimum, which is
 * what makes a slow first run harmless. Big layers stop early (about 1-2 s each). */
static void time_layer(const ts_model *m, int l, int B, int T, const void *x, const void *dy,
                       void *dx, ts_scratch *sc, uint64_t *seed, double *f_ms, double *b_ms)
{
    const size_t N = (size_t)B * T, C = (size_t)m->n_embd;
    ts_acts a;
    ts_acts_init(&a, m, l, l + 1, B, T);
    a.mla_work = ts_scratch_mla_work(sc, m, B, T);
    int *ids = ts_malloc(2 * N * sizeof(int)); /* tokens then targets, made on the host */
    for (size_t i = 0; i < 2 * N; i++) ids[i] = (int)(mix(seed) % (uint64_t)m->vocab_size);
    m->k->memcpy_h2d(a.tokens, ids, N * sizeof(int));
    m->k->memcpy_h2d(a.targets, ids + N, N * sizeof(int));
    free(ids);
    a.input = x;
    *f_ms = *b_ms = INFINITY;
    double total = 0.0;
    for (int rep = 0; rep < 4; rep++) {
        m->k->memcpy_d2d(dx, dy, N * C * ts_dtype_bytes(m->k->act_dtype));
        double t0 = ts_now_ms();
        ts_model_forward(m, &a, 1.0f / (float)N, NULL);
        double t1 = ts_now_ms();
        ts_model_backward(m, &a, dx, sc, NULL, NULL);
        double t2 = ts_now_ms();
        if (t1 - t0 < *f_ms) *f_ms = t1 - t0;
        if (t2 - t1 < *b_ms) *b_ms = t2 - t1;
        total += t2 - t0;
        if ((rep == 0 && total > 2000.0) || (rep >= 1 && total > 1000.0)) break;
    }
    ts_acts_free(&a);
}

/* Bytes the measurement below allocates for model `m` (built for the embedding, block 0
 * and the head): its two flat buffers (ts_model_build allocates weights and gradients;
 * the AdamW moments belong to the optimizer, which the measurement does not run), the largest of the three layers' activations (the head's holds
 * the B*T x vocab_size logits), the backward scratch and x, dy, dx. */
static void measure_bytes(const ts_model *m, int B, int T, double *model_bytes,
                          double *other_bytes)
{
    size_t acts = 0;
    const int layers[3] = {0, m->n_layer > 0 ? 1 : 0, m->n_layers - 1};
    for (int i = 0; i < 3; i++) {
        size_t a = ts_acts_bytes(m, layers[i], layers[i] + 1, B, T);
        if (a > acts) acts = a;
    }
    *model_bytes = (8.0 + m->k->weight_copy_bytes) * (double)m->num_floats;
    *other_bytes = (double)acts + (double)ts_scratch_bytes(m, B, T) +
                   3.0 * B * T * (double)m->n_embd * (double)ts_dtype_bytes(m->k->act_dtype);
}

/* Whether `bytes` more fit this process (physical memory or its cgroup, and RLIMIT_AS),
 * keeping a tenth spare; *room gets what is left. */
static bool fits_in_memory(double bytes, double *room)
{
    ts_sysmem lim;
    ts_sysmem_read(&lim);
    double left = lim.physical - lim.rss_now, as_left = lim.address_space - lim.vm_now;
    if (as_left < left) left = as_left;
    *room = left > 0 ? left : 0;
    return bytes <= 0.9 * *room;
}

ts_status ts_layer_costs_measure(ts_layer_costs *c, const ts_model_config *mc, int micro_batch,
                                 const ts_kernels *k)
{
    if (!k) k = &ts_kernels_cpu;
    if (micro_batch < 1 || mc->n_layer < 0 || mc->seq_len < 1 || mc->n_embd < 1)
        return ts_fail("cannot profile layers: micro-batch %d, seq_len %d, n_embd %d",
                       micro_batch, mc->seq_len, mc->n_embd);
    {
        /* Allocation aborts (ts_alloc_floats), so refuse beforehand what cannot fit. */
        const int nl = mc->n_layer + 2;
        bool *own = ts_calloc((size_t)nl, sizeof(bool));
        own[0] = own[nl - 1] = true;
        if (mc->n_layer > 0) own[1] = true;
        ts_model layout;
        ts_model_layout(&layout, &(ts_model_spec){.arch = mc, .k = k, .owned = own});
        double model_b, other_b, room;
        measure_bytes(&layout, micro_batch, mc->seq_len, &model_b, &other_b);
        ts_model_free(&layout);
        free(own);
        if (!fits_in_memory(model_b + other_b, &room)) {
            char all[32], model[32], other[32], left[32];
            return ts_fail("cannot measure layer costs: timing the embedding, one block and the "
                           "head at micro-batch %d x %d tokens would allocate %s (their "
                           "weights, gradients and optimizer state %s; activations, "
                           "logits and buffers %s), more than the %s this process can use",
                           micro_batch, mc->seq_len,
                           ts_format_bytes(model_b + other_b, all, sizeof all),
                           ts_format_bytes(model_b, model, sizeof model),
                           ts_format_bytes(other_b, other, sizeof other),
                           ts_format_bytes(room, left, sizeof left));
        }
    }
    /* Start from the model's activation sizes (and its numbers for any layer kind the
     * model lacks, e.g. n_layer = 0), then overwrite with measured times. */
    ts_layer_costs_model(c, mc, micro_batch);
    c->source = TS_COST_MEASURED;

    const int n_layers = mc->n_layer + 2, B = micro_batch, T = mc->seq_len;
    bool *owned = ts_calloc((size_t)n_layers, sizeof(bool));
    owned[0] = owned[n_layers - 1] = true;
    if (mc->n_layer > 0) owned[1] = true;
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = mc, .k = k, .owned = owned});
    ts_model_init_random(&m, 1234);

    const size_t NC = (size_t)B * T * (size_t)mc->n_embd;
    uint64_t seed = 42;
    /* The layer inputs and output gradients: drawn on the host, copied to the device
     * (fp32) and converted there to the activation dtype. */
    const size_t AB = ts_dtype_bytes(k->act_dtype);
    float *host = ts_alloc_floats(NC);
    float *staged = k->dev_alloc(NC * sizeof(float));
    void *x = k->dev_alloc(NC * AB), *dy = k->dev_alloc(NC * AB), *dx = k->dev_alloc(NC * AB);
    fill_uniform(host, NC, &seed);
    k->memcpy_h2d(staged, host, NC * sizeof(float));
    k->convert(x, k->act_dtype, staged, TS_DTYPE_F32, NC);
    fill_uniform(host, NC, &seed);
    for (size_t i = 0; i < NC; i++) host[i] *= 1e-3f;
    k->memcpy_h2d(staged, host, NC * sizeof(float));
    k->convert(dy, k->act_dtype, staged, TS_DTYPE_F32, NC);
    k->dev_free(staged);
    free(host);
    ts_scratch sc;
    ts_scratch_init(&sc, &m, B, T);

    double f, b;
    time_layer(&m, 0, B, T, x, dy, dx, &sc, &seed, &f, &b);
    c->fwd_ms[0] = f;
    c->bwd_ms[0] = b;
    if (mc->n_layer > 0) {
        time_layer(&m, 1, B, T, x, dy, dx, &sc, &seed, &f, &b);
        for (int l = 1; l <= mc->n_layer; l++) {
            c->fwd_ms[l] = f;
            c->bwd_ms[l] = b;
        }
    }
    time_layer(&m, n_layers - 1, B, T, x, dy, dx, &sc, &seed, &f, &b);
    c->fwd_ms[n_layers - 1] = f;
    c->bwd_ms[n_layers - 1] = b;

    ts_scratch_free(&sc);
    k->dev_free(x);
    k->dev_free(dy);
    k->dev_free(dx);
    ts_model_free(&m);
    free(owned);
    return TS_OK;
}

/* -------------------------------------------------------------- balancing -- */

ts_status ts_partition_balance(const double *cost, int n_layers, int n_chunks, int *sizes)
{
    if (n_chunks < 1) return ts_fail("cannot cut layers into %d chunks", n_chunks);
    if (n_chunks > n_layers)
        return ts_fail("more pipeline chunks than layers: %d chunks but only %d layers "
                       "(every chunk needs at least one layer); lower parallel.pp or "
                       "parallel.virtual_stages",
                       n_chunks, n_layers);
    const int L = n_layers, K = n_chunks;
    double *S = ts_malloc((size_t)(L + 1) * sizeof *S);
    S[0] = 0.0;
    /* Costs that are not finite numbers (or whose sum overflows) leave nothing to
     * balance: then the layers are cut as evenly by count as they go (every cost 1), so
     * the function is total. Callers validate their inputs; this keeps a bad one from
     * reaching the assertion below. */
    bool finite = true;
    for (int l = 0; l < L; l++) {
        S[l + 1] = S[l] + (cost[l] > 0 ? cost[l] : 0.0);
        finite = finite && isfinite(S[l + 1]);
    }
    if (!finite)
        for (int l = 0; l < L; l++) S[l + 1] = (double)(l + 1);
    else if (S[L] > 1e150) /* squares of such sums overflow below: relative costs instead */
        for (int l = 0; l < L; l++) S[l + 1] /= S[L];

    /* best[k][j]: the smallest possible largest chunk when the first j layers form k
     * chunks. Row k only reads row k-1, so two rows suffice for phase 1. */
    double *prev = ts_malloc((size_t)(L + 1) * sizeof *prev);
    double *cur = ts_malloc((size_t)(L + 1) * sizeof *cur);
    for (int j = 0; j <= L; j++) prev[j] = j >= 1 ? S[j] : INFINITY;
    for (int k = 2; k <= K; k++) {
        for (int j = 0; j <= L; j++) {
            cur[j] = INFINITY;
            for (int i = k - 1; i < j; i++) {
                double v = fmax(prev[i], S[j] - S[i]);
                if (v < cur[j]) cur[j] = v;
            }
        }
        double *t = prev;
        prev = cur;
        cur = t;
    }
    const double bottleneck = prev[L];
    const double limit = bottleneck + 1e-12 * (fabs(bottleneck) + 1.0);

    /* Phase 2: among cuts whose every chunk is within the bottleneck, the least sum of
     * squared chunk costs (the most even); strict '<' keeps the earliest split. */
    double *ss = ts_malloc((size_t)(K + 1) * (size_t)(L + 1) * sizeof *ss);
    int *arg = ts_malloc((size_t)(K + 1) * (size_t)(L + 1) * sizeof *arg);
#define SS(k, j) ss[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
#define ARG(k, j) arg[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    for (int k = 0; k <= K; k++)
        for (int j = 0; j <= L; j++) SS(k, j) = INFINITY, ARG(k, j) = -1;
    SS(0, 0) = 0.0;
    for (int k = 1; k <= K; k++)
        for (int j = k; j <= L; j++)
            for (int i = k - 1; i < j; i++) {
                double s = S[j] - S[i];
                if (s > limit || SS(k - 1, i) == INFINITY) continue;
                double v = SS(k - 1, i) + s * s;
                if (v < SS(k, j)) SS(k, j) = v, ARG(k, j) = i;
            }
    TS_ASSERT(ARG(K, L) >= 0);
    for (int k = K, j = L; k >= 1; k--) {
        int i = ARG(k, j);
        sizes[k - 1] = j - i;
        j = i;
    }
#undef SS
#undef ARG
    free(S);
    free(prev);
    free(cur);
    free(ss);
    free(arg);
    return TS_OK;
}

/* ------------------------------------------------------------- partitions -- */

void ts_partition_free(ts_partition *p)
{
    free(p->first_layer);
    free(p->n_chunk_layers);
    free(p->chunk_fwd_ms);
    free(p->chunk_bwd_ms);
    free(p->chunk_act_bytes);
    ts_layer_costs_free(&p->costs);
    memset(p, 0, sizeof *p);
}

/* The explicit list, with one message per way it can be wrong. */
static ts_status check_explicit(const ts_parallel_config *pc, int n_chunks, int n_layers,
                                int n_layer)
{
    if (pc->n_partition != n_chunks)
        return ts_fail("parallel.partition lists %d chunks but parallel.pp * "
                       "parallel.virtual_stages = %d * %d = %d; give one layer count per chunk",
                       pc->n_partition, pc->pp, pc->virtual_stages, n_chunks);
    long long sum = 0;
    for (int c = 0; c < n_chunks; c++) {
        if (pc->partition[c] < 1)
            return ts_fail("parallel.partition: chunk %d has %d layers; every chunk needs at "
                           "least one layer (layers = embedding, %d blocks, head)",
                           c, pc->partition[c], n_layer);
        sum += pc->partition[c];
    }
    if (sum != n_layers)
        return ts_fail("parallel.partition sums to %lld layers but the model has "
                       "model.n_layer + 2 = %d (embedding, %d blocks, head)",
                       sum, n_layers, n_layer);
    return TS_OK;
}

ts_status ts_partition_from_costs(const ts_config *cfg, const ts_layer_costs *costs,
                                  ts_partition *p)
{
    memset(p, 0, sizeof *p);
    const ts_parallel_config *pc = &cfg->parallel;
    const int n_layer = cfg->model.n_layer, n_layers = n_layer + 2;
    const int n_chunks = pc->pp * pc->virtual_stages;
    if (costs->n_layers != n_layers)
        return ts_fail("layer costs for %d layers, but the model has %d", costs->n_layers,
                       n_layers);
    if (n_chunks < 1 || n_chunks > TS_MAX_CHUNKS)
        return ts_fail("parallel.pp * parallel.virtual_stages = %d chunks; it must be in "
                       "1..%d",
                       n_chunks, TS_MAX_CHUNKS);
    if (n_chunks > n_layers)
        return ts_fail("more pipeline chunks than layers: parallel.pp * "
                       "parallel.virtual_stages = %d * %d = %d chunks, but the model has only "
                       "model.n_layer + 2 = %d layers (embedding, %d blocks, head); lower pp "
                       "or virtual_stages",
                       pc->pp, pc->virtual_stages, n_chunks, n_layers, n_layer);

    int *sizes = ts_malloc((size_t)n_chunks * sizeof *sizes);
    if (pc->n_partition > 0) {
        if (check_explicit(pc, n_chunks, n_layers, n_layer) != TS_OK) {
            free(sizes);
            return TS_ERR;
        }
        memcpy(sizes, pc->partition, (size_t)n_chunks * sizeof *sizes);
    } else {
        double *w = ts_malloc((size_t)n_layers * sizeof *w);
        for (int l = 0; l < n_layers; l++) w[l] = costs->fwd_ms[l] + costs->bwd_ms[l];
        ts_status st = ts_partition_balance(w, n_layers, n_chunks, sizes);
        free(w);
        if (st != TS_OK) {
            free(sizes);
            return TS_ERR;
        }
    }

    p->pp = pc->pp;
    p->v = pc->virtual_stages;
    p->n_chunks = n_chunks;
    p->n_layers = n_layers;
    p->n_layer = n_layer;
    p->balanced = pc->n_partition == 0;
    p->first_layer = ts_malloc((size_t)n_chunks * sizeof(int));
    p->n_chunk_layers = sizes;
    p->chunk_fwd_ms = ts_calloc((size_t)n_chunks, sizeof(double));
    p->chunk_bwd_ms = ts_calloc((size_t)n_chunks, sizeof(double));
    p->chunk_act_bytes = ts_calloc((size_t)n_chunks, sizeof(double));
    ts_layer_costs_copy(&p->costs, costs);
    /* A chunk after the first also holds the input it received (layers.c reads it in
     * backward; the engine keeps it until then). */
    const double input_bytes = 4.0 * pc->micro_batch * cfg->model.seq_len * cfg->model.n_embd;
    for (int c = 0, l = 0; c < n_chunks; c++) {
        p->first_layer[c] = l;
        for (int i = 0; i < sizes[c]; i++, l++) {
            p->chunk_fwd_ms[c] += costs->fwd_ms[l];
            p->chunk_bwd_ms[c] += costs->bwd_ms[l];
            p->chunk_act_bytes[c] += costs->act_bytes[l];
        }
        if (c > 0) p->chunk_act_bytes[c] += input_bytes;
    }
    return TS_OK;
}

ts_status ts_partition_build(const ts_config *cfg, bool measure, ts_partition *p)
{
    memset(p, 0, sizeof *p);
    ts_layer_costs costs;
    if (measure) {
        /* What cannot be measured (it would not fit in memory) is modelled, with a word. */
        if (ts_layer_costs_measure(&costs, &cfg->model, cfg->parallel.micro_batch, NULL) !=
            TS_OK) {
            ts_log_warn("partition: %s; using modelled layer costs instead", ts_error_message());
            ts_layer_costs_model(&costs, &cfg->model, cfg->parallel.micro_batch);
        }
    } else {
        ts_layer_costs_model(&costs, &cfg->model, cfg->parallel.micro_batch);
    }
    ts_status st = ts_partition_from_costs(cfg, &costs, p);
    ts_layer_costs_free(&costs);
    return st;
}

int ts_partition_chunk_of(const ts_partition *p, int layer)
{
    for (int c = 0; c < p->n_chunks; c++)
        if (layer >= p->first_layer[c] && layer < p->first_layer[c] + p->n_chunk_layers[c])
            return c;
    return -1;
}

void ts_partition_owned(const ts_partition *p, const int *chunk_rank, int pp_rank, bool *owned)
{
    for (int l = 0; l < p->n_layers; l++) owned[l] = false;
    for (int c = 0; c < p->n_chunks; c++)
        if (chunk_rank[c] == pp_rank)
            for (int i = 0; i < p->n_chunk_layers[c]; i++) owned[p->first_layer[c] + i] = true;
}

const char *ts_partition_range_name(int first, int count, int n_layer, char *buf, size_t size)
{
    const int last = first + count - 1, head = n_layer + 1;
    int b0 = first < 1 ? 1 : first, b1 = last > n_layer ? n_layer : last;
    size_t at = 0;
    buf[0] = '\0';
#define APPEND(...)                                                                    \
    do {                                                                               \
        if (at < size) {                                                               \
            int w = snprintf(buf + at, size - at, __VA_ARGS__);                        \
            at += w > 0 ? (size_t)w : 0;                                               \
        }                                                                              \
    } while (0)
    if (first <= 0) APPEND("embed");
    if (b0 <= b1) {
        APPEND("%sh.%d", at ? "+" : "", b0 - 1);
        if (b1 > b0) APPEND("-h.%d", b1 - 1);
    }
    if (last >= head) APPEND("%shead", at ? "+" : "");
#undef APPEND
    return buf;
}

char *ts_partition_describe(const ts_partition *p, const int *chunk_rank)
{
    double total = 0.0;
    for (int c = 0; c < p->n_chunks; c++) total += p->chunk_fwd_ms[c] + p->chunk_bwd_ms[c];
    size_t cap = 256 + (size_t)p->n_chunks * 160, at = 0;
    char *s = ts_malloc(cap);
    at += (size_t)snprintf(s, cap, "partition: %s (%s layer costs), %d chunk%s on pp=%d rank%s\n",
                           p->balanced ? "balanced" : "explicit list",
                           p->costs.source == TS_COST_MEASURED ? "measured" : "modelled",
                           p->n_chunks, p->n_chunks == 1 ? "" : "s", p->pp,
                           p->pp == 1 ? "" : "s");
    for (int c = 0; c < p->n_chunks; c++) {
        char name[64], layers[32];
        int f = p->first_layer[c], n = p->n_chunk_layers[c];
        ts_partition_range_name(f, n, p->n_layer, name, sizeof name);
        if (n == 1)
            snprintf(layers, sizeof layers, "layer %d", f);
        else
            snprintf(layers, sizeof layers, "layers %d-%d", f, f + n - 1);
        double share = total > 0 ? 100.0 * (p->chunk_fwd_ms[c] + p->chunk_bwd_ms[c]) / total : 0;
        at += (size_t)snprintf(s + at, cap - at,
                               "  chunk %-3d rank %-3d %-13s %-20s fwd %9.3f ms  bwd %9.3f ms  "
                               "%5.1f%%\n",
                               c, chunk_rank[c], layers, name, p->chunk_fwd_ms[c],
                               p->chunk_bwd_ms[c], share);
        if (at >= cap) at = cap - 1;
    }
    return s;
}
