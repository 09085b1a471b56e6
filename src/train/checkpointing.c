/* The trainer's checkpoint glue (checkpoint/checkpoint.h does the work): what
 * checkpoint.load names, loaded before the first step; saves started at once or in the
 * background (checkpoint.async), and their commit with its report. */
#include "train/internal.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"

/* Shard i of data.train, counted dataset after dataset. */
static const char *shard_path(const ts_sampler *s, int i)
{
    for (int d = 0; d < s->n_sets; i -= s->sets[d].n_shards, d++)
        if (i < s->sets[d].n_shards) return s->sets[d].shards[i].path;
    return "?";
}

/* "[a, b, c]" of up to n integers of a json array (or the ints), for messages. */
static void list_ints(char *buf, size_t cap, const json_t *arr, const int *ints, int n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < cap; i++) {
        const json_t *e = arr ? json_array_get(arr, (size_t)i) : NULL;
        if (arr && !json_is_integer(e))
            at += (size_t)snprintf(buf + at, cap - at, "%s?", i ? ", " : "");
        else
            at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "",
                                   arr ? (long long)json_integer_value(e) : (long long)ints[i]);
    }
}

/* A blend's grouping of its files into datasets, state.json's data.dataset_files, must
 * be as it was: the same files regrouped ({a}, {b, c} as {a, b}, {c}) pass every
 * identity check shard by shard, yet each dataset then reads other windows (probe D9).
 * The same number of files grouped otherwise is refused, as changed weights are; a
 * record that is no grouping of the recorded shards at all (not n_sets positive
 * integers summing to the identity's length) is refused as damaged. Files added to or
 * removed from a dataset (a glob matching more) change the count and are the identity
 * check's to warn about (compare_data), as for one dataset. Absent (older): nothing. */
static ts_status check_dataset_files(ts_trainer *t, const json_t *data)
{
    const json_t *jf = json_object_get(data, "dataset_files");
    const json_t *ids = json_object_get(data, "identity");
    if (!jf) return TS_OK;
    const ts_sampler *smp = &t->train_data;
    const int n = smp->n_sets;
    bool valid = json_is_array(jf) && (int)json_array_size(jf) == n;
    long long was_total = 0;
    int now_total = 0, now[TS_MAX_DATASETS];
    bool same = valid;
    for (int d = 0; d < n; d++) {
        now[d] = smp->sets[d].n_shards;
        now_total += now[d];
        const json_t *e = valid ? json_array_get(jf, (size_t)d) : NULL;
        if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 1 << 20) {
            valid = false;
            continue;
        }
        was_total += json_integer_value(e);
        same = same && json_integer_value(e) == now[d];
    }
    if (valid && json_is_array(ids) && json_array_size(ids) > 0 &&
        (long long)json_array_size(ids) != was_total)
        valid = false;
    char was[256], is[256];
    list_ints(was, sizeof was, json_is_array(jf) ? jf : NULL, NULL,
              json_is_array(jf) ? (int)json_array_size(jf) : 0);
    list_ints(is, sizeof is, NULL, now, n);
    if (!valid)
        return ts_fail("checkpoint.load: %s's state.json records data.dataset_files = [%s], "
                       "which is no grouping of %s into this blend's %d dataset%s: the file "
                       "is damaged or was edited; load another checkpoint",
                       t->loaded_from, was,
                       json_is_array(ids) && json_array_size(ids) > 0 ? "its recorded shards"
                                                                      : "shards",
                       n, n == 1 ? "" : "s");
    if (!same && was_total == now_total)
        return ts_fail("checkpoint.load: %s was trained on a blend whose datasets held [%s] "
                       "files, but data.train's now hold [%s]: the same files grouped "
                       "otherwise; resuming would change which data each dataset reads "
                       "(keep data.train's blend as it was)",
                       t->loaded_from, was, is);
    return TS_OK;
}

/* The blend's cursor at the loaded step (state.json's data.blend_counts): restored, so
 * the first step need not replay the blend from sequence 0 (8 s at 3.2e8 sequences of
 * 16 datasets). Counts that cannot be this blend's at this step are refused (a damaged
 * or edited state.json); a checkpoint without them (older) replays. */
