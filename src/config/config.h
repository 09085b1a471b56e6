/* The run's configuration: a libconfig file (docs/CONTRACT.md "Config") plus `--set`
 * overrides, validated into a plain struct. Every problem is found here, before any
 * collective, identically on every rank. */
#ifndef TS_CONFIG_H
#define TS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"

#define TS_PATH_MAX 1024
#define TS_MAX_SHARDS 64
#define TS_MAX_CHUNKS 1024

typedef struct {
    char arch[16];              /* "gpt2" | "llama" (docs/CONTRACT.md "Model") */
    int n_layer, n_head, n_embd;
    int vocab_size, seq_len;
    int n_kv_head;              /* key/value heads (GQA); n_head for gpt2 and multi-head */
    int head_dim;               /* channels per attention head; 0 = n_embd / n_head (llama
                                 * may set another: Qwen3-MoE's 128 at n_embd 2048, 32 heads) */
    int ffn_hidden;             /* MLP hidden width: 4*n_embd (gpt2), SwiGLU's (llama) */
    double norm_eps;            /* LayerNorm (gpt2, fixed 1e-5) / RMSNorm (llama) epsilon */
    int tie_embeddings;         /* LM head = token embedding: 1 yes, -1 no, 0 the
                                 * architecture's (gpt2: tied; llama: untied); ts_model_tied */
    /* Rotary embeddings (llama; 0 for gpt2): base, and Llama 3.1's frequency scaling
     * (rope_scaling = factor, 0 = none; the low/high frequency factors and the original
     * context it was trained on). */
    double rope_theta;
    double rope_scaling, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_context;
    char init[TS_PATH_MAX];     /* "" = random init from train.seed; else safetensors */
    /* model.init holds a dense Llama's weights and this MoE config starts from them:
     * every routed expert a copy of the dense MLP, the router initialised by index from
     * train.seed, the rest by name (checkpoint/upcycle.h; config_moe.c's rules). */
    bool init_upcycle;
    /* The text encoding the token ids are in: "" (none: bytes at vocab_size 256, bare
     * ids otherwise), "gpt2" or "llama3" (src/tokenizer/tokenizer.h), and its ranks file
     * ("" = the encoding's default path). tokenizer_sha256 is no key: the sha256 of the
     * ranks file, filled in when the trainer opens it (or read from a checkpoint), and
     * recorded in state.json so that a resume and `tessera sample` use the same ranks. */
    char tokenizer[16];
    char tokenizer_file[TS_PATH_MAX];
    char tokenizer_sha256[72];
    /* Mixture of Experts (llama family; docs/CONTRACT.md "Model", model/moe.h): block l
     * is an MoE block iff moe_experts > 0, l >= moe_first_dense and (l + 1) % moe_every
     * == 0 (ts_model_block_is_moe); its MLP is a router over moe_experts SwiGLU experts
     * of width moe_ffn_hidden, moe_top_k of them per token, plus moe_shared_experts
     * always-applied ones (one dense SwiGLU of width moe_shared_experts * moe_ffn_hidden).
     * moe_router: "softmax" (Mixtral, Qwen3-MoE) or "sigmoid" (DeepSeek-V3) scores;
     * moe_norm_topk renormalises the k weights, then times moe_route_scale; moe_groups
     * and moe_topk_groups: group-limited selection (DeepSeek-V3). */
    int moe_experts, moe_top_k, moe_ffn_hidden, moe_shared_experts;
    char moe_router[16];
    bool moe_norm_topk;
    double moe_route_scale;
    int moe_groups, moe_topk_groups, moe_first_dense, moe_every;
    /* moe_capacity: 0 dropless; > 0 the capacity factor, each expert taking at most
     * ceil(seq_len * moe_top_k / moe_experts * factor) assignments of each sequence, the
     * lowest-weight ones dropped (model/moe.c). */
    double moe_capacity;
    bool qk_norm;               /* Qwen3: per-head RMSNorm of q and k before RoPE */
    /* Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; llama family; on when
     * kv_lora_rank > 0; model/mla.c): q from a q_lora_rank latent (RMSNorm'd; 0 = a plain
     * q projection), k and v from a kv_lora_rank latent (RMSNorm'd), each q and k head
     * qk_nope_head_dim channels without RoPE then qk_rope_head_dim with it (the rope key
     * one head shared by all), values of v_head_dim channels. head_dim and n_kv_head are
     * then not used (n_kv_head = n_head). */
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* rope_scaling's kind when rope_scaling (the factor) > 0: "llama3" (Llama 3.1's
     * frequency bands, the default) or "yarn" (DeepSeek-V3's YaRN: beta_fast, beta_slow,
     * the original context rope_original_context, and mscale / mscale_all_dim, which
     * scale the softmax by (0.1 mscale_all_dim ln(factor) + 1)^2 and cos/sin by the
     * ratio of the two mscales, as transformers does). */
    char rope_type[16];
    double rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim;
    /* Multi-token prediction (DeepSeek-V3 sec. 2.2): mtp_layers sequential modules after
     * the last block (0 = none), each predicting one token further; train.mtp_loss weighs
     * their mean loss. */
    int mtp_layers;
} ts_model_config;

