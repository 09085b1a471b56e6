/* GPT-2 (nanoGPT semantics) as an ordered list of layers:
 *   layer 0            embedding   (transformer.wte, transformer.wpe)
 *   layers 1..n_layer  blocks      (transformer.h.{i}.*)
 *   layer n_layer+1    head        (transformer.ln_f, LM head tied to wte, loss)
 * A rank builds the model for the layers it owns (all of them on one rank; a range
 * per pipeline chunk later). Parameters, gradients and AdamW moments live in four flat
 * buffers laid out layer by layer; a ts_param is a view with its logical name and
 * shape, which is all that initialisation, clipping and checkpoints need. */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "core/error.h"
#include "kernels/kernels.h"

typedef enum { TS_LAYER_EMBED, TS_LAYER_BLOCK, TS_LAYER_HEAD } ts_layer_kind;

typedef enum {
    TS_INIT_NORMAL, /* normal(0, init_std) */
    TS_INIT_ZEROS,
    TS_INIT_ONES,
} ts_init_kind;

/* A parameter is a view into the flat buffers plus its shard spec: which slice of
 * which logical (unsharded, nanoGPT-named) tensor this rank holds. The logical tensor
 * may be viewed with a leading group axis: c_attn's [3C, C] is [3, C, C] (q, k, v), and
 * split on its middle axis, so a tensor-parallel rank holds whole heads of each. */
typedef struct {
    char name[96];          /* logical nanoGPT name, e.g. "transformer.h.0.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2];       /* logical shape */
    int64_t local[2];       /* the shape this rank holds */
    int split_axis;         /* -1: replicated over tp; 0: rows; 1: columns */
    int groups;             /* leading view axis: 3 for c_attn (q, k, v), else 1 */
    int parts, part;        /* split into `parts` slices (tp); this rank holds `part` */
    size_t offset, numel;   /* view into the flat buffers; numel is the local count */
    int layer;              /* owning layer index */
    bool decay;             /* weight decay applies (2-D tensors) */
    bool tied_copy;         /* a second copy of a tied tensor (counted once in norms) */
    ts_init_kind init;
    float init_std;
} ts_param;

typedef struct {
    ts_layer_kind kind;
    int block;              /* block index for TS_LAYER_BLOCK, else -1 */
    bool owned;             /* this rank holds the layer */
    int first_param, n_params;
} ts_layer;

/* Indices of a block's parameters relative to its first_param, in nanoGPT order. */
enum {
    TS_B_LN1_W, TS_B_LN1_B, TS_B_QKV_W, TS_B_QKV_B, TS_B_ATTPROJ_W, TS_B_ATTPROJ_B,
    TS_B_LN2_W, TS_B_LN2_B, TS_B_FC_W, TS_B_FC_B, TS_B_FCPROJ_W, TS_B_FCPROJ_B,
    TS_B_NPARAMS
};

typedef struct {
    int n_layer, n_head, n_embd, vocab_size, max_seq_len;

    /* Tensor parallelism: this rank holds n_head/tp heads, 4C/tp MLP columns and
     * vocab_size/tp vocabulary rows (from vocab_start). tp == 1: the whole model. */
    int tp, tp_rank;
    const struct ts_comm_s *tp_comm; /* NULL when tp == 1 */
    int local_heads, local_vocab, vocab_start;

    int n_layers;           /* n_layer + 2 */
    ts_layer *layers;
    int n_params;
    ts_param *params;
    int wte_param;          /* index of the embedding layer's wte, or -1 */
    int head_wte_param;     /* index of the wte the head uses (== wte_param when tied locally) */

    size_t num_floats;      /* floats in each flat buffer */
    float *param_mem, *grad_mem, *m_mem, *v_mem;

    const ts_kernels *k;
} ts_model;

/* Build the layer and parameter lists for the owned layers (owned == NULL: all) and
 * allocate the flat buffers (zeroed). */
void ts_model_build(ts_model *m, const ts_model_config *cfg, const bool *owned,
                    const ts_kernels *k);
/* The same for tensor-parallel rank tp_rank of tp (tp_comm: the tp group, used by the
 * layers' collectives; may be NULL when tp == 1). */
void ts_model_build_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                       const ts_kernels *k, int tp, int tp_rank, const struct ts_comm_s *tp_comm);

