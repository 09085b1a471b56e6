/* The trainer's set-up: the compute backend and its data plane, the data files, the
 * partition, and the memory check, each collective where it says so. */
#include "train/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/watchdog.h"
#include "dataset/files.h"
#include "model/tokenizer_open.h"
#include "pipeline/memory.h"

/* The compute backend train.device, train.precision and train.attention name (the
 * config checked them): the table ts_kernels_for gives, which says what it needs. A
 * table with a device binds this rank to the GPU nearest its cores (as the topology
 * shared them out), and its memory moves on the device's own comm backend where built
 * (parallel.comm "auto" or "nccl": NCCL for CUDA). Otherwise MPI reads and writes
 * host-accessible buffers in place, and memory the host may not touch ("cpu-strict"
 * here, a GPU's without NCCL) travels through host bounce buffers and the backend's
 * copies. The world group keeps MPI: it carries host records only. */
ts_status ts_trainer_select_device(ts_trainer *t)
{
    const ts_train_config *tc = &t->cfg.train;
    t->k = ts_kernels_for(tc->device, tc->precision, tc->attention);
    TS_ASSERT(t->k);
    /* Without BF16 instructions oneDNN emulates bf16 at a fraction of fp32's speed (or
     * refuses): a bf16 run there would only be slower, so it is refused here, on the
     * rank that sees the CPU (every rank agrees on the verdict). */
    char cpu[128];
    if (!t->k->device_count && t->k->act_dtype == TS_DTYPE_BF16 && !ts_cpu_bf16_supported())
        return ts_fail("train.precision = \"bf16\" on the CPU needs the AVX512_BF16 or AMX-BF16 "
                       "instructions, which this CPU (%s) lacks: oneDNN would emulate bf16 "
                       "slower than fp32; use train.precision = \"fp32\"",
                       ts_cpu_model(cpu, sizeof cpu));
    const ts_comm_backend *data = NULL;
    if (t->k->device_count) {
        /* Configs are checked on machines without GPUs too; the device must be here. */
        if (t->k->device_count() == 0)
            return ts_fail("train.device = \"%s\", but this rank sees no CUDA device "
                           "(check the driver, CUDA_VISIBLE_DEVICES and the job's GPU "
                           "allocation), or use train.device = \"cpu\"",
                           tc->device);
        t->k->select_device(t->topo->gpu_cuda ? t->topo->gpu : t->topo->local_rank);
        if (t->k->native_comm && strcmp(t->cfg.parallel.comm, "mpi") != 0)
            data = ts_comm_backend_find(t->k->native_comm); /* NULL where not built */
    }
    if (!data && t->k->host_accessible) return TS_OK;
    if (!data) {
        ts_comm_staged_set_copies(t->k->memcpy_d2h, t->k->memcpy_h2d);
        data = ts_comm_backend_find("mpi-staged");
        TS_ASSERT(data);
    }
    /* Every group that moves device memory (topology.h TS_GROUP_LIST), even after one
     * failed: each move is collective over its group, so stopping early would leave the
     * other groups' members waiting. The topology detaches them when it frees them. */
    /* A dense model's expert groups stay on MPI: it never moves rows over them, and on
     * a GPU each move would build an NCCL communicator for nothing. */
    const bool moe = t->cfg.model.moe_experts > 0;
    char first[1024] = "";
    for (int i = 0; i < TS_N_GROUPS; i++) {
        ts_comm *c = ts_groups_at(t->groups, i);
        const bool expert = c == &t->groups->ep || c == &t->groups->etp || c == &t->groups->edp;
        if (ts_group_memory_of(i) == TS_GROUP_DEVICE && (moe || !expert) &&
            ts_comm_set_backend(c, data) != TS_OK && !first[0])
            snprintf(first, sizeof first, "%s", ts_error_message());
    }
    return first[0] ? ts_fail("%s", first) : TS_OK;
}

/* model.tokenizer, when set: its ranks file opened on every rank (a few MB at most)
 * and checked against vocab_size, and its sha256 kept in the run's config, which the
 * checkpoints record and a resume compares. The data itself carries no tokenizer mark:
 * the ids' range is what the data check can see. */
