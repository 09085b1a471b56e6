/* tessera ckpt verify / info (checkpoint.h): one process reads the whole checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "core/sysmem.h"

ts_ckpt_verdict ts_ckpt_verify(const char *step_dir, bool verbose)
{
    ts_ckpt_reader r;
    if (ts_ckpt_reader_open(&r, step_dir) != TS_OK) return r.verdict;
    ts_status st = ts_ckpt_reader_check_complete(&r);
    if (st == TS_OK) st = ts_ckpt_reader_check_files(&r);
    if (st == TS_OK) st = ts_ckpt_reader_check_hf_config(&r);
    ts_ckpt_layout L;
    ts_ckpt_layout_build(&L, &r.model, 1e6, !strcmp(r.optimizer, "muon"));
    void *buf = ts_malloc((size_t)r.chunk_bytes);
    uint64_t bytes = 0;
    for (int e = 0; st == TS_OK && e < L.n_entries; e++) {
        if (!ts_ckpt_entry_stored(&L.entries[e])) continue;
        st = ts_ckpt_reader_verify(&r, L.entries[e].name, 0, SIZE_MAX, buf);
        bytes += L.entries[e].bytes;
    }
    free(buf);
    /* Nothing in the files that the model does not define. */
    for (int f = 0; st == TS_OK && f < r.n_files; f++) {
        const ts_st_file *F = &r.files[f].st;
        for (int t = 0; st == TS_OK && t < F->n_tensors; t++) {
            const char *name = F->tensors[t].name;
            const char *base = !strncmp(name, "exp_avg_sq.", 11)        ? name + 11
                               : !strncmp(name, "exp_avg.", 8)            ? name + 8
                               : !strncmp(name, "momentum_buffer.", 16) ? name + 16
                                                                          : name;
            if (ts_ckpt_layout_find(&L, base) < 0) {
                ts_fail("%s holds tensor '%s', which the checkpoint's model does not define",
                        F->path, name);
                r.verdict = TS_CKPT_CORRUPT;
                st = TS_ERR;
            }
        }
    }
    int n_entries = 0;
    for (int e = 0; e < L.n_entries; e++) n_entries += ts_ckpt_entry_stored(&L.entries[e]);
    ts_ckpt_layout_free(&L);
    ts_ckpt_verdict v = st == TS_OK ? TS_CKPT_OK : r.verdict;
    if (v == TS_CKPT_OK && verbose) {
        char b[32];
        printf("%s: OK: step %d, %d tensors in %d files, %s of tensor data, every checksum "
               "matches\n",
               step_dir, r.step, n_entries, r.n_files, ts_format_bytes((double)bytes, b, sizeof b));
    }
    ts_ckpt_reader_close(&r);
    return v;
}