/* model.tokenizer's values ("", "gpt2", "llama3"): an error naming them otherwise (for
 * a name read from elsewhere than a config file: a checkpoint's state.json). */
ts_status ts_config_check_tokenizer_name(const char *name);

/* The architecture of a model config: the layer list is the same (embedding, blocks,
 * head); the blocks and the head differ (model/model.h). */
typedef enum { TS_ARCH_GPT2, TS_ARCH_LLAMA } ts_arch;
static inline ts_arch ts_model_arch(const ts_model_config *m)
{
    return m->arch[0] == 'l' ? TS_ARCH_LLAMA : TS_ARCH_GPT2;
}
/* The defaults an architecture brings (applied after ts_config_defaults when model.arch
 * names it, before the file's and --set's keys are read): llama unties the LM head and
 * sets rope_theta 500000 (Llama 3), RMSNorm eps 1e-5 (its LM head is untied by
 * ts_model_tied's default). */
void ts_config_arch_defaults(ts_model_config *m, const char *arch);
/* After loading: n_kv_head 0 -> n_head; ffn_hidden 0 -> the architecture's default
 * (gpt2: 4*n_embd; llama: Meta's 2/3 of 4*n_embd rounded up to a multiple of 256). */
void ts_config_resolve_model(ts_model_config *m);
/* n_kv_head and ffn_hidden as resolved (also for a config built in code, which may
 * leave them 0). */
static inline int ts_model_kv_heads(const ts_model_config *m)
{
    return m->n_kv_head > 0 ? m->n_kv_head : m->n_head;
}
/* The channels of one attention head: head_dim, or n_embd / n_head when unset. */
static inline bool ts_model_is_mla(const ts_model_config *m) { return m->kv_lora_rank > 0; }
static inline int ts_model_head_dim(const ts_model_config *m)
{
    return m->head_dim > 0 ? m->head_dim : (m->n_head > 0 ? m->n_embd / m->n_head : 0);
}
static inline bool ts_model_tied(const ts_model_config *m)
{
    return m->tie_embeddings > 0 || (m->tie_embeddings == 0 && ts_model_arch(m) == TS_ARCH_GPT2);
}
/* The head's layer reads the token embedding: tied, or multi-token prediction's modules
 * (model/mtp.c) embed their shifted tokens. A pipeline's last stage then holds a copy of
 * it, or the embedding's chunk stays resident beside the head's (ZeRO-2/3, V schedules). */
static inline bool ts_model_head_reads_embedding(const ts_model_config *m)
{
    return ts_model_tied(m) || m->mtp_layers > 0;
}
static inline int ts_model_ffn(const ts_model_config *m)
{
    if (m->ffn_hidden > 0) return m->ffn_hidden;
    /* In 64 bits: a checkpoint's state.json is read before it is validated, so n_embd may
     * be anything there (the range check then refuses what does not fit an int). */
    long long f = 4LL * m->n_embd;
    if (ts_model_arch(m) == TS_ARCH_LLAMA) f = (2LL * 4 * m->n_embd / 3 + 255) / 256 * 256;
    return f > 0x7fffffff ? 0x7fffffff : (int)f;
}
/* Does the MoE model have Mixtral's form (softmax router, renormalised top-k, every block
 * MoE, no shared experts, groups or scale, no qk_norm)? Its experts then carry Mixtral's
 * Hugging Face names (block_sparse_moe.gate, experts.{j}.w1|w3|w2) and its config.json is
 * a MixtralForCausalLM's; other MoE models carry Qwen3-MoE's and DeepSeek's (mlp.gate,
 * mlp.experts.{j}.gate_proj|up_proj|down_proj, mlp.shared_experts.*): model/model.h. */
