/* The checkpoint layout (layout.h): tensors from the model's own parameter list (one
 * rank, tp = 1, every layer: the logical tensors in the model's order), files filled in
 * that order, headers as safetensors writes them; under Muon a Muon matrix's one state
 * tensor (momentum_buffer) in its exp_avg's place. */
#include "checkpoint/layout.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/muon.h"
#include "tensor/tp.h"

static const char *const KIND_PREFIX[TS_CK_KINDS] = {"", "exp_avg.", "exp_avg_sq."};

/* The safetensors header of file f: 8-byte little-endian length, then the JSON (offsets
 * relative to the data start), padded with spaces to a multiple of 8 as the reference
 * writer does, so the data stays aligned. */
static void build_header(ts_ckpt_layout *L, int f, uint64_t data_bytes)
{
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (int e = 0; e < L->n_entries; e++) {
        const ts_ckpt_entry *E = &L->entries[e];
        if (E->file != f) continue;
        const ts_shard_spec *s = &L->logical[E->logical];
        json_t *shape = json_array();
        for (int d = 0; d < s->ndim; d++) json_array_append_new(shape, json_integer(s->shape[d]));
        /* E->offset is relative to the data start until the header is known. */
        json_object_set_new(root, E->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)E->offset,
                                      (json_int_t)(E->offset + E->bytes)));
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    TS_ASSERT(text != NULL);
    json_decref(root);
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    ts_ckpt_fileinfo *F = &L->files[f];
    F->header_bytes = 8 + padded;
    F->header = ts_malloc(F->header_bytes);
    for (int i = 0; i < 8; i++) F->header[i] = (char)((padded >> (8 * i)) & 0xff);
    memcpy(F->header + 8, text, n);
    memset(F->header + 8 + n, ' ', padded - n);
    F->size = F->header_bytes + data_bytes;
    free(text);
}

void ts_ckpt_moe_bias_name(char *buf, size_t cap, int block)
{
    snprintf(buf, cap, "model.layers.%d.mlp.gate.e_score_correction_bias", block);
}

/* The state tensors (layout.h n_state) of config mc: their count; with `spec`, each one's
 * whole-tensor spec and (in `block`) its MoE block. Only where transformers' class holds
 * them: an MLA model, whose config.json is DeepseekV3ForCausalLM's (hf_deepseek.c). The
 * multi-token prediction modules' blocks (n_layer + k - 1, DeepSeek's layer 61) count as
 * blocks: their MoE biases are DeepSeek's checkpoint tensors too. */
static int state_tensors(const ts_model_config *mc, ts_shard_spec *spec, int *block)
{
    if (!ts_model_is_mla(mc) || mc->moe_experts <= 0) return 0;
    int n = 0;
    for (int l = 0; l < mc->n_layer + mc->mtp_layers; l++) {
        if (!ts_model_block_is_moe(mc, l)) continue;
        if (spec) {
            char name[TS_SHARD_NAME_MAX];
            ts_ckpt_moe_bias_name(name, sizeof name, l);
            const int64_t shape[1] = {mc->moe_experts};
            ts_shard_init(&spec[n], name, 1, shape, -1, 1, 1, 0);
            block[n] = l;
        }
        n++;
    }
    return n;
}