static ts_status open_tokenizer(ts_trainer *t)
{
    ts_model_config *m = &t->cfg.model;
    ts_tokenizer *tok;
    if (ts_model_tokenizer_open(m, NULL, &tok) != TS_OK) return TS_ERR;
    if (!tok) return TS_OK;
    snprintf(m->tokenizer_sha256, sizeof m->tokenizer_sha256, "%s", ts_tokenizer_sha256(tok));
    /* data.hellaswag: read and encoded now, before any step (every rank alike). */
    ts_status st = TS_OK;
    const ts_data_config *d = &t->cfg.data;
    if (d->hellaswag[0]) {
        st = ts_hellaswag_load(&t->hellaswag, d->hellaswag, tok, m->seq_len, d->hellaswag_items);
        if (st == TS_OK) t->has_hellaswag = true;
        else ts_error_prefix("data.hellaswag: ");
    }
    ts_tokenizer_free(tok);
    return st;
}


_Static_assert(TS_MAX_DATA_SETS == TS_MAX_DATASETS, "config.h and blend.h bound the blend alike");

/* data.train (its datasets, globs expanded) and, when evaluating, data.val: opened and
 * checked against seq_len (after the tokenizer, whose ids they hold). */
ts_status ts_trainer_open_data(ts_trainer *t)
{
    if (open_tokenizer(t) != TS_OK) return TS_ERR;
    if (t->eval_only) return TS_OK; /* tessera eval: no training or validation data */
    const ts_config *c = &t->cfg;
    const ts_data_config *d = &c->data;
    const char *paths[TS_MAX_SHARDS];
    for (int i = 0; i < d->n_train; i++) paths[i] = d->train[i];
    const ts_sampler_spec spec = {.key = "data.train", .patterns = paths,
                                  .n_patterns = d->n_train, .set_of = d->train_set,
                                  .n_sets = d->n_sets, .weights = d->weight,
                                  .shuffle = d->shuffle, .seed = (uint64_t)d->seed,
                                  .vocab_size = c->model.vocab_size,
                                  .seq_len = c->model.seq_len};
    if (ts_sampler_open(&t->train_data, &spec) != TS_OK) return TS_ERR;
    t->has_train = true;
    for (int s = 0; s < t->train_data.n_sets; s++)
        if (ts_data_check_encoded(&t->train_data.sets[s], "data.train", c->model.tokenizer) !=
            TS_OK)
            return TS_ERR;
    if (d->n_val > 0 && d->eval_every > 0) {
        const char *vp[TS_MAX_SHARDS];
        for (int i = 0; i < d->n_val; i++) vp[i] = d->val[i];
        if (ts_data_open_patterns(&t->val_data, "data.val", vp, d->n_val, c->model.vocab_size) !=
            TS_OK)
            return TS_ERR;
        t->has_val = true;
        if (ts_data_check_encoded(&t->val_data, "data.val", c->model.tokenizer) != TS_OK)
            return TS_ERR;
        const uint64_t S = ts_data_num_windows(&t->val_data, c->model.seq_len);
        if (S == 0)
            return ts_fail("data.val (%s%s) holds fewer than seq_len + 1 = %d tokens", vp[0],
                           t->val_data.n_shards > 1 ? " and the rest" : "", c->model.seq_len + 1);
        /* Window i of n is floor(i * S / n): more windows than S repeat some. */
        if ((uint64_t)d->val_windows > S)
            ts_log_warn("data.val_windows = %d but data.val (%s%s) holds only %llu distinct "
                        "window%s of seq_len + 1 = %d tokens: each evaluation repeats some",
                        d->val_windows, vp[0], t->val_data.n_shards > 1 ? " and the rest" : "",
                        (unsigned long long)S, S == 1 ? "" : "s", c->model.seq_len + 1);
    }
    return TS_OK;
}