static inline bool ts_model_moe_mixtral(const ts_model_config *m)
{
    return m->moe_experts > 0 && !m->qk_norm && strcmp(m->moe_router, "softmax") == 0 &&
           m->moe_norm_topk && m->moe_shared_experts == 0 && m->moe_groups == 1 &&
           m->moe_route_scale == 1.0 && m->moe_first_dense == 0 && m->moe_every == 1;
}
/* Is block l (0-based) an MoE block (MOE keys above)? */
static inline bool ts_model_block_is_moe(const ts_model_config *m, int l)
{
    return m->moe_experts > 0 && l >= m->moe_first_dense && m->moe_every > 0 &&
           (l + 1) % m->moe_every == 0;
}

typedef struct {
    int pp, dp, tp;
    int cp;                     /* context parallelism: each sequence split over cp ranks
                                   (tensor/cp.h); world = pp * dp * cp * tp */
    int virtual_stages;
    char schedule[TS_PATH_MAX]; /* ts_schedule_names[k] (config/pipeline_names.h) or a CSV path */
    int micro_batch;            /* sequences per micro-batch per replica */
    int n_partition;            /* 0 = "balanced"; else layer counts per chunk */
    int partition[TS_MAX_CHUNKS];
    char recompute[16];         /* ts_recompute_names[k] (config/pipeline_names.h; validated) */
    int memory_budget_mb;       /* MiB each rank may allocate (its estimate less the BLAS
                                   buffers); 0 = what the machine offers the rank. Bounds
                                   the memory check and recompute = "auto"'s choice */
    char order[24];             /* "tp-cp-dp-pp", fastest-varying first */
    bool sequence_parallel;     /* norms and residuals split along the sequence over tp
                                   (tensor/tp.h); needs tp > 1 and seq_len % tp == 0 */
    int tp_overlap;             /* sub-batches per micro-batch inside the tp layers, each
                                   one's collectives behind the next one's GEMMs (Merak;
                                   tensor/tp.h); 1 = off */
    bool overlap_grad_sync;
    char grad_sync_progress[16]; /* "poll" | "thread": how the overlapped reduction advances */
    int zero;                   /* 0 .. 3: ZeRO level (data/zero.h) */
    int bucket_mb;              /* data-parallel gradient bucket size in MiB */
    char comm[8];               /* data plane of the dp/pp/tp groups: "auto" | "mpi" | "nccl" */
    int ep, etp;                /* expert parallelism (ranks splitting the experts) and
                                   expert tensor parallelism: not built yet, both 1 */
    bool ep_overlap;            /* the ep exchange non-blocking behind the MoE layer's
                                   independent compute (and a DualPipe pair's partner);
                                   false: blocking. The same bits either way */
} ts_parallel_config;

typedef struct {
    int global_batch, steps;
    char batch_rampup[512];     /* "" = off; "THRESHOLD:BATCH ..." (config/batch_rampup.h) */
    int64_t seed;
    double lr, min_lr;
    int warmup;
    char lr_schedule[16];       /* after the warm-up: "cosine" | "linear" | "constant" |
                                 * "wsd" (warmup-stable-decay); ts_lr_schedule below */
    int lr_decay_steps;         /* the schedule's length in steps; 0 = train.steps */
    int decay_steps;            /* wsd: steps of the final (linear) decay to min_lr, or */
    double decay_fraction;      /* wsd: that as a fraction of the schedule's length */
    bool allow_schedule_change; /* a resumed run may change the checkpoint's schedule */
    double weight_decay, beta1, beta2, eps, grad_clip;
    int threads;                /* 0 = the cores this rank owns */
    int timeout_s;              /* watchdog: abort after this long without progress; 0 = off */
    char device[16];            /* the compute device: "cpu", "cpu-strict" (tests), "cuda"
                                 * where built (kernels.h ts_kernels_for) */
    char precision[8];          /* "fp32" | "bf16" (GEMMs in bf16; train.device "cuda") */
    char attention[16];         /* the CUDA attention kernel: "gemm" (batched GEMMs, a
                                 * [B,NH,T,T] score buffer) | "flash" (the flash-style
                                 * kernel, one log-sum-exp per row; train.device "cuda") */
    char on_nonfinite[8];       /* a step whose loss or gradient norm is not finite:
                                 * "stop" the run (default) or "skip" its update; either
                                 * way the update is not applied */
    double skip_spikes;         /* the spike guard (train/spike_guard.h): a step whose loss
                                 * or gradient norm is more than this many standard
                                 * deviations above its window is not applied; 0 = off */
    int spike_window;           /* that window: the last N steps (llm.c's 128) */
    /* MoE load balancing (model.moe_experts > 0; MOE_DESIGN's normalisations, which any
     * grid and micro-batch split share): the sequence-wise balance loss's coefficient,
     * the router z-loss's, and the aux-loss-free bias's update rate (0: no bias). */
    double moe_aux_loss, moe_z_loss, moe_bias_rate;
    /* Multi-token prediction's weight lambda: the loss adds lambda / D * the sum of the
     * D depths' losses (model.mtp_layers = D). */
    double mtp_loss;
    /* The optimizer (optim/muon.h; docs/CONTRACT.md "Optimizer"): "adamw" for every
     * parameter, or "muon": Muon on every 2-D matrix inside the blocks (and MTP modules),
     * AdamW (beta1, beta2, eps above) on the rest. Muon's momentum, Nesterov on/off, its
     * Newton-Schulz steps (0: the coefficient set's own count, 5 or 10), the coefficient
     * set ("torch" | "quintic" | "deepseek_v4") and the update scale ("match_rms_adamw" |
     * "original"); allow_optimizer_change lets a resumed run switch optimizer. */
    char optimizer[8];
    double muon_momentum;
    bool muon_nesterov;
    int muon_ns_steps;
    char muon_coefficients[16];
    char muon_scale[16];
    bool allow_optimizer_change;
} ts_train_config;