ts_status ts_ckpt_print_info(const char *step_dir)
{
    ts_ckpt_reader r;
    if (ts_ckpt_reader_open(&r, step_dir) != TS_OK) return TS_ERR;
    const ts_model_config *m = &r.model;
    json_t *grid = json_object_get(r.state, "grid");
    char b[32];
    printf("checkpoint  %s\n", step_dir);
    printf("step        %d (the next step to run)\n", r.step);
    printf("model       %s: n_layer %d, n_head %d, n_embd %d, vocab_size %d, seq_len %d (%.2fM "
           "parameters)\n",
           m->arch, m->n_layer, m->n_head, m->n_embd, m->vocab_size, m->seq_len,
           (double)ts_model_logical_params(m) / 1e6);
    if (ts_model_arch(m) == TS_ARCH_LLAMA) {
        printf("            n_kv_head %d, ffn_hidden %d, norm_eps %g, rope_theta %g, %s head",
               ts_model_kv_heads(m), ts_model_ffn(m), m->norm_eps, m->rope_theta,
               ts_model_tied(m) ? "tied" : "untied");
        if (m->rope_scaling != 0.0 && !strcmp(m->rope_type, "yarn"))
            printf(", rope_scaling %g (yarn: beta_fast %g, beta_slow %g, mscale %g, mscale_all_dim "
                   "%g, original context %d)",
                   m->rope_scaling, m->rope_beta_fast, m->rope_beta_slow, m->rope_mscale,
                   m->rope_mscale_all_dim, m->rope_original_context);
        else if (m->rope_scaling != 0.0)
            printf(", rope_scaling %g (low %g, high %g, original context %d)", m->rope_scaling,
                   m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_context);
        if (m->qk_norm) printf(", qk_norm");
        printf("\n");
        if (ts_model_is_mla(m))
            printf("            MLA: q_lora_rank %d, kv_lora_rank %d, qk heads %d + %d rope, v heads "
                   "%d\n",
                   m->q_lora_rank, m->kv_lora_rank, m->qk_nope_head_dim, m->qk_rope_head_dim,
                   m->v_head_dim);
        if (m->moe_experts > 0)
            printf("            MoE: %d experts top-%d of width %d (%s router%s), %d shared, "
                   "groups %d/%d, first dense %d, every %d; %.2fM active parameters\n",
                   m->moe_experts, m->moe_top_k, m->moe_ffn_hidden, m->moe_router,
                   m->moe_norm_topk ? ", renormalised" : "", m->moe_shared_experts,
                   m->moe_groups, m->moe_topk_groups, m->moe_first_dense, m->moe_every,
                   (double)ts_model_active_params(m) / 1e6);
    } else if (!ts_model_tied(m)) {
        printf("            untied head (lm_head.weight)\n");
    }
    if (m->tokenizer[0])
        printf("tokenizer   %s, ranks sha256 %s%s%s\n", m->tokenizer, m->tokenizer_sha256,
               m->tokenizer_file[0] ? ", trained from " : "", m->tokenizer_file);
    else
        printf("tokenizer   none (%s)\n", m->vocab_size == 256 ? "byte-level" : "token ids");
    printf("saved from  pp %d x dp %d x tp %d (virtual_stages %d, zero %d, %d ranks)", r.grid[0],
           r.grid[1], r.grid[2], (int)json_integer_value(json_object_get(grid, "virtual_stages")),
           (int)json_integer_value(json_object_get(grid, "zero")),
           (int)json_integer_value(json_object_get(grid, "world")));
    /* Expert parallelism (absent before it was recorded: 1). The tensors do not depend
     * on it: each expert is stored whole under its global id. */
    const json_int_t ep = json_integer_value(json_object_get(grid, "ep")),
                     etp = json_integer_value(json_object_get(grid, "etp"));
    if (ep > 1 || etp > 1) printf(", experts over ep %lld x etp %lld", (long long)ep, (long long)etp);
    printf("\n");
    printf("optimizer   %s%s\n", r.optimizer,
           strcmp(r.optimizer, "muon") == 0
               ? " (Muon on the blocks' matrices: momentum_buffer.<name>; AdamW on the rest)"
               : " (exp_avg.<name>, exp_avg_sq.<name>)");
    printf("data        %lld sequences consumed (global_batch %lld)\n",
           (long long)json_integer_value(
               json_object_get(json_object_get(r.state, "data"), "sequences_consumed")),
           r.global_batch);
    /* train.skip_spikes' window (train/spike_guard.h), when the run kept one. */
    const json_t *spikes = json_object_get(r.state, "spike_guard");
    if (spikes) {
        const long long k = (long long)json_integer_value(json_object_get(spikes, "skipped"));
        printf("spikes      window of %lld steps (%zu values held), %lld step%s skipped as "
               "spike%s\n",
               (long long)json_integer_value(json_object_get(spikes, "window")),
               json_array_size(json_object_get(spikes, "loss")), k, k == 1 ? "" : "s",
               k == 1 ? "" : "s");
    }
    uint64_t total = 0;
    printf("files\n");
    for (int f = 0; f < r.n_files; f++) {
        printf("  %-36s %12llu bytes  %4d tensors\n", r.files[f].name,
               (unsigned long long)r.files[f].bytes, r.files[f].st.n_tensors);
        total += r.files[f].bytes;
    }
    printf("total       %s\n", ts_format_bytes((double)total, b, sizeof b));
    printf("tensors\n");
    for (int f = 0; f < r.n_files; f++) {
        const ts_st_file *F = &r.files[f].st;
        for (int t = 0; t < F->n_tensors; t++) {
            const ts_st_tensor *T = &F->tensors[t];
            char shape[64];
            printf("  %-48s %s %-14s %12llu bytes\n", T->name, ts_st_dtype_name(T->dtype),
                   ts_st_shape_str(shape, sizeof shape, T->ndim, T->shape),
                   (unsigned long long)(T->end - T->begin));
        }
    }
    ts_ckpt_reader_close(&r);
    return TS_OK;
}