void ts_ckpt_layout_build(ts_ckpt_layout *L, const ts_model_config *mc, double file_gb,
                          bool muon)
{
    memset(L, 0, sizeof *L);
    ts_model m;
    ts_model_layout(&m, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu});
    L->n_logical = m.n_params;
    L->n_state = state_tensors(mc, NULL, NULL);
    L->logical = ts_calloc((size_t)m.n_params + (size_t)L->n_state, sizeof *L->logical);
    L->muon = ts_calloc((size_t)m.n_params + 1, sizeof *L->muon);
    for (int p = 0; p < m.n_params; p++) {
        L->logical[p] = m.params[p].shard;
        L->muon[p] = muon && ts_param_is_muon(&m, p);
    }
    ts_model_free(&m);
    L->state_block = ts_calloc((size_t)L->n_state + 1, sizeof *L->state_block);
    state_tensors(mc, L->logical + L->n_logical, L->state_block);

    L->n_entries = TS_CK_KINDS * L->n_logical + L->n_state;
    L->entries = ts_calloc((size_t)L->n_entries, sizeof *L->entries);
    /* Weights fill model files of at most file_gb * 10^9 data bytes (Hugging Face's
     * "5GB" is 5 * 10^9), a tensor never split; the moments go to one optimizer file. */
    const double limit = file_gb * 1e9;
    int n_model = 1;
    uint64_t used = 0;
    uint64_t *data_bytes = ts_calloc((size_t)L->n_logical + 2, sizeof *data_bytes);
    for (int k = 0; k < TS_CK_KINDS; k++) {
        if (k == TS_CK_EXP_AVG) used = 0;
        for (int p = 0; p < L->n_logical; p++) {
            ts_ckpt_entry *E = &L->entries[k * L->n_logical + p];
            E->logical = p;
            E->kind = (ts_ckpt_kind)k;
            if (k != TS_CK_WEIGHT && L->muon[p]) {
                /* A Muon matrix's one state tensor, its momentum; no second moment. */
                if (k == TS_CK_EXP_AVG_SQ) {
                    snprintf(E->name, sizeof E->name, "%s%s", KIND_PREFIX[k], L->logical[p].name);
                    E->file = -1;
                    continue;
                }
                snprintf(E->name, sizeof E->name, "momentum_buffer.%s", L->logical[p].name);
            } else {
                snprintf(E->name, sizeof E->name, "%s%s", KIND_PREFIX[k], L->logical[p].name);
            }
            E->bytes = ts_shard_logical_numel(&L->logical[p]) * sizeof(float);
            if (k == TS_CK_WEIGHT) {
                if (used > 0 && (double)(used + E->bytes) > limit) {
                    data_bytes[n_model - 1] = used;
                    n_model++;
                    used = 0;
                }
                E->file = n_model - 1;
            } else {
                E->file = n_model; /* the optimizer file, after the model files */
            }
            E->offset = used;
            used += E->bytes;
        }
        if (k == TS_CK_WEIGHT) {
            /* the state tensors: small, after the parameters in the last model file */
            for (int i = 0; i < L->n_state; i++) {
                ts_ckpt_entry *E = &L->entries[TS_CK_KINDS * L->n_logical + i];
                snprintf(E->name, sizeof E->name, "%s", L->logical[L->n_logical + i].name);
                E->logical = L->n_logical + i;
                E->kind = TS_CK_WEIGHT;
                E->bytes = ts_shard_logical_numel(&L->logical[E->logical]) * sizeof(float);
                E->file = n_model - 1;
                E->offset = used;
                used += E->bytes;
            }
            data_bytes[n_model - 1] = used;
        }
    }
    data_bytes[n_model] = used;

    L->n_model_files = n_model;
    L->n_files = n_model + 1;
    L->files = ts_calloc((size_t)L->n_files, sizeof *L->files);
    for (int f = 0; f < L->n_files; f++) {
        ts_ckpt_fileinfo *F = &L->files[f];
        if (f == n_model)
            snprintf(F->name, sizeof F->name, "optimizer.safetensors");
        else if (n_model == 1)
            snprintf(F->name, sizeof F->name, "model.safetensors");
        else
            snprintf(F->name, sizeof F->name, "model-%05d-of-%05d.safetensors", f + 1, n_model);
        build_header(L, f, data_bytes[f]);
    }
    /* Offsets become absolute once each file's header length is known. */
    for (int e = 0; e < L->n_entries; e++)
        if (ts_ckpt_entry_stored(&L->entries[e]))
            L->entries[e].offset += L->files[L->entries[e].file].header_bytes;
    free(data_bytes);
}

