/* A checkpoint's file layout, a function of the model config and checkpoint.file_gb
 * only: the logical tensors in the model's order, which file each lies in and at which
 * byte offset, and each file's header. Every rank computes the same layout, so each can
 * write its own slices into files it did not create (checkpoint.h). */
#ifndef TS_CKPT_LAYOUT_H
#define TS_CKPT_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "config/config.h"
#include "tensor/shard.h"

typedef enum { TS_CK_WEIGHT, TS_CK_EXP_AVG, TS_CK_EXP_AVG_SQ, TS_CK_KINDS } ts_ckpt_kind;

#define TS_CKPT_NAME_MAX (TS_SHARD_NAME_MAX + 16)

/* One stored tensor: a parameter's weights or its optimizer state. TS_CK_EXP_AVG is a
 * parameter's first state tensor: AdamW's exp_avg, or, for a Muon matrix of a Muon
 * checkpoint (train.optimizer = "muon"; optim/muon.h ts_param_is_muon), its momentum
 * "momentum_buffer.<name>" (torch.optim.Muon's state key); TS_CK_EXP_AVG_SQ its second,
 * AdamW's exp_avg_sq, which a Muon matrix does not have: that entry is absent (file -1,
 * bytes 0, in no file, header or checksum list). */
typedef struct {
    char name[TS_CKPT_NAME_MAX]; /* "transformer.h.0.ln_1.weight", "exp_avg.transformer..." */
    int logical;                 /* index into ts_ckpt_layout.logical */
    ts_ckpt_kind kind;
    int file;                    /* index into ts_ckpt_layout.files; -1: absent */
    uint64_t offset;             /* absolute byte offset of its data in the file */
    uint64_t bytes;
} ts_ckpt_entry;

typedef struct {
    char name[64];               /* "model.safetensors", "model-00001-of-00003.safetensors" */
    uint64_t header_bytes;       /* 8 + the JSON header: where the data starts */
    uint64_t size;               /* the whole file */
    char *header;                /* the header_bytes bytes, owned */
} ts_ckpt_fileinfo;

typedef struct {
    int n_logical;               /* the parameters */
    /* State saved as weights only, after the parameters in the last model file: an MLA
     * model's (DeepseekV3ForCausalLM's) MoE blocks' balancing biases, fp32 [moe_experts]
     * each under transformers' name model.layers.L.mlp.gate.e_score_correction_bias, so
     * from_pretrained routes as the run did (state.json's moe_bias keeps the bits a
     * resume restores; model.init reads these). state_block[i]: the block of state
     * tensor i. */
    int n_state;
    int *state_block;
    ts_shard_spec *logical;      /* whole tensors (name, shape): the parameters in the
                                  * model's order, then the n_state state tensors */
    bool *muon;                  /* [n_logical] a Muon matrix whose state is its momentum
                                  * (all false for an AdamW checkpoint) */
    int n_entries;               /* TS_CK_KINDS * n_logical + n_state: entry
                                  * kind*n_logical + logical, then state tensor i's weight
                                  * at TS_CK_KINDS*n_logical + i */
    ts_ckpt_entry *entries;
    int n_files, n_model_files;  /* the model files first, then optimizer.safetensors */
    ts_ckpt_fileinfo *files;
} ts_ckpt_layout;

/* The layout of a checkpoint of model mc; muon: written by a train.optimizer = "muon" run
 * (its Muon matrices hold momentum_buffer instead of exp_avg and exp_avg_sq). */
void ts_ckpt_layout_build(ts_ckpt_layout *L, const ts_model_config *mc, double file_gb,
                          bool muon);
void ts_ckpt_layout_free(ts_ckpt_layout *L);

/* Whether entry E is stored (a Muon matrix has no exp_avg_sq). */
static inline bool ts_ckpt_entry_stored(const ts_ckpt_entry *E) { return E->file >= 0; }

/* The logical index of tensor `name` (a parameter or a state tensor), or -1. */
int ts_ckpt_layout_find(const ts_ckpt_layout *L, const char *name);
static inline const ts_ckpt_entry *ts_ckpt_entry_of(const ts_ckpt_layout *L, ts_ckpt_kind kind,
                                                    int logical)
{
    return &L->entries[(int)kind * L->n_logical + logical];
}

/* The name of MoE block `block`'s balancing bias (DeepSeek-V3's, transformers' name). */
void ts_ckpt_moe_bias_name(char *buf, size_t cap, int block);

/* The step of a checkpoint directory's name "step_NNNNNNNN" (the last component of
 * `path`), or -1 when it is not one. */
long ts_ckpt_step_of_name(const char *path);

/* The steps of root's step_NNNNNNNN directories, newest first, into *steps (malloc'ed;
 * free it); with `complete`, only those holding state.json (a finished save). Returns
 * their count, or -1 when root cannot be read. */
long ts_ckpt_list_steps(const char *root, bool complete, long **steps);

/* model.safetensors.index.json (Hugging Face's sharded-checkpoint index) when the
 * weights span several files; malloc'ed text. */
char *ts_ckpt_index_json(const ts_ckpt_layout *L);

/* config.json of a llama checkpoint, the Hugging Face config that
 * transformers.LlamaConfig.from_pretrained reads (so LlamaForCausalLM.from_pretrained
 * loads the step directory: its tensors already have Hugging Face's names and layout):
 * architectures, model_type, the sizes, rms_norm_eps, rope_theta, rope_scaling (Llama
 * 3.1's "llama3" scaling or null), tie_word_embeddings, torch_dtype "float32"; for an MoE
 * or qk_norm model MixtralForCausalLM's, Qwen3MoeForCausalLM's or Qwen3ForCausalLM's keys
 * (NULL for an MoE model none of them expresses, and for YaRN without MLA: its
 * rope_scaling object is Llama 3.1's); for a multi-head latent attention model
 * DeepseekV3ForCausalLM's (hf_deepseek.c ts_ckpt_hf_config_deepseek: model_type
 * "deepseek_v3", every key config_hf_deepseek.c reads; NULL where that class would
 * compute another model: a softmax router, moe_every > 1, a capacity, no shared expert, groups ranked by
 * other than their top 2). NULL for gpt2, whose tensors are nanoGPT's (transformers' GPT-2 stores them transposed).
 * ts_ckpt_hf_config gives the object (a new reference), ts_ckpt_hf_config_json the text
 * (malloc'ed). */
json_t *ts_ckpt_hf_config(const ts_model_config *mc);
json_t *ts_ckpt_hf_config_deepseek(const ts_model_config *mc);
char *ts_ckpt_hf_config_json(const ts_model_config *mc);

#endif