static ts_status restore_cursor(ts_trainer *t, const json_t *data)
{
    const json_t *jc = json_object_get(data, "blend_counts");
    if (!jc) return TS_OK;
    ts_blend *b = &t->train_data.blend;
    const uint64_t g = (uint64_t)t->rampup_seq0; /* the recorded data position */
    uint64_t counts[TS_MAX_DATASETS];
    bool ok = json_is_array(jc) && (int)json_array_size(jc) == b->n;
    for (int d = 0; ok && d < b->n; d++) {
        const json_t *e = json_array_get(jc, (size_t)d);
        ok = json_is_integer(e) && json_integer_value(e) >= 0;
        counts[d] = ok ? (uint64_t)json_integer_value(e) : 0;
    }
    if (ok && ts_blend_restore(b, g, counts)) return TS_OK;
    return ts_fail("checkpoint.load: %s's state.json records data.blend_counts that are not "
                   "its blend's sequences per dataset after %llu sequences (they must sum to "
                   "it, each near weight x sequences): the file is damaged or was edited; "
                   "load another checkpoint",
                   t->loaded_from, (unsigned long long)g);
}

/* The data order must continue as it was trained: the same shuffle, seed and blend
 * (the batch rule draws step s's sequences from them), else steps after the resume
 * would see another order than one uninterrupted run. state.json before these keys
 * records an unshuffled single dataset. Refused by key, as the model's keys are. */
static ts_status check_data_order(ts_trainer *t, const json_t *state)
{
    const json_t *data = json_object_get(state, "data");
    const json_t *jsh = json_object_get(data, "shuffle"), *jseed = json_object_get(data, "seed");
    const json_t *jw = json_object_get(data, "weights");
    const ts_data_config *d = &t->cfg.data;
    const bool was_shuffle = json_is_true(jsh);
    if (was_shuffle != d->shuffle)
        return ts_fail("checkpoint.load: %s was trained with data.shuffle = %s%s, but the config "
                       "says %s; resuming would change the order of the data from step %d on "
                       "(set data.shuffle = %s)",
                       t->loaded_from, was_shuffle ? "true" : "false",
                       jsh ? "" : " (its state.json predates the key: the data was read in "
                                  "order)",
                       d->shuffle ? "true" : "false", t->start_step, was_shuffle ? "true" : "false");
    if (d->shuffle && (!json_is_integer(jseed) || json_integer_value(jseed) != (json_int_t)d->seed))
        return ts_fail("checkpoint.load: %s shuffled the data with data.seed = %lld, but this "
                       "run's is %lld; resuming would change the order of the data from step %d "
                       "on (set data.seed = %lld)",
                       t->loaded_from, (long long)json_integer_value(jseed), (long long)d->seed,
                       t->start_step, (long long)json_integer_value(jseed));
    const ts_blend *b = &t->train_data.blend;
    bool same = jw ? json_is_array(jw) && (int)json_array_size(jw) == b->n : b->n == 1;
    for (int s = 0; jw && same && s < b->n; s++)
        same = json_real_value(json_array_get(jw, (size_t)s)) == b->weight[s];
    if (!same) {
        char was[256] = "", now[256] = "";
        size_t at = 0;
        for (size_t s = 0; jw && s < json_array_size(jw) && at < sizeof was; s++)
            at += (size_t)snprintf(was + at, sizeof was - at, "%s%.6g", s ? ", " : "",
                                   json_real_value(json_array_get(jw, s)));
        if (!jw) snprintf(was, sizeof was, "1");
        at = 0;
        for (int s = 0; s < b->n && at < sizeof now; s++)
            at += (size_t)snprintf(now + at, sizeof now - at, "%s%.6g", s ? ", " : "", b->weight[s]);
        return ts_fail("checkpoint.load: %s was trained on a blend of %d dataset%s with weights "
                       "[%s], but data.train now has %d with [%s]; resuming would change which "
                       "data each step reads (keep data.train's blend as it was)",
                       t->loaded_from, jw ? (int)json_array_size(jw) : 1,
                       jw && json_array_size(jw) == 1 ? "" : jw ? "s" : "", was, b->n,
                       now);
    }
    if (check_dataset_files(t, data) != TS_OK) return TS_ERR;
    return restore_cursor(t, data);
}

/* Whether the checkpoint's run read the data this one reads (state.json's data.train and
 * the shards' identity, when recorded): the batch rule continues at the recorded number
 * of sequences into whatever data.train now holds, so a changed file is said, not silently
 * trained on (probe Q5). Rank 0 warns; nothing is refused (a corpus may be fixed or
 * moved on purpose). */