/* The same layout (layers, parameters, shard specs, num_floats) without allocating or
 * initialising the flat buffers: what a rank would hold, for the memory estimate. */
void ts_model_layout_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                        const ts_kernels *k, int tp, int tp_rank, const struct ts_comm_s *tp_comm);

/* Logical flat index of local element i of parameter p (its shard spec). */
size_t ts_param_logical_index(const ts_param *p, size_t i);
void ts_model_free(ts_model *m);

static inline float *ts_param_data(const ts_model *m, int p) { return m->param_mem + m->params[p].offset; }
static inline float *ts_param_grad(const ts_model *m, int p) { return m->grad_mem + m->params[p].offset; }

/* Initialise every owned parameter by index from `seed` (CONTRACT.md "Model"). */
void ts_model_init_random(ts_model *m, uint64_t seed);

/* Initialise from a safetensors file of nanoGPT-named F32 weights; every name, shape and
 * dtype is checked against the model, with a clear error. */
ts_status ts_model_init_from_file(ts_model *m, const char *path);

/* Total logical parameters of the model (tied wte counted once). */
size_t ts_model_logical_params(const ts_model_config *cfg);

/* ---- activations of one micro-batch through a contiguous range of layers ---- */
typedef struct {
    int l0, l1;             /* layers [l0, l1) */
    int B, T;
    int *tokens, *targets;  /* [B*T], owned */
    const float *input;     /* [B*T, C] chunk input when l0 > 0 (not owned) */
    float *mem;             /* all layers' saved activations, owned */
    size_t *layer_off;      /* per layer in [l0,l1): offset into mem */
    size_t floats;
    float *wstash;          /* matmul output gradients between the I and W passes */
} ts_acts;

void ts_acts_init(ts_acts *a, const ts_model *m, int l0, int l1, int B, int T);
/* Floats ts_acts_init allocates for layers [l0, l1), and the zero-bubble stash that
 * lives from a chunk's input-gradient pass to its weight-gradient pass. */
size_t ts_acts_floats(const ts_model *m, int l0, int l1, int B, int T);
size_t ts_acts_stash_floats(const ts_model *m, int l0, int l1, int B, int T);
void ts_acts_free(ts_acts *a);

/* Output [B*T, C] of layer l (valid after forward; not for the head). */
float *ts_acts_output(const ts_model *m, const ts_acts *a, int l);

/* Per-token losses [B*T] of the last forward (the range must end with the head). */
const float *ts_acts_losses(const ts_model *m, const ts_acts *a);

/* Scratch for the backward of one layer at a time (shared by all micro-batches). */
typedef struct {
    float *mem;
    size_t floats;
} ts_scratch;
void ts_scratch_init(ts_scratch *s, const ts_model *m, int B, int T);
size_t ts_scratch_floats(const ts_model *m, int B, int T);
void ts_scratch_free(ts_scratch *s);

/* Forward through layers [a->l0, a->l1). When the range contains the head, the loss
 * is computed with weight `dloss` per target (1 / targets in the global batch), the
 * head's input gradient is prepared, and the sum of per-token losses is returned in
 * *loss_sum (in double). */
void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_sum);

/* Backward through layers [a->l1 - 1 .. a->l0]. `dx` [B*T, C]: on entry the gradient of
 * the range's output (ignored when the range ends with the head), on exit the
 * gradient of its input (unused when the range starts with the embedding).
 * Parameter gradients accumulate into m->grad_mem. After each layer, layer_done(ctx,
 * layer) is called when given (the data-parallel sync starts buckets from it). */
/* Zero-bubble split of the backward (same contract for dx as ts_model_backward):
 * the input-gradient pass computes dx and the cheap parameter gradients (biases,
 * LayerNorm) and keeps the output gradients of the large matmuls in a stash owned by
 * `a`; the weight-gradient pass then adds the matmul weight gradients (and the
 * embedding's) and frees the stash. Together they equal ts_model_backward. */
void ts_model_backward_input(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s);
void ts_model_backward_weight(const ts_model *m, ts_acts *a);

typedef void (*ts_layer_done_fn)(void *ctx, int layer);
void ts_model_backward(const ts_model *m, ts_acts *a, float *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx);

#endif
