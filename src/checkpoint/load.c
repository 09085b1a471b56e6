/* model.init: a rank's parameters from logical tensors in safetensors files (one file,
 * or a Hugging Face save_pretrained directory, sharded or not), read run by run through
 * the parameters' shard specs (load.h). */
#include "checkpoint/load.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/upcycle.h"
#include "core/fsutil.h"
#include "tensor/shard.h"

#define INDEX_NAME "model.safetensors.index.json"

/* ------------------------------------------------------------ the files -- */

/* The safetensors files of a model.init, and where each tensor lies. */
typedef struct {
    int n;
    ts_st_file *f;
} init_files;

static void files_close(init_files *s)
{
    for (int i = 0; i < s->n; i++) ts_st_close(&s->f[i]);
    free(s->f);
    memset(s, 0, sizeof *s);
}

static ts_status files_add(init_files *s, const char *path)
{
    s->f = realloc(s->f, (size_t)(s->n + 1) * sizeof *s->f);
    if (!s->f) ts_out_of_memory((size_t)(s->n + 1) * sizeof *s->f, "the list of model.init's files");
    if (ts_st_open(&s->f[s->n], path) != TS_OK) return TS_ERR;
    s->n++;
    return TS_OK;
}

static const ts_st_tensor *files_find(const init_files *s, const char *name, int *file)
{
    for (int i = 0; i < s->n; i++) {
        const ts_st_tensor *t = ts_st_find(&s->f[i], name);
        if (t) {
            *file = i;
            return t;
        }
    }
    return NULL;
}

/* Hugging Face's sharded weights: the index's weight_map names, for every tensor, the
 * file (beside the index) that holds it. Every file it names is opened, and the index
 * and the files must agree exactly: each mapped tensor in its file, each file's tensor
 * mapped to that file (so no tensor is in two files). */
static ts_status open_index(init_files *s, const char *index)
{
    FILE *fp = ts_fopen_input(index);
    if (!fp) return ts_fail("cannot open %s: %s", index, strerror(errno));
    if (ts_check_input(fileno(fp), index, "weight index", "a Hugging Face " INDEX_NAME,
                       1ull << 28) != TS_OK) {
        fclose(fp);
        return TS_ERR;
    }
    json_error_t jerr;
    json_t *root = json_loadf(fp, 0, &jerr);
    fclose(fp);
    if (!root) return ts_fail("%s is not valid JSON: %s (line %d)", index, jerr.text, jerr.line);
    json_t *map = json_object_get(root, "weight_map");
    ts_status st = TS_OK;
    if (!json_is_object(map) || json_object_size(map) == 0)
        st = ts_fail("%s has no \"weight_map\" object naming each tensor's file", index);
    char dir[TS_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (st != TS_OK) break;
        const char *file = json_string_value(v);
        if (!file || !file[0] || strchr(file, '/') || file[0] == '.') {
            st = ts_fail("%s: the weight_map entry of '%s' is not the name of a file beside "
                         "the index",
                         index, name);
            break;
        }
        bool have = false;
        for (int i = 0; i < s->n && !have; i++) {
            const char *b = strrchr(s->f[i].path, '/');
            have = strcmp(b ? b + 1 : s->f[i].path, file) == 0;
        }
        char path[TS_PATH_MAX + 256];
        snprintf(path, sizeof path, "%s%s", dir, file);
        if (!have) st = files_add(s, path);
        int at = -1;
        const ts_st_tensor *t = st == TS_OK ? files_find(s, name, &at) : NULL;
        const char *b = t ? strrchr(s->f[at].path, '/') : NULL;
        if (st == TS_OK && (!t || strcmp(b ? b + 1 : s->f[at].path, file) != 0))
            st = ts_fail("%s maps tensor '%s' to %s, which does not hold it; the index and "
                         "its files do not belong together",
                         index, name, file);
    }
    for (int i = 0; st == TS_OK && i < s->n; i++)
        for (int t = 0; st == TS_OK && t < s->f[i].n_tensors; t++) {
            const char *tn = s->f[i].tensors[t].name;
            const char *file = json_string_value(json_object_get(map, tn));
            const char *b = strrchr(s->f[i].path, '/');
            if (!file || strcmp(file, b ? b + 1 : s->f[i].path) != 0)
                st = ts_fail("%s holds tensor '%s', which %s maps %s%s; the index and its "
                             "files do not belong together",
                             s->f[i].path, tn, index, file ? "to " : "to no file",
                             file ? file : "");
        }
    json_decref(root);
    return st;
}