static void compare_data(ts_trainer *t, const json_t *state)
{
    json_t *data = json_object_get(state, "data");
    json_t *paths = json_object_get(data, "train"), *ids = json_object_get(data, "identity");
    const ts_data_config *d = &t->cfg.data;
    bool same_paths = json_is_array(paths) && (int)json_array_size(paths) == d->n_train;
    for (int i = 0; same_paths && i < d->n_train; i++) {
        const char *p = json_string_value(json_array_get(paths, (size_t)i));
        same_paths = p && !strcmp(p, d->train[i]);
    }
    int differ = -1; /* the first shard whose identity differs */
    const int n = t->n_data;
    if (json_is_array(ids) && json_array_size(ids) > 0) {
        if ((int)json_array_size(ids) != n) differ = 0;
        for (int i = 0; differ < 0 && i < n; i++) {
            json_t *e = json_array_get(ids, (size_t)i);
            json_t *tok = json_object_get(e, "tokens"), *crc = json_object_get(e, "crc32");
            if (!json_is_integer(tok) || !json_is_integer(crc) ||
                (uint64_t)json_integer_value(tok) != t->data_tokens[i] ||
                (uint32_t)json_integer_value(crc) != t->data_crc[i])
                differ = i;
        }
    }
    if (differ >= 0)
        ts_log_warn("checkpoint: data.train holds other data than the run of %s read (shard %s "
                    "differs in its tokens or crc32): training continues at sequence %lld of "
                    "the new data",
                    t->loaded_from, shard_path(&t->train_data, differ),
                    (long long)t->rampup_seq0);
    else if (!same_paths)
        ts_log_warn("checkpoint: data.train names other files than the run of %s did%s",
                    t->loaded_from,
                    json_is_array(ids) && json_array_size(ids) > 0
                        ? " (their contents are the same)"
                        : "; their contents were not recorded, so they may differ");
}

/* checkpoint.load: "latest" (the newest in checkpoint.dir; none yet means a fresh start,
 * so a requeued job script can always pass it) or a checkpoint directory. Rank 0 looks
 * and every rank loads what it found (ranks that looked each for themselves could see
 * different directories, on an unshared or caching file system, and part ways).
 * Collective. */