/* data.train: paths or glob patterns, grouped into the datasets of a blend. A plain
 * string or list of strings is one dataset; a list of groups { path = ...; weight = w; }
 * is a blend of one dataset per group. */
#define TS_MAX_DATA_SETS 16
typedef struct {
    int n_train;                          /* patterns over all datasets */
    char train[TS_MAX_SHARDS][TS_PATH_MAX];
    int train_set[TS_MAX_SHARDS];         /* the dataset of pattern i (0 .. n_sets-1) */
    int n_sets;                           /* datasets: 1 unless a blend */
    bool blend;                           /* written as a list of groups */
    double weight[TS_MAX_DATA_SETS];      /* each dataset's weight as given (> 0) */
    int n_val;                            /* 0 = no validation */
    char val[TS_MAX_SHARDS][TS_PATH_MAX]; /* paths or glob patterns, read as one stream */
    int eval_every;             /* validation every N steps (0 = never) */
    char hellaswag[TS_PATH_MAX]; /* HellaSwag JSONL scored every eval_every steps ("" = off) */
    int hellaswag_items;        /* its first N items (0 = all) */
    int val_windows;            /* validation windows averaged per evaluation */
    bool shuffle;               /* each epoch of each dataset in a seeded order */
    bool document_mask;         /* packed documents: attention within each document, positions
                                 * restarting at each (docs/ARCHITECTURE.md "Packed documents") */
    int document_token;         /* the id that starts a document; -1: model.tokenizer's
                                 * (ts_config_document_token) */
    int64_t seed;               /* the shuffle's seed (default: train.seed) */
} ts_data_config;

typedef struct {
    char dir[TS_PATH_MAX];
    int every, keep;
    char load[TS_PATH_MAX];     /* "" | "latest" | a directory */
    double file_gb;             /* model weights split into files of at most this (10^9 bytes) */
    bool async;                 /* write in a thread while training goes on */
    bool overwrite;             /* a fresh run may save (and prune) where another run's
                                 * checkpoints are (checkpoint/claim.h) */
} ts_checkpoint_config;

typedef struct {
    char metrics[TS_PATH_MAX];  /* JSON Lines; "" = none */
    char trace[TS_PATH_MAX];    /* Chrome trace JSON; "" = none */
    bool progress;              /* stderr progress lines */
    int moe_every;              /* MoE: a metrics line of each MoE block's tokens per expert
                                   every this many steps and after the last; 0 = after
                                   the last step only */
    char tensorboard[TS_PATH_MAX]; /* TensorBoard event files in this directory (rank 0);
                                      "" = none */
    int straggler_every;        /* a straggler report on stderr every this many steps; 0 = none */
    double straggler_threshold; /* a rank whose compute time relative to the median (median /
                                   its own) is below this is named a straggler */
} ts_log_config;

typedef struct {
    ts_model_config model;
    ts_parallel_config parallel;
    ts_train_config train;
    ts_data_config data;
    ts_checkpoint_config checkpoint;
    ts_log_config log;
} ts_config;