void ts_trainer_log_data(const ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const ts_sampler *s = &t->train_data;
    /* train.batch_rampup: the steps' batches summed (ts_trainer_rampup_init parsed it). */
    const double seqs =
        (double)ts_batch_rampup_consumed(&t->rampup, c->train.global_batch, 0, 0, c->train.steps);
    if (s->shuffle)
        ts_log_info("data: data.train read in a seeded order (data.shuffle, data.seed = %lld): "
                    "each epoch of each dataset a permutation of its windows",
                    (long long)c->data.seed);
    else
        ts_log_info("data: data.train read in file order (data.shuffle = false)");
    for (int d = 0; d < s->n_sets; d++) {
        const ts_dataset *ds = &s->sets[d];
        const double w = s->blend.weight[d];
        char name[48];
        if (s->n_sets > 1) snprintf(name, sizeof name, "dataset %d (weight %.4g)", d, w);
        else snprintf(name, sizeof name, "data.train");
        ts_log_info("data: %s: %d file%s (%s%s%s): %llu tokens, %llu windows of %d; %d steps "
                    "take %.3g epochs of it",
                    name, ds->n_shards, ds->n_shards == 1 ? "" : "s", ds->shards[0].path,
                    ds->n_shards > 1 ? " .. " : "",
                    ds->n_shards > 1 ? ds->shards[ds->n_shards - 1].path : "",
                    (unsigned long long)ds->n_tokens, (unsigned long long)s->windows[d],
                    c->model.seq_len, c->train.steps, seqs * w / (double)s->windows[d]);
    }
    if (t->has_val)
        ts_log_info("data: data.val: %d file%s, %llu windows; each evaluation reads %d of them "
                    "spread over all", t->val_data.n_shards, t->val_data.n_shards == 1 ? "" : "s",
                    (unsigned long long)ts_data_num_windows(&t->val_data, c->model.seq_len),
                    c->data.val_windows);
}

/* One dataset's shards agreed across the ranks: the same files (a glob can match
 * differently on node-local disks), and the same token count and crc32 for each path on
 * every rank (probe D7: node-local copies that differed trained silently on a mixture).
 * Collective. */
static ts_status agree_dataset(ts_trainer *t, const ts_dataset *ds, const char *key,
                               uint64_t *tokens, uint32_t *crcs)
{
    const int n = ds->n_shards;
    uint64_t nn[2] = {(uint64_t)n, (uint64_t)n};
    ts_host_allreduce_min_u64(&t->groups->world, &nn[0], 1);
    ts_host_allreduce_max_u64(&t->groups->world, &nn[1], 1);
    if (nn[0] != nn[1])
        return ts_fail("%s: the ranks found different numbers of files (%llu to %llu): each "
                       "node must see the same files under the same paths and patterns (put "
                       "them on a shared file system, or copy them identically)",
                       key, (unsigned long long)nn[0], (unsigned long long)nn[1]);
    uint64_t *lo = ts_calloc((size_t)n * 2, sizeof *lo), *hi = ts_calloc((size_t)n * 2, sizeof *hi);
    for (int i = 0; i < n; i++) {
        uint32_t crc;
        ts_data_shard_identity(ds, i, &lo[2 * i], &crc);
        lo[2 * i + 1] = crc;
    }
    memcpy(hi, lo, (size_t)n * 2 * sizeof *lo);
    ts_host_allreduce_min_u64(&t->groups->world, lo, (size_t)n * 2);
    ts_host_allreduce_max_u64(&t->groups->world, hi, (size_t)n * 2);
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++)
        if (lo[2 * i] != hi[2 * i] || lo[2 * i + 1] != hi[2 * i + 1])
            st = ts_fail("%s: the ranks read different data at %s (%s): each node must see "
                         "the same file (copy it identically, or put it on a shared file "
                         "system)",
                         key, ds->shards[i].path,
                         lo[2 * i] != hi[2 * i] ? "its token count differs between ranks"
                                                : "its contents differ between ranks");
    for (int i = 0; tokens && i < n; i++) {
        tokens[i] = lo[2 * i];
        crcs[i] = (uint32_t)lo[2 * i + 1];
    }
    free(lo);
    free(hi);
    return st;
}

/* model.tokenizer's ranks file: the same sha256 on every rank (rank 0's is the one the
 * checkpoints record; a node with another file would write ids that mean other text).
 * Collective. */
static ts_status agree_tokenizer(ts_trainer *t)
{
    const ts_model_config *m = &t->cfg.model;
    if (!m->tokenizer[0]) return TS_OK; /* the same on every rank: the config decides */
    uint64_t lo[4] = {0}, hi[4];
    for (int i = 0; i < 4; i++) {
        char word[17];
        memcpy(word, m->tokenizer_sha256 + 16 * i, 16);
        word[16] = '\0';
        lo[i] = strtoull(word, NULL, 16);
    }
    memcpy(hi, lo, sizeof lo);
    ts_host_allreduce_min_u64(&t->groups->world, lo, 4);
    ts_host_allreduce_max_u64(&t->groups->world, hi, 4);
    if (memcmp(lo, hi, sizeof lo) != 0)
        return ts_fail("model.tokenizer: the ranks read different ranks files for %s (this "
                       "rank's %s has sha256 %s): each node must hold the same file (run "
                       "scripts/fetch_tokenizers.sh on every node, or point "
                       "model.tokenizer_file at a shared copy)",
                       m->tokenizer, m->tokenizer_file[0] ? m->tokenizer_file : "default file",
                       m->tokenizer_sha256);
    return TS_OK;
}