ts_status ts_trainer_load_checkpoint(ts_trainer *t)
{
    const ts_checkpoint_config *k = &t->cfg.checkpoint;
    if (!k->load[0]) return TS_OK;
    int found = 1;
    ts_status st = TS_OK;
    if (t->groups->world.rank == 0) {
        if (!strcmp(k->load, "latest")) {
            char latest[TS_PATH_MAX + 16];
            snprintf(latest, sizeof latest, "%s/latest", k->dir);
            found = access(latest, F_OK) == 0 || ts_ckpt_newest_step(k->dir) >= 0;
            if (!found)
                ts_log_info("checkpoint: none in %s yet; starting at step 0", k->dir);
            else
                st = ts_ckpt_resolve(k->dir, t->loaded_from, sizeof t->loaded_from);
        } else {
            st = ts_ckpt_resolve(k->load, t->loaded_from, sizeof t->loaded_from);
        }
    }
    const ts_comm *world = &t->groups->world;
    if (ts_comm_agree(world, st != TS_OK ? ts_error_prefix("checkpoint.load: ") : TS_OK) != TS_OK)
        return TS_ERR;
    ts_host_broadcast(world, &found, sizeof found, 0);
    if (!found) return TS_OK;
    ts_host_broadcast(world, t->loaded_from, sizeof t->loaded_from, 0);
    const double t0 = ts_now_ms();
    ts_ckpt_load_args a = {.cfg = &t->cfg, .model = &t->model, .optim = &t->optim,
                           .muon = t->use_muon ? &t->muon : NULL, .world = world};
    /* ZeRO-3: the files hold whole tensors; read into every chunk's buffer, then keep
     * this rank's pieces (a transient of the rank's full weights). */
    ts_zero_materialize(&t->zero, TS_ZERO_ALLOCATE);
    ts_status ld = ts_ckpt_load(&a, t->loaded_from, &t->start_step);
    ts_zero_dematerialize(&t->zero, ld == TS_OK);
    if (ld != TS_OK) return TS_ERR;
    /* Every rank read the same state.json: the same step (checked, not assumed). */
    int lo = t->start_step, hi = t->start_step;
    ts_host_allreduce_min_i32(&t->groups->world, &lo, 1);
    ts_host_allreduce_max_i32(&t->groups->world, &hi, 1);
    st = TS_OK;
    if (lo != hi)
        st = ts_fail("checkpoint.load: the ranks read different steps (%d to %d) from %s: is "
                     "the file system shared and coherent on every node?",
                     lo, hi, t->loaded_from);
    else if (t->start_step > t->cfg.train.steps)
        st = ts_fail("checkpoint.load: %s has already run %d steps, more than train.steps = %d; "
                     "raise train.steps to train on",
                     t->loaded_from, t->start_step, t->cfg.train.steps);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK) return TS_ERR;
    /* The learning rate continues the checkpoint's schedule: a resumed run whose
     * schedule differs (a longer train.steps stretches the cosine and re-warms the
     * rate) is refused with both, unless train.allow_schedule_change says it is meant. */
    /* What the checkpoint records of its run, read once for both checks below. */
    ts_ckpt_reader r;
    st = ts_ckpt_reader_open(&r, t->loaded_from);
    const bool opened = st == TS_OK;
    ts_lr_schedule was;
    const ts_lr_schedule now = t->lr_schedule;
    memset(&was, 0, sizeof was);
    if (opened) was = r.lr_schedule;
    /* The data position and train.batch_rampup first (rampup.c): a ramp-up counts the
     * learning rate's steps in samples. */
    if (opened) st = ts_trainer_rampup_resume(t, r.batch_rampup, r.sequences_consumed);
    /* Compared on the steps this run takes (a constant rate stretched over another
     * length is the same rate). */
    const int at = opened && st == TS_OK ? ts_trainer_rampup_lr_diverges(
                                               t, &was, &now, t->start_step, t->cfg.train.steps)
                                         : -1;
    if (st != TS_OK) {
        /* the ramp-up refused the resume */
    } else if (at >= 0 && !t->cfg.train.allow_schedule_change) {
        char a[160], b[160];
        st = ts_fail("checkpoint.load: %s ran the learning-rate schedule \"%s\", but this run "
                     "has \"%s\": resuming would change the learning rate from step %d on "
                     "(%g instead of %g); keep the schedule (train.lr_decay_steps = %d keeps its "
                     "length when train.steps grows), or set train.allow_schedule_change = true",
                     t->loaded_from, ts_lr_schedule_describe(&was, a, sizeof a),
                     ts_lr_schedule_describe(&now, b, sizeof b), at,
                     ts_trainer_rampup_lr(t, &now, at), ts_trainer_rampup_lr(t, &was, at),
                     was.length);
    } else if (at >= 0 && t->groups->world.rank == 0) {
        char a[160], b[160];
        ts_log_warn("checkpoint: the learning-rate schedule changes on resuming (train."
                    "allow_schedule_change): was %s, now %s",
                    ts_lr_schedule_describe(&was, a, sizeof a),
                    ts_lr_schedule_describe(&now, b, sizeof b));
    }
    if (st == TS_OK && opened) st = check_data_order(t, r.state);
    /* train.skip_spikes: its window as the run left it, so the steps after decide as
     * they would have (spike_guard.h); the same record on every rank. */
    if (st == TS_OK && opened)
        st = ts_spike_guard_restore(&t->spike, json_object_get(r.state, "spike_guard"),
                                    t->loaded_from);
    if (st == TS_OK && t->groups->world.rank == 0) compare_data(t, r.state);
    if (opened) ts_ckpt_reader_close(&r);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK) return TS_ERR;
    if (t->groups->world.rank == 0)
        ts_log_info("checkpoint: loaded %s (step %d) in %.2f s; continuing at step %d",
                    t->loaded_from, t->start_step, (ts_now_ms() - t0) * 1e-3, t->start_step);
    return TS_OK;
}