/* A safetensors file, a directory holding model.safetensors or the index of sharded
 * weights (what save_pretrained writes, and a Tessera step directory), or an index. */
static ts_status files_open(init_files *s, const char *path)
{
    memset(s, 0, sizeof *s);
    struct stat sb;
    ts_status st;
    char file[TS_PATH_MAX + 64];
    const size_t n = strlen(path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/" INDEX_NAME, path);
        if (stat(file, &sb) == 0) {
            st = open_index(s, file);
        } else {
            snprintf(file, sizeof file, "%s/model.safetensors", path);
            if (stat(file, &sb) == 0)
                st = files_add(s, file);
            else
                st = ts_fail("%s is a directory with neither model.safetensors nor " INDEX_NAME
                             " (what Hugging Face's save_pretrained writes); give the "
                             "weights' file or such a directory",
                             path);
        }
    } else if (n >= 5 && strcmp(path + n - 5, ".json") == 0) {
        st = open_index(s, path);
    } else {
        st = files_add(s, path);
    }
    if (st != TS_OK) files_close(s);
    return st;
}

/* ------------------------------------------------------------- the names -- */

/* The layer a tensor name belongs to, in either architecture's names (gpt2's nanoGPT
 * ones, llama's Hugging Face ones): 0 the embedding, 1 + i block i, n_layer + 1 the
 * head (and multi-token prediction's modules, model.layers.{n_layer + k - 1}, k <= D,
 * which the head's layer holds: model.h); -1 for none. */
static int layer_of_name(const char *name, const ts_model *m)
{
    const int n_layer = m->n_layer;
    int blk = -1, used = 0;
    if ((sscanf(name, "transformer.h.%d.%n", &blk, &used) == 1 && used > 0) ||
        (sscanf(name, "model.layers.%d.%n", &blk, &used) == 1 && used > 0)) {
        if (blk >= n_layer && blk < n_layer + m->mtp_layers) return n_layer + 1;
        return blk >= 0 && blk < n_layer ? blk + 1 : -1;
    }
    if (!strcmp(name, "transformer.wte.weight") || !strcmp(name, "transformer.wpe.weight") ||
        !strcmp(name, "model.embed_tokens.weight"))
        return 0;
    if (!strncmp(name, "transformer.ln_f.", 17) || !strcmp(name, "model.norm.weight") ||
        !strcmp(name, "lm_head.weight"))
        return n_layer + 1;
    return -1;
}

/* The layer entry of a block tensor's name: layer_of_name's, or an MTP module's own
 * entry (model.h; its block's moe flag), -1 for none. */
static int block_entry_of_name(const char *name, const ts_model *m)
{
    int blk = -1, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &blk, &used) == 1 && used > 0 && blk >= m->n_layer &&
        blk < ts_model_blocks(m))
        return ts_model_block_layer(m, blk);
    return layer_of_name(name, m);
}

/* The global expert id of a routed expert's tensor name ("model.layers.L.mlp.experts.J."
 * of Qwen3-MoE and DeepSeek, "model.layers.L.block_sparse_moe.experts.J." of Mixtral;
 * not the shared experts'), or -1 for any other name. */
static long expert_of_name(const char *name)
{
    int blk = -1, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &blk, &used) != 1 || used == 0) return -1;
    const char *e = strstr(name + used, ".experts.");
    if (!e) return -1;
    char *end;
    const long j = strtol(e + 9, &end, 10);
    return end > e + 9 && *end == '.' && j >= 0 ? j : -1;
}

static int param_index(const ts_model *m, const char *name)
{
    for (int p = 0; p < m->n_params; p++)
        if (!strcmp(ts_param_name(m, p), name)) return p;
    return -1;
}

static const char *arch_name(const ts_model *m)
{
    return m->arch == TS_ARCH_LLAMA ? "llama" : "gpt2";
}