ts_status ts_trainer_agree_data(ts_trainer *t)
{
    ts_watchdog_context("setup: checking every rank reads the same data", 0, 0, 0);
    const ts_sampler *s = &t->train_data;
    int total = 0;
    for (int d = 0; d < s->n_sets; d++) total += s->sets[d].n_shards;
    t->n_data = total;
    t->data_tokens = ts_calloc((size_t)total + 1, sizeof *t->data_tokens);
    t->data_crc = ts_calloc((size_t)total + 1, sizeof *t->data_crc);
    ts_status st = TS_OK;
    char first[1024] = "";
    /* Every dataset, even after one failed: each agreement is collective (its verdict
     * is the same on every rank: it follows from the all-reduced identities). */
    for (int d = 0, at = 0; d < s->n_sets; at += s->sets[d].n_shards, d++) {
        char key[64];
        if (s->n_sets > 1)
            snprintf(key, sizeof key, "data.train (dataset %d of the blend)", d);
        else
            snprintf(key, sizeof key, "data.train");
        if (agree_dataset(t, &s->sets[d], key, t->data_tokens + at, t->data_crc + at) != TS_OK &&
            !first[0])
            snprintf(first, sizeof first, "%s", ts_error_message());
    }
    if (first[0]) st = ts_fail("%s", first);
    int val = t->has_val; /* the same on every rank: the config decides */
    if (st == TS_OK && val) st = agree_dataset(t, &t->val_data, "data.val", NULL, NULL);
    if (st == TS_OK) st = agree_tokenizer(t);
    return st;
}

/* The partition: an explicit list, or balanced on per-layer costs that rank 0 measures
 * and broadcasts (every rank must cut the model identically). */
ts_status ts_trainer_build_partition(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const int n_chunks = c->parallel.pp * c->parallel.virtual_stages;
    if (c->parallel.n_partition > 0 || n_chunks == 1) return ts_partition_build(c, false, &t->part);

    ts_layer_costs costs;
    ts_layer_costs_model(&costs, &c->model, c->parallel.micro_batch);
    int ok = 1;
    if (t->groups->world.rank == 0) {
        ts_layer_costs measured;
        if (ts_layer_costs_measure(&measured, &c->model, c->parallel.micro_batch, t->k) == TS_OK) {
            ts_layer_costs_free(&costs);
            costs = measured;
        } else {
            ok = 0; /* keep the model's costs */
        }
    }
    ts_host_broadcast(&t->groups->world, &ok, sizeof ok, 0);
    if (ok) {
        size_t bytes = (size_t)costs.n_layers * sizeof(double);
        ts_host_broadcast(&t->groups->world, costs.fwd_ms, bytes, 0);
        ts_host_broadcast(&t->groups->world, costs.bwd_ms, bytes, 0);
        ts_host_broadcast(&t->groups->world, costs.act_bytes, bytes, 0);
        costs.source = TS_COST_MEASURED;
    }
    ts_status st = ts_partition_from_costs(c, &costs, &t->part);
    ts_layer_costs_free(&costs);
    return st;
}

/* The advice every "not enough memory" message ends with. */
#define SHRINK_ADVICE                                                                      \
    "shrink the model, parallel.micro_batch or the micro-batches in flight "               \
    "(parallel.recompute, \"auto\" to recompute only what does not fit), or spread it "     \
    "over more pipeline/tensor ranks"

/* What this rank may allocate beyond what it holds now, as the checks below count it:
 * on a backend with device memory the device's free memory (unbounded where the backend
 * cannot say); on the host the smaller of the address space left under RLIMIT_AS and
 * an even share of the node's physical memory less what this process holds (so the
 * node's ranks together fit). What recompute = "auto" fits its caps into by default. */