/* Commit the asynchronous save in flight (waiting for its writes) and report it. */
ts_status ts_trainer_finish_save(ts_trainer *t)
{
    if (!t->saving) return TS_OK;
    double ms = 0.0;
    ts_status st = ts_ckpt_save_finish(t->saving, &ms);
    t->saving = NULL;
    if (st != TS_OK) return TS_ERR;
    double blocked = t->saving_blocked_ms + ms, total = ts_now_ms() - t->saving_t0_ms;
    ts_host_allreduce_max_f64(&t->groups->world, &blocked, 1);
    /* The weights and the optimizer state: AdamW's two moments, a Muon matrix's one
     * momentum (layout.h). */
    double bytes = 3.0 * (double)ts_model_logical_params(&t->cfg.model) * sizeof(float);
    if (ts_config_muon(&t->cfg.train)) {
        ts_ckpt_layout L;
        ts_ckpt_layout_build(&L, &t->cfg.model, t->cfg.checkpoint.file_gb, true);
        for (int p = 0; p < L.n_logical; p++)
            if (L.muon[p]) bytes -= (double)ts_ckpt_entry_of(&L, TS_CK_EXP_AVG, p)->bytes;
        ts_ckpt_layout_free(&L);
    }
    if (t->groups->world.rank == 0)
    {
        if (t->saving_async)
            ts_log_info("checkpoint: saved %s/step_%08d (%.1f MB) in the background, committed "
                        "%.2f s after it started; training was blocked for %.2f s",
                        t->cfg.checkpoint.dir, t->saving_step, bytes / 1e6, total * 1e-3,
                        blocked * 1e-3);
        else
            ts_log_info("checkpoint: saved %s/step_%08d (%.1f MB) in %.2f s (%.2f GB/s); "
                        "training was blocked for that long",
                        t->cfg.checkpoint.dir, t->saving_step, bytes / 1e6, total * 1e-3,
                        bytes / (total * 1e6));
    }
    /* Rank 0 writes the line: agreed, so its failure stops every rank. */
    return ts_comm_agree(&t->groups->world,
                         ts_trainer_metrics_line(t, "{\"checkpoint_step\":%d,\"save_ms\":%.1f,"
                                         "\"blocked_ms\":%.1f,\"save_bytes\":%.0f}",
                                      t->saving_step, total, blocked, bytes));
}

/* Save the state after `step` completed steps into checkpoint.dir (collective): at
 * once, or with checkpoint.async (and `may_defer`) start it and commit it at a later
 * step once every rank has written its part. */
/* Rank 0 claims checkpoint.dir (checkpoint/claim.h) before anything is loaded or
 * trained, so an unusable or busy directory fails the run now, not at its first save.
 * Collective; agreed. */
ts_status ts_trainer_claim_checkpoint_dir(ts_trainer *t)
{
    const ts_checkpoint_config *k = &t->cfg.checkpoint;
    ts_status st = TS_OK;
    if (!k->dir[0]) return TS_OK;
    if (t->groups->world.rank == 0)
        st = ts_ckpt_claim_dir(&t->claim, k->dir, t->topo->host, !k->load[0], k->overwrite);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK) return TS_ERR;
    /* Every rank must see the directory rank 0 locked (probe D11: on node-local disks a
     * stale .tmp-step_N on another node let a corrupt checkpoint commit as a success). */
    char token[sizeof t->claim.token];
    memcpy(token, t->claim.token, sizeof token);
    ts_host_broadcast(&t->groups->world, token, sizeof token, 0);
    const int rank = t->groups->world.rank;
    st = rank == 0 ? TS_OK : ts_ckpt_claim_check_shared(k->dir, token, rank);
    return ts_comm_agree(&t->groups->world, st);
}

/* Whether every rank's weights and optimizer state (AdamW's moments, Muon's momentum)
 * are finite (collective). Their sums in double: a float input cannot overflow them, so
 * only an inf or a NaN makes one non-finite. */
static bool state_finite(ts_trainer *t)
{
    const ts_kernels *k = t->k;
    double *acc = k->dev_alloc(sizeof(double)), sum = 0.0;
    k->memset_zero(acc, sizeof(double));
    if (t->model.param_mem && t->model.num_floats > 0)
        k->sum_into(acc, t->model.param_mem, t->model.num_floats);
    else if (t->zero.master && t->zero.n_shard_floats > 0) /* ZeRO-3's pieces */
        k->sum_into(acc, t->zero.master, t->zero.n_shard_floats);
    if (t->optim.n_floats > 0) { /* a ZeRO-1 shard may hold none */
        k->sum_into(acc, t->optim.m, t->optim.n_floats);
        k->sum_into(acc, t->optim.v, t->optim.n_floats);
    }
    if (t->use_muon && t->muon.n_floats > 0) k->sum_into(acc, t->muon.momentum, t->muon.n_floats);
    k->memcpy_d2h(&sum, acc, sizeof sum);
    k->dev_free(acc);
    int bad = !isfinite(sum);
    ts_host_allreduce_max_i32(&t->groups->world, &bad, 1);
    return !bad;
}