/* ------------------------------------------------------------ the values -- */

/* IEEE half to float: exact (every half is a float). */
static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* Inf, NaN */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else {
        float v = (float)man * 0x1p-24f; /* zero or subnormal: man * 2^-24, exact */
        memcpy(&u, &v, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Elements [logical, logical + len) of tensor t as fp32 into dst: F32 as it is, BF16
 * widened (its bits are a float's top half: exact), F16 converted (exact). */
static ts_status read_floats(const ts_st_file *f, const ts_st_tensor *t, size_t logical,
                             float *dst, size_t len)
{
    if (t->dtype == TS_DT_F32) return ts_st_read(f, t, logical * sizeof(float), dst, len * sizeof(float));
    enum { PIECE = 1 << 20 };
    uint16_t *buf = ts_malloc((len < PIECE ? (len ? len : 1) : PIECE) * sizeof *buf);
    ts_status st = TS_OK;
    for (size_t at = 0; at < len && st == TS_OK; at += PIECE) {
        const size_t n = len - at < PIECE ? len - at : PIECE;
        st = ts_st_read(f, t, (logical + at) * 2, buf, n * 2);
        for (size_t i = 0; st == TS_OK && i < n; i++) {
            if (t->dtype == TS_DT_BF16) {
                const uint32_t u = (uint32_t)buf[i] << 16;
                memcpy(&dst[at + i], &u, sizeof u);
            } else {
                dst[at + i] = half_to_float(buf[i]);
            }
        }
    }
    free(buf);
    return st;
}

/* Read this rank's part of parameter P from the logical tensor t: one read per run. */
static ts_status read_param_part(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                                 float *dst)
{
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, 0, P->numel); ts_shard_next(&it, &r);)
        if (read_floats(f, t, r.logical, dst + r.local, r.len) != TS_OK) return TS_ERR;
    return TS_OK;
}

/* Non-finite weights would only show as a NaN loss at step 0, blamed on the learning
 * rate: name the tensor and the first bad element (its index in the logical tensor). */
static ts_status check_finite(const ts_param *P, const char *name, const float *w)
{
    const ts_shard_spec *s = &P->shard;
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(s, 0, P->numel); ts_shard_next(&it, &r);) {
        for (size_t j = 0; j < r.len; j++) {
            const float v = w[r.local + j];
            if (isfinite(v)) continue;
            const size_t at = r.logical + j;
            char where[96] = "", shape[64];
            if (s->ndim > 1)
                snprintf(where, sizeof where, " (row %zu, column %zu)", at / (size_t)s->shape[1],
                         at % (size_t)s->shape[1]);
            return ts_fail("tensor '%s' %s holds %s at element %zu%s; the file is damaged or "
                           "was saved from a run that diverged",
                           name, ts_st_shape_str(shape, sizeof shape, s->ndim, s->shape),
                           isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", at, where);
        }
    }
    return TS_OK;
}

/* Tensor t must have P's logical shape and a floating-point dtype fp32 holds exactly. */
static ts_status check_tensor(const ts_st_tensor *t, const ts_param *P)
{
    const ts_shard_spec *s = &P->shard;
    bool shape = t->ndim == s->ndim;
    for (int d = 0; shape && d < s->ndim; d++) shape = t->shape[d] == s->shape[d];
    const bool dtype = t->dtype == TS_DT_F32 || t->dtype == TS_DT_BF16 || t->dtype == TS_DT_F16;
    if (shape && dtype) return TS_OK;
    char got[256], want[256];
    ts_st_shape_str(got, sizeof got, t->ndim, t->shape);
    ts_st_shape_str(want, sizeof want, s->ndim, s->shape);
    if (!shape)
        return ts_fail("tensor '%s' has shape %s %s, expected %s (F32, or BF16 or F16 widened "
                       "to F32) for this config",
                       t->name, got, ts_st_dtype_name(t->dtype), want);
    return ts_fail("tensor '%s' %s is %s, expected F32 (or BF16 or F16, widened to F32 on "
                   "load)",
                   t->name, got, ts_st_dtype_name(t->dtype));
}

/* Parameter P from tensor t: dtype and shape, this rank's part into host memory
 * `host` as fp32, finite values. The message names the file. */
static ts_status load_param(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                            float *host)
{
    if (check_tensor(t, P) != TS_OK) return ts_error_prefix("%s: ", f->path);
    if (read_param_part(f, t, P, host) != TS_OK) return TS_ERR; /* names the file */
    if (check_finite(P, t->name, host) != TS_OK) return ts_error_prefix("%s: ", f->path);
    return TS_OK;
}

/* ------------------------------------------------------------ model.init -- */

/* The name of MoE block i's balancing bias (DeepSeek-V3's; model.h moe_bias). */
static void moe_bias_name(char *buf, size_t cap, int block)
{
    snprintf(buf, cap, "model.layers.%d.mlp.gate.e_score_correction_bias", block);
}

static bool is_moe_bias(const ts_model *m, const char *name)
{
    const int layer = block_entry_of_name(name, m);
    if (layer < 0 || !m->layers[layer].moe) return false;
    char want[96];
    moe_bias_name(want, sizeof want, m->layers[layer].block);
    return strcmp(name, want) == 0;
}

/* The MoE blocks' balancing biases the files hold (absent: zero, as a fresh model's),
 * fp32 [E] each, into the model's state: not parameters, but what the routing selects
 * with (a DeepSeek-V3 checkpoint's trained bias). */
static ts_status load_moe_bias(ts_model *m, const init_files *s)
{
    const int E = m->moe_experts;
    for (int l = 0; l < m->n_layers + m->mtp_layers && E > 0; l++) { /* MTP's too */
        if (!m->layers[l].moe || !m->layers[l].owned) continue;
        char name[96];
        moe_bias_name(name, sizeof name, m->layers[l].block);
        int f = -1;
        const ts_st_tensor *t = files_find(s, name, &f);
        if (!t) continue;
        if (t->dtype != TS_DT_F32 || t->ndim != 1 || t->shape[0] != E ||
            t->end - t->begin != (uint64_t)E * sizeof(float))
            return ts_fail("%s: tensor '%s' must be F32 of shape [%d] (model.moe_experts)",
                           s->f[f].path, name, E);
        float *host = ts_alloc_floats((size_t)E);
        ts_status st = ts_st_read(&s->f[f], t, 0, host, (size_t)E * sizeof(float));
        for (int e = 0; st == TS_OK && e < E; e++)
            if (!isfinite(host[e]))
                st = ts_fail("%s: tensor '%s' element %d is not finite", s->f[f].path, name, e);
        if (st == TS_OK)
            m->k->memcpy_h2d(m->moe_bias + (size_t)m->layers[l].block * E, host,
                             (size_t)E * sizeof(float));
        free(host);
        if (st != TS_OK) return TS_ERR;
    }
    return TS_OK;
}

/* The files' experts per MoE block must be the config's model.moe_experts: every rank
 * sees every name, so every rank gives the same verdict (under expert parallelism a
 * rank reads only its own experts, and would miss a count that differs elsewhere). The
 * count is one more than the largest expert id of any block; a file set without
 * experts for an MoE config, or with them for a dense one, is named as such. Upcycling
 * reads a dense model's: a file set with experts is refused. */
static ts_status check_expert_count(const ts_model *m, const init_files *s, const char *path,
                                    bool upcycle)
{
    long most = -1;
    const char *example = NULL;
    for (int i = 0; i < s->n; i++)
        for (int t = 0; t < s->f[i].n_tensors; t++) {
            const long j = expert_of_name(s->f[i].tensors[t].name);
            if (j > most) {
                most = j;
                example = s->f[i].tensors[t].name;
            }
        }
    const long E = m->moe_experts;
    if (upcycle && most >= 0)
        return ts_fail("%s holds routed experts' tensors (such as '%s'), but "
                       "model.init_upcycle = true starts an MoE from a dense model's weights; "
                       "to load an MoE's own weights, remove model.init_upcycle",
                       path, example);
    if (upcycle || most + 1 == E || (most < 0 && E == 0)) return TS_OK;
    if (most < 0)
        return ts_fail("%s holds no routed experts' tensors (such as "
                       "'model.layers.L.mlp.experts.0.gate_proj.weight'), but model.moe_experts "
                       "= %ld: the weights are of a dense model; set model.moe_experts = 0, "
                       "point model.init at the MoE's weights, or set model.init_upcycle = "
                       "true to start the MoE from them (each expert a copy of the dense MLP)",
                       path, E);
    return ts_fail("%s holds %ld routed experts per MoE block (its largest expert tensor is "
                   "'%s'), but model.moe_experts = %ld (config.json's num_local_experts or "
                   "num_experts): the weights are of another model; set model.moe_experts = "
                   "%ld",
                   path, most + 1, example, E, most + 1);
}

/* Whether tensor `name` is a routed expert of an MoE block of this model that another
 * expert-parallel rank holds (a global id outside this rank's [moe_ep_rank *
 * moe_local_experts, ...)): that rank reads and checks it. */
static bool other_ranks_expert(const ts_model *m, const char *name)
{
    const int layer = block_entry_of_name(name, m);
    const long j = expert_of_name(name);
    if (layer < 0 || j < 0 || j >= m->moe_experts || !m->layers[layer].moe) return false;
    const long first = (long)m->moe_ep_rank * m->moe_local_experts;
    return j < first || j >= first + m->moe_local_experts;
}

/* Every tensor of the files must be one the model knows: a misspelt or foreign name
 * means the files are not of this architecture. A name of a layer this rank does not
 * own (pipeline stages), or of an expert another ep rank holds, is the owning rank's to
 * check; lm_head.weight beside a tied head is compared with the embedding after
 * loading. Upcycling reads an MoE block's dense MLP into its experts. */
static ts_status check_names(const ts_model *m, const init_files *s, const char *path,
                             bool upcycle)
{
    for (int i = 0; i < s->n; i++)
        for (int t = 0; t < s->f[i].n_tensors; t++) {
            const char *name = s->f[i].tensors[t].name;
            if (param_index(m, name) >= 0 || !strcmp(name, "lm_head.weight") ||
                is_moe_bias(m, name) || other_ranks_expert(m, name) ||
                (upcycle && ts_upcycle_is_dense_mlp(m, name)))
                continue;
            const int layer = layer_of_name(name, m);
            if (layer >= 0 && !m->layers[layer].owned) continue;
            return ts_fail("%s holds tensor '%s', which is not a parameter of this %s config "
                           "(n_layer=%d); is the file for another model?",
                           s->n > 1 ? s->f[i].path : path, name, arch_name(m), m->n_layer);
        }
    return TS_OK;
}

/* A file's lm_head.weight where the head is tied to the embedding (nanoGPT's state_dict
 * carries it; a Hugging Face file of a tied model has none): accepted only if it is the
 * same tensor, since the model has no head of its own to load it into. */
static ts_status check_tied_head(const ts_model *m, const init_files *s)
{
    int f = -1;
    const ts_st_tensor *head = files_find(s, "lm_head.weight", &f);
    if (!head || m->head_wte_param < 0 || !m->tied) return TS_OK;
    const ts_param *P = &m->params[m->head_wte_param];
    float *tmp = ts_alloc_floats(P->numel), *have = ts_alloc_floats(P->numel);
    ts_status st = load_param(&s->f[f], head, P, tmp);
    if (st == TS_OK)
        m->k->memcpy_d2h(have, ts_param_data(m, m->head_wte_param), P->numel * sizeof(float));
    if (st == TS_OK && memcmp(tmp, have, P->numel * sizeof(float)) != 0)
        st = ts_fail("%s: lm_head.weight differs from %s, but this model ties its head to the "
                     "embedding (model.tie_embeddings = true; nanoGPT's GPT-2 does); set "
                     "model.tie_embeddings = false to load a head of its own",
                     s->f[f].path, P->shard.name);
    free(tmp);
    free(have);
    return st;
}

/* How an upcycled model's parameter p starts (upcycle.h): a routed expert from the dense
 * MLP's tensor (*t, in file *f, checked to have the expert's shape), a router drawn by
 * index here (*done), anything else under its own name (*t NULL: the caller finds it). */
static ts_status upcycle_source(ts_model *m, int p, const init_files *s, const char *path,
                                uint64_t seed, const ts_st_tensor **t, int *f, bool *done)
{
    const ts_param *P = &m->params[p];
    char dense[128];
    *t = NULL;
    *done = false;
    switch (ts_upcycle_source_of(m, p, dense, sizeof dense)) {
    case TS_UPCYCLE_BY_NAME: return TS_OK;
    case TS_UPCYCLE_FRESH:
        ts_model_init_param_random(m, p, seed);
        *done = true;
        return TS_OK;
    case TS_UPCYCLE_REFUSED:
        return ts_fail("'%s' has no dense counterpart to upcycle from (config_moe.c refuses "
                       "model.moe_shared_experts with model.init_upcycle)",
                       P->shard.name);
    case TS_UPCYCLE_FROM_MLP: break;
    }
    *t = files_find(s, dense, f);
    char want[64];
    ts_st_shape_str(want, sizeof want, P->shard.ndim, P->shard.shape);
    if (!*t)
        return ts_fail("%s has no tensor '%s', the dense MLP that '%s' %s is copied from "
                       "(model.init_upcycle = true)",
                       path, dense, P->shard.name, want);
    bool shape = (*t)->ndim == P->shard.ndim;
    for (int d = 0; shape && d < P->shard.ndim; d++) shape = (*t)->shape[d] == P->shard.shape[d];
    if (shape) return TS_OK;
    char got[64];
    return ts_fail("%s: tensor '%s' has shape %s, but the expert '%s' copied from it is %s: "
                   "the dense MLP's width (intermediate_size) must be model.moe_ffn_hidden = "
                   "%d (model.init_upcycle = true)",
                   s->f[*f].path, dense, ts_st_shape_str(got, sizeof got, (*t)->ndim, (*t)->shape),
                   P->shard.name, want, m->moe_ffn);
}

/* model.init, or with `upcycle` model.init_upcycle's (upcycle.h; the routers from seed). */
static ts_status load_model(ts_model *m, const char *path, bool upcycle, uint64_t seed)
{
    init_files s;
    if (files_open(&s, path) != TS_OK) return ts_error_prefix("model.init: ");
    ts_status st = check_expert_count(m, &s, path, upcycle);
    if (st == TS_OK) st = check_names(m, &s, path, upcycle);
    for (int p = 0; st == TS_OK && p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        int f = -1;
        const ts_st_tensor *t = NULL;
        bool done = false;
        if (upcycle) st = upcycle_source(m, p, &s, path, seed, &t, &f, &done);
        if (st != TS_OK) break;
        if (done) continue;
        if (!t) t = files_find(&s, P->shard.name, &f);
        if (!t) {
            char shape[64];
            const bool head = !strcmp(P->shard.name, "lm_head.weight");
            st = ts_fail("%s has no tensor '%s' (expected shape %s F32, or BF16 or F16, for "
                         "this config)%s",
                         path, P->shard.name,
                         ts_st_shape_str(shape, sizeof shape, P->shard.ndim, P->shard.shape),
                         head ? "; the weights of a model whose head is tied to the embedding "
                                "have none: set model.tie_embeddings = true"
                              : "");
            break;
        }
        /* Read and checked on the host, then one copy to the device. */
        float *host = ts_alloc_floats(P->numel);
        st = load_param(&s.f[f], t, P, host);
        if (st == TS_OK) m->k->memcpy_h2d(ts_param_data(m, p), host, P->numel * sizeof(float));
        free(host);
    }
    if (st == TS_OK) st = check_tied_head(m, &s);
    if (st == TS_OK) st = load_moe_bias(m, &s);
    files_close(&s);
    return st == TS_OK ? TS_OK : ts_error_prefix("model.init: ");
}

ts_status ts_ckpt_load_model_init(ts_model *m, const char *path)
{
    return load_model(m, path, false, 0);
}

ts_status ts_ckpt_load_model_upcycle(ts_model *m, const char *path, uint64_t seed)
{
    TS_ASSERT(m->moe_experts > 0);
    return load_model(m, path, true, seed);
}