static double machine_room(const ts_kernels *k, const ts_sysmem *lim, int ranks_here)
{
    if (k->device_memory) {
        size_t dev_free = 0, dev_total = 0;
        return k->memory_info(&dev_free, &dev_total) ? (double)dev_free : INFINITY;
    }
    const double share = lim->physical / ranks_here - lim->rss_now;
    const double left = lim->address_space - lim->vm_now;
    return share < left ? share : left;
}

/* parallel.recompute = "auto": this rank's caps and selective chunks (t->recompute_keep,
 * t->recompute_selective: ts_memory_estimate_auto_selective), chosen to fit the
 * smaller of parallel.memory_budget_mb and what the machine offers, the least of that
 * over all ranks, so the tensor- and data-parallel ranks of a pipeline rank (whose
 * collectives run inside every recomputed forward) choose the same caps. Collective.
 * *room gets the bytes fitted; false when even full recompute exceeds them. */
static bool choose_recompute(ts_trainer *t, const ts_sysmem *lim, double *room,
                             ts_rank_memory *est)
{
    const ts_topology *topo = t->topo;
    const double budget = (double)t->cfg.parallel.memory_budget_mb * 1048576.0;
    double r = machine_room(t->k, lim, topo->groups.node.size);
    if (budget > 0 && budget < r) r = budget;
    r = -r;
    ts_host_allreduce_max_f64(&t->groups->world, &r, 1); /* the least room */
    *room = -r;
    free(t->recompute_keep);
    free(t->recompute_selective);
    t->recompute_keep = ts_calloc((size_t)t->sched.n_chunks, sizeof(int));
    t->recompute_selective = ts_calloc((size_t)t->sched.n_chunks, sizeof(bool));
    return ts_memory_estimate_auto_selective(&t->cfg, &t->part, &t->sched, topo->coords.pp,
                                             topo->threads, *room, t->recompute_keep,
                                             t->recompute_selective, est);
}

/* recompute = "auto"'s caps and selective chunks, one line per pipeline rank on world
 * rank 0: every rank's choice for its chunks gathered (the largest wins; the ranks of a
 * pipeline rank agree). Collective. */
static void log_recompute(ts_trainer *t, double room)
{
    const ts_schedule *s = &t->sched;
    const int n = s->n_chunks;
    int *keep = ts_malloc(2 * (size_t)n * sizeof(int)); /* caps, then selective (0/1) */
    bool *selective = ts_malloc((size_t)n * sizeof(bool));
    for (int c = 0; c < n; c++) {
        const bool mine = ts_chunk_rank(s, c) == t->topo->coords.pp;
        keep[c] = mine ? t->recompute_keep[c] : -1;
        keep[n + c] = mine ? t->recompute_selective[c] : -1;
    }
    ts_host_allreduce_max_i32(&t->groups->world, keep, 2 * (size_t)n);
    for (int c = 0; c < n; c++) selective[c] = keep[n + c] > 0;
    if (t->groups->world.rank == 0) {
        const int mb = t->cfg.parallel.memory_budget_mb;
        char what[32], line[1024];
        ts_format_bytes(room, what, sizeof what);
        ts_log_info("recompute auto: fitting each rank into %s (%s)", what,
                    mb > 0 && room >= mb * 1048576.0 ? "parallel.memory_budget_mb"
                                                      : "what the machine offers the rank");
        for (int q = 0; q < s->pp; q++)
            ts_log_info("recompute auto: pipeline rank %d: %s", q,
                        ts_memory_describe_keep_selective(s, q, keep, selective, line,
                                                          sizeof line));
    }
    free(keep);
    free(selective);
}

/* Refuse a run that cannot fit, with the numbers, before allocating it: this rank's
 * estimate against parallel.memory_budget_mb when set, the address space left under
 * RLIMIT_AS, and the sum over the node's ranks against its physical memory; on a
 * backend with device memory, against the device's free memory instead, the table's
 * extra weight copies included, leaving the host with only what it holds itself. With
 * recompute = "auto" the caps are chosen first, to fit. Collective; agreed. */