void ts_ckpt_layout_free(ts_ckpt_layout *L)
{
    for (int f = 0; f < L->n_files; f++) free(L->files[f].header);
    free(L->files);
    free(L->entries);
    free(L->logical);
    free(L->state_block);
    free(L->muon);
    memset(L, 0, sizeof *L);
}

int ts_ckpt_layout_find(const ts_ckpt_layout *L, const char *name)
{
    for (int p = 0; p < L->n_logical + L->n_state; p++)
        if (strcmp(L->logical[p].name, name) == 0) return p;
    return -1;
}

char *ts_ckpt_index_json(const ts_ckpt_layout *L)
{
    uint64_t total = 0;
    json_t *map = json_object();
    for (int p = 0; p < L->n_logical + L->n_state; p++) {
        const ts_ckpt_entry *E = p < L->n_logical ? ts_ckpt_entry_of(L, TS_CK_WEIGHT, p)
                                                  : &L->entries[TS_CK_KINDS * L->n_logical +
                                                                (p - L->n_logical)];
        total += E->bytes;
        json_object_set_new(map, E->name, json_string(L->files[E->file].name));
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", map);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    TS_ASSERT(text != NULL);
    json_decref(root);
    return text;
}

/* Qwen3-MoE's config expresses a softmax router with top-k (renormalised or not), MoE
 * blocks every decoder_sparse_step blocks but those of mlp_only_layers, and q/k norms;
 * not shared experts, sigmoid scores, groups or a route scale. */
static bool qwen3_moe_expresses(const ts_model_config *mc)
{
    return mc->qk_norm && strcmp(mc->moe_router, "softmax") == 0 && mc->moe_shared_experts == 0 &&
           mc->moe_groups == 1 && mc->moe_route_scale == 1.0;
}

/* The family's keys over the Llama ones: Mixtral (ts_model_moe_mixtral), Qwen3-MoE, dense
 * Qwen3 (qk_norm). */
static void hf_family(json_t *root, const ts_model_config *mc)
{
    const char *arch = NULL, *type = NULL;
    if (ts_model_moe_mixtral(mc)) {
        arch = "MixtralForCausalLM", type = "mixtral";
        json_object_set_new(root, "num_local_experts", json_integer(mc->moe_experts));
        json_object_set_new(root, "num_experts_per_tok", json_integer(mc->moe_top_k));
        json_object_set_new(root, "intermediate_size", json_integer(mc->moe_ffn_hidden));
        json_object_set_new(root, "sliding_window", json_null());
        json_object_set_new(root, "router_aux_loss_coef", json_real(0.0));
        json_object_set_new(root, "output_router_logits", json_false());
    } else if (mc->moe_experts > 0) {
        arch = "Qwen3MoeForCausalLM", type = "qwen3_moe";
        json_object_set_new(root, "num_experts", json_integer(mc->moe_experts));
        json_object_set_new(root, "num_experts_per_tok", json_integer(mc->moe_top_k));
        json_object_set_new(root, "moe_intermediate_size", json_integer(mc->moe_ffn_hidden));
        json_object_set_new(root, "norm_topk_prob", json_boolean(mc->moe_norm_topk));
        json_object_set_new(root, "decoder_sparse_step", json_integer(mc->moe_every));
        json_t *dense = json_array();
        for (int l = 0; l < mc->moe_first_dense && l < mc->n_layer; l++)
            json_array_append_new(dense, json_integer(l));
        json_object_set_new(root, "mlp_only_layers", dense);
        json_object_set_new(root, "use_sliding_window", json_false());
        json_object_set_new(root, "router_aux_loss_coef", json_real(0.0));
        json_object_set_new(root, "output_router_logits", json_false());
    } else if (mc->qk_norm) {
        arch = "Qwen3ForCausalLM", type = "qwen3";
        json_object_set_new(root, "use_sliding_window", json_false());
    }
    if (!arch) return;
    json_object_set_new(root, "architectures", json_pack("[s]", arch));
    json_object_set_new(root, "model_type", json_string(type));
    json_object_del(root, "mlp_bias"); /* Llama's only */
}

json_t *ts_ckpt_hf_config(const ts_model_config *mc)
{
    if (ts_model_arch(mc) != TS_ARCH_LLAMA) return NULL;
    if (ts_model_is_mla(mc)) return ts_ckpt_hf_config_deepseek(mc); /* hf_deepseek.c */
    /* An MoE model no transformers class has (shared experts, sigmoid scores, groups, a
     * route scale, or no q/k norms in a non-Mixtral shape): its weights carry DeepSeek's
     * names, but no config.json is written. */
    if (mc->moe_experts > 0 && !ts_model_moe_mixtral(mc) && !qwen3_moe_expresses(mc))
        return NULL;
    /* YaRN without MLA: the rope_scaling below is Llama 3.1's, which would describe
     * another model, and model.init's llama reader refuses YaRN's; no config.json. */
    if (mc->rope_scaling != 0.0 && strcmp(mc->rope_type, "yarn") == 0) return NULL;
    json_t *scaling = json_null();
    if (mc->rope_scaling != 0.0)
        scaling = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                            mc->rope_scaling, "low_freq_factor", mc->rope_low_freq_factor,
                            "high_freq_factor", mc->rope_high_freq_factor,
                            "original_max_position_embeddings", mc->rope_original_context);
    json_t *root = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:b, s:s, s:b, "
        "s:b, s:f, s:s}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", mc->n_embd,
        "intermediate_size", ts_model_ffn(mc), "num_hidden_layers", mc->n_layer,
        "num_attention_heads", mc->n_head, "num_key_value_heads", ts_model_kv_heads(mc),
        "head_dim", ts_model_head_dim(mc), "vocab_size", mc->vocab_size,
        "max_position_embeddings", mc->seq_len, "rms_norm_eps", mc->norm_eps, "rope_theta",
        mc->rope_theta, "rope_scaling", scaling, "tie_word_embeddings", (int)ts_model_tied(mc),
        "hidden_act", "silu", "attention_bias", 0, "mlp_bias", 0, "attention_dropout", 0.0,
        "torch_dtype", "float32");
    TS_ASSERT(root != NULL);
    hf_family(root, mc);
    return root;
}