/* Fill every key with its default (docs/CONTRACT.md "Config"). */
void ts_config_defaults(ts_config *cfg);
/* The id that starts a document under data.document_mask: data.document_token, or with
 * -1 model.tokenizer's document token (tokenizer/tokenizer.h ts_tokenizer_doc_token:
 * gpt2 50256, llama3 128000); -1 when neither gives one (bare ids; validation refuses
 * that with document_mask on). */
int ts_config_document_token(const ts_config *cfg);

/* Read `path` (libconfig), apply `n_overrides` strings "dotted.key=value" (value parsed
 * as libconfig parses one; a bare word is a string), validate every key, and fill
 * `cfg`. On error returns TS_ERR with a message naming the key (and file:line where
 * libconfig gives one) and how to fix it. `world_size` <= 0 skips the grid-size
 * check (for `tessera plan`). */
ts_status ts_config_load(ts_config *cfg, const char *path, const char *const *overrides,
                         int n_overrides, int world_size);

/* ts_config_load without a file for a program that sets keys itself (`tessera eval`: the
 * checkpoint's model): the defaults, the overrides, then patch(cfg, ctx) before the
 * config is resolved and validated (the overrides alone count as given). */
typedef void (*ts_config_patch_fn)(ts_config *cfg, void *ctx);
ts_status ts_config_load_patched(ts_config *cfg, const char *const *overrides, int n_overrides,
                                 int world_size, ts_config_patch_fn patch, void *ctx);

/* ts_config_load for `tessera plan` (no ranks launched: world_size 0), which sizes and
 * times a run without starting one: train.device = "cuda" is accepted by a build without
 * the CUDA backend too, as the planner lays a CUDA run out with the CUDA tables' sizes
 * in every build (kernels.h ts_kernels_layout_for). Every other key is checked as
 * ts_config_load checks it. */
ts_status ts_config_load_plan(ts_config *cfg, const char *path, const char *const *overrides,
                              int n_overrides);

/* Validate relations between keys (batch rule, divisibility, grid); called by
 * ts_config_load, exposed for tests and for programs that build a config in code. */
ts_status ts_config_validate(const ts_config *cfg, int world_size);

/* Number of micro-batches per replica per step: global_batch / (dp * micro_batch). */
int ts_config_num_microbatches(const ts_config *cfg);

/* train.optimizer = "muon" (config_muon.c), and the Newton-Schulz steps it runs:
 * train.muon_ns_steps, or 0's meaning, the coefficient set's own count (5 for "torch"
 * and "quintic", 10 for "deepseek_v4"). */
bool ts_config_muon(const ts_train_config *t);
int ts_config_muon_ns_steps(const ts_train_config *t);

/* The learning-rate schedule the train keys describe, resolved (config/lr_schedule.c):
 * after `warmup` steps of a linear ramp to lr, `name` ("cosine", "linear", "constant",
 * "wsd") from lr to min_lr over the schedule's `length` steps (train.lr_decay_steps,
 * or train.steps), wsd holding lr until its last `decay` steps. The trainer resolves it
 * once and takes each step's rate from ts_lr_schedule_at; a checkpoint records it, so a
 * resumed run can be held to it. */
typedef struct {
    char name[16];
    double lr, min_lr;
    int warmup, length, decay;
} ts_lr_schedule;
void ts_lr_schedule_of(const ts_train_config *t, ts_lr_schedule *s);
/* The learning rate at 0-based step `step`. */
double ts_lr_schedule_at(const ts_lr_schedule *s, int step);
/* The same at a fractional step `pos` (train.batch_rampup: the samples consumed before
 * the step over train.global_batch, Megatron's sample-counted schedule). */
double ts_lr_schedule_at_pos(const ts_lr_schedule *s, double pos);
/* The first step in [from, to) at which a and b give different learning rates, or -1:
 * two schedules that agree on every step a run will take are the same to it (a
 * constant rate stretched over another length, say). */
int ts_lr_schedule_diverges(const ts_lr_schedule *a, const ts_lr_schedule *b, int from, int to);
/* "cosine from 0.0006 to 6e-05 over 200 steps (10 of warm-up)" into buf. */
const char *ts_lr_schedule_describe(const ts_lr_schedule *s, char *buf, size_t size);

/* Serialise the effective config as a JSON object string (malloc'd; caller frees). */
char *ts_config_to_json(const ts_config *cfg);

#endif