ts_status ts_trainer_check_memory(ts_trainer *t, bool log)
{
    const ts_topology *topo = t->topo;
    const ts_kernels *k = t->k;
    ts_sysmem lim;
    ts_sysmem_read(&lim);
    ts_rank_memory est;
    ts_status st = TS_OK;
    const bool auto_rc = ts_recompute_from_name(t->cfg.parallel.recompute) == TS_RECOMPUTE_AUTO;
    double room = 0.0;
    char what[512], left[32], limit[32], together[32], phys[32];
    if (auto_rc) {
        if (!choose_recompute(t, &lim, &room, &est))
            st = ts_fail("not enough memory for parallel.recompute = \"auto\": pipeline rank %d "
                         "needs %s even recomputing every micro-batch, %s beyond its BLAS "
                         "buffers, but may allocate %s (the smaller of parallel.memory_budget_mb "
                         "and what the machine offers); " SHRINK_ADVICE,
                         topo->coords.pp, ts_memory_describe(&est, what, sizeof what),
                         ts_format_bytes(est.total - est.blas, left, sizeof left),
                         ts_format_bytes(room, limit, sizeof limit));
    } else {
        ts_memory_estimate(&t->cfg, &t->part, &t->sched, topo->coords.pp, topo->threads, NULL,
                           &est);
    }
    ts_memory_describe(&est, what, sizeof what);
    /* The BLAS threads are running (binding started them): their buffers are in vm_now
     * already, and they are address space, not resident memory. */
    double new_bytes = est.total - est.blas;
    const int budget_mb = t->cfg.parallel.memory_budget_mb;
    if (st == TS_OK && budget_mb > 0 && new_bytes > budget_mb * 1048576.0)
        st = ts_fail("not enough memory: pipeline rank %d needs %s, %s beyond its BLAS "
                     "buffers, over parallel.memory_budget_mb = %d (MiB); raise the budget, "
                     "or " SHRINK_ADVICE,
                     topo->coords.pp, what, ts_format_bytes(new_bytes, left, sizeof left),
                     budget_mb);
    if (k->device_memory) {
        /* The estimate counts the table's weight copies with the parameters. */
        size_t dev_free = 0, dev_total = 0;
        char copies_note[64] = "";
        if (k->weight_copy_bytes > 0)
            snprintf(copies_note, sizeof copies_note, " (its %s weight copies included)",
                     k->precision);
        if (st == TS_OK && k->memory_info(&dev_free, &dev_total) && new_bytes > (double)dev_free)
            st = ts_fail("not enough GPU memory: pipeline rank %d needs %s%s, but GPU %d has %s "
                         "free of %s; " SHRINK_ADVICE,
                         topo->coords.pp, what, copies_note, k->current_device(),
                         ts_format_bytes((double)dev_free, left, sizeof left),
                         ts_format_bytes((double)dev_total, limit, sizeof limit));
        new_bytes = 0;
    }
    double node = new_bytes + lim.rss_now;
    ts_host_allreduce_sum_f64(&topo->groups.node, &node, 1);
    const int ranks_here = topo->groups.node.size;
    if (st == TS_OK && lim.vm_now + new_bytes > lim.address_space)
        st = ts_fail("not enough memory: pipeline rank %d needs %s more, but the address-space "
                     "limit (ulimit -v) leaves %s of %s on host %s; raise the limit, or "
                     SHRINK_ADVICE,
                     topo->coords.pp, what,
                     ts_format_bytes(lim.address_space - lim.vm_now, left, sizeof left),
                     ts_format_bytes(lim.address_space, limit, sizeof limit), topo->host);
    else if (st == TS_OK && node > lim.physical)
        st = ts_fail("not enough memory: pipeline rank %d needs %s; the ranks on host %s (%d) "
                     "need %s together, but this machine has %s; " SHRINK_ADVICE " or nodes",
                     topo->coords.pp, what, topo->host, ranks_here,
                     ts_format_bytes(node, together, sizeof together),
                     ts_format_bytes(lim.physical, phys, sizeof phys));
    if (ts_comm_agree(&t->groups->world, st) != TS_OK) return TS_ERR;
    /* What this rank will hold at its peak: on the CPU the process as it is now (no
     * model yet) and what the estimate adds, BLAS's address space apart; on a device,
     * the device's bytes. The memory report sets it beside the real peak (estimate_mb). */
    t->estimate_bytes = k->device_memory ? est.total - est.blas : lim.rss_now + est.total - est.blas;
    if (log && t->groups->world.rank == 0) {
        if (k->device_memory)
            ts_log_info("memory: rank 0 will use about %s", what);
        else
            ts_log_info("memory: rank 0 will use about %s",
                        ts_memory_describe_resident(&est, lim.rss_now, what, sizeof what));
    }
    if (log && auto_rc) log_recompute(t, room);
    return TS_OK;
}