char *ts_ckpt_hf_config_json(const ts_model_config *mc)
{
    json_t *root = ts_ckpt_hf_config(mc);
    if (!root) return NULL;
    /* Reals as people write them (1e-05, not 1.0000000000000001e-05) where 15 digits
     * read back exactly, else 17, which always do. */
    const size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER;
    char *text = json_dumps(root, flags | JSON_REAL_PRECISION(15));
    TS_ASSERT(text != NULL);
    json_t *back = json_loads(text, 0, NULL);
    if (!json_equal(back, root)) {
        free(text);
        text = json_dumps(root, flags | JSON_REAL_PRECISION(17));
        TS_ASSERT(text != NULL);
    }
    json_decref(back);
    json_decref(root);
    return text;
}

long ts_ckpt_step_of_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "step_", 5) != 0 || strlen(base) != 13) return -1;
    long v = 0;
    for (int i = 5; i < 13; i++) {
        if (base[i] < '0' || base[i] > '9') return -1;
        v = v * 10 + (base[i] - '0');
    }
    return v;
}

static int newest_first(const void *a, const void *b)
{
    const long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

long ts_ckpt_list_steps(const char *root, bool complete, long **steps)
{
    *steps = NULL;
    DIR *d = opendir(root);
    if (!d) return -1;
    size_t n = 0, cap = 0;
    struct dirent *e;
    char state[TS_PATH_MAX + 300];
    struct stat sb;
    while ((e = readdir(d)) != NULL) {
        const long s = ts_ckpt_step_of_name(e->d_name);
        if (s < 0) continue;
        snprintf(state, sizeof state, "%s/%s/state.json", root, e->d_name);
        if (complete && stat(state, &sb) != 0) continue;
        *steps = ts_grow(*steps, &cap, n, sizeof **steps);
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n > 1) qsort(*steps, n, sizeof **steps, newest_first);
    return (long)n;
}