ts_status ts_trainer_save_checkpoint(ts_trainer *t, int step, bool may_defer)
{
    if (ts_trainer_finish_save(t) != TS_OK) return TS_ERR; /* one save at a time */
    /* A diverged state is never committed: it would become `latest` and prune the good
     * checkpoints before it. */
    ts_watchdog_context("checkpoint: checking the state is finite", 0, 0, 0);
    if (!state_finite(t))
        return ts_fail("checkpoint: the weights or optimizer moments after step %d are not "
                       "finite; nothing was saved and %s keeps its checkpoints; lower "
                       "train.lr or check the data",
                       step, t->cfg.checkpoint.dir);
    int set_files[TS_MAX_DATASETS];
    for (int d = 0; d < t->train_data.n_sets; d++) set_files[d] = t->train_data.sets[d].n_shards;
    /* The blend's cursor at this step, which a resume restores (ts_blend_restore) rather
     * than replaying every sequence before it. The sampler's is normally there already
     * (at the end of step - 1); a copy moves, so the sampler's cached step stays. */
    ts_blend cursor = t->train_data.blend;
    const int64_t consumed = ts_trainer_rampup_consumed(t, step);
    ts_blend_seek(&cursor, (uint64_t)consumed);
    ts_ckpt_save_args a = {.cfg = &t->cfg, .model = &t->model, .optim = &t->optim,
                           .muon = t->use_muon ? &t->muon : NULL, .world = &t->groups->world, .replica = t->groups->replica.rank,
                           .replicas = t->groups->replica.size,
                           .expert_replica = t->groups->edp.rank,
                           .expert_replicas = t->groups->edp.size,
                           .step = step,
                           .sequences_consumed = consumed,
                           .staging = &t->staging, .n_data = t->n_data,
                           .data_tokens = t->data_tokens, .data_crc = t->data_crc,
                           .n_sets = t->train_data.n_sets, .set_files = set_files,
                           .set_weights = cursor.weight, .set_counts = cursor.count,
                           .claim = t->groups->world.rank == 0 ? &t->claim : NULL};
    /* The MoE bias as it stands after `step` steps (an asynchronous save commits later). */
    float *moe_bias = NULL;
    if (t->model.moe_experts > 0) {
        a.moe_bias_n = (size_t)ts_model_blocks(&t->model) * t->model.moe_experts;
        moe_bias = ts_malloc(a.moe_bias_n * sizeof(float));
        t->model.k->memcpy_d2h(moe_bias, t->model.moe_bias, a.moe_bias_n * sizeof(float));
        a.moe_bias = moe_bias;
    }
    /* train.skip_spikes: the guard's window after `step` steps, for state.json. */
    json_t *extra = NULL, *spike = ts_spike_guard_state(&t->spike);
    if (spike) {
        extra = json_object();
        json_object_set_new(extra, "spike_guard", spike);
    }
    a.extra = extra;
    const bool async = t->cfg.checkpoint.async && may_defer;
    t->saving_async = async;
    t->saving_t0_ms = ts_now_ms();
    t->saving_step = step;
    /* ZeRO-3: the files hold whole tensors, as from any other level; the weights are
     * gathered for the save (written or staged before ts_ckpt_save_start returns). */
    ts_watchdog_context("checkpoint: gathering the ZeRO-3 weights", 0, 0, 0);
    ts_zero_materialize(&t->zero, TS_ZERO_GATHER_EXACT);
    ts_status st = ts_ckpt_save_start(&a, async, &t->saving, &t->saving_blocked_ms);
    free(moe_bias); /* the saver keeps its own copies */
    json_decref(extra);
    ts_zero_dematerialize(&t->zero, false);
    if (st != TS_OK) return TS_ERR;
    return async ? TS_OK : ts_trainer_finish_save(t);
}
