/* The training run (trainer.h): init, one step, the loop, free. ts_trainer_step and
 * the functions it calls are the whole step; set-up (setup.c), reporting (report.c) and
 * the checkpoint glue (checkpointing.c) live in the files named for them. */
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/load.h"
#include "core/log.h"
#include "core/signals.h"
#include "core/sysmem.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "optim/optim.h"
#include "train/internal.h"

/* The trainer's observers: with log.trace its trace, which the engine's actions go to,
 * and on the topology's groups the tp and cp groups' time for the step statistics and,
 * with log.trace, every collective of the replica, tp and cp groups on this rank's
 * communication track. Off again in ts_trainer_free: the groups outlive the trainer. */
static void observe(ts_trainer *t, bool on)
{
    if (on && t->cfg.log.trace[0]) {
        t->tracing = true;
        ts_trace_init(&t->trace);
        t->engine.trace = &t->trace;
        t->engine.trace_t0_ms = t->t0_ms;
    }
    ts_groups *g = t->groups;
    g->tp.busy_ms = on ? &t->tp_busy_ms : NULL;
    g->cp.busy_ms = on ? &t->cp_busy_ms : NULL;
    const bool trace = on && t->tracing;
    g->replica.on_span = trace ? ts_trainer_on_replica_span : NULL;
    g->tp.on_span = trace ? ts_trainer_on_tp_span : NULL;
    g->cp.on_span = trace ? ts_trainer_on_cp_span : NULL;
    g->replica.on_span_ctx = g->tp.on_span_ctx = g->cp.on_span_ctx = trace ? t : NULL;
    if (t->model.moe_dispatch) { /* the model's: built by now, freed after */
        t->model.moe_dispatch->on_span = trace ? ts_trainer_on_a2a_span : NULL;
        t->model.moe_dispatch->on_span_ctx = trace ? t : NULL;
    }
}

/* Data parallelism (src/data): the ZeRO state's layout (its chunks, with ZeRO-2/3), the
 * group sums, and the gradient reducer over the replica group; each installs its own
 * hooks in the engine and the model. `level` is the ZeRO level the model was built for. */
static ts_status setup_data_parallel(ts_trainer *t, int level)
{
    const ts_config *cfg = &t->cfg;
    const ts_zero_layout zl = {&t->sched, t->topo->coords.pp, t->part.first_layer,
                               t->part.n_chunk_layers};
    ts_zero_init(&t->zero, &t->model, &t->groups->replica, cfg->parallel.zero, &zl);
    TS_ASSERT(t->zero.level == level);
    ts_group_sums_init(&t->sums, &t->model, &t->groups->embed, &t->groups->kv);
    /* Every dense parameter reduces over the replica group; under expert parallelism
     * an expert's over the ranks holding the same experts, edp (its other replicas
     * hold other experts). The choice is read by ts_reducer_init only. */
    const ts_comm **param_group = NULL;
    if (t->model.moe_ep > 1 || t->model.moe_etp > 1) {
        param_group = ts_calloc((size_t)t->model.n_params, sizeof *param_group);
        for (int p = 0; p < t->model.n_params; p++)
            if (t->model.params[p].expert) param_group[p] = &t->groups->edp;
    }
    /* Muon: each of its matrices kept whole in one member's piece (data/muon_dist.h). */
    double *whole_cost = ts_config_muon(&cfg->train) ? ts_muon_whole_costs(&t->model) : NULL;
    ts_reducer_args ra = {.group = &t->groups->replica,
                          .param_group = param_group,
                          .sums = &t->sums,
                          .bucket_bytes = (size_t)cfg->parallel.bucket_mb << 20,
                          .overlap = cfg->parallel.overlap_grad_sync,
                          .whole_cost = whole_cost};
    ts_zero_reducer_args(&t->zero, &ra);
    ts_reducer_init(&t->reducer, &t->model, &ra);
    free(param_group);
    free(whole_cost);
    const bool thread = strcmp(cfg->parallel.grad_sync_progress, "thread") == 0;
    ts_status st = ts_reducer_attach(&t->reducer, &t->engine, &t->model, thread);
    if (st == TS_OK) {
        ts_zero_attach(&t->zero, &t->reducer, &t->engine, &t->optim);
        ts_trainer_optimizer_init(t);
    }
    return st;
}

/* The weights: initialised by index (ZeRO-3 a chunk at a time), or read from model.init
 * (ZeRO-3 into every chunk's buffer, then its pieces kept), upcycled from a dense model's
 * with model.init_upcycle. */
static ts_status init_weights(ts_trainer *t)
{
    if (!t->cfg.model.init[0]) {
        ts_zero_init_weights(&t->zero, (uint64_t)t->cfg.train.seed);
        return TS_OK;
    }
    ts_zero_materialize(&t->zero, TS_ZERO_ALLOCATE);
    const ts_model_config *mc = &t->cfg.model;
    ts_status st = mc->init_upcycle
                       ? ts_ckpt_load_model_upcycle(&t->model, mc->init, (uint64_t)t->cfg.train.seed)
                       : ts_ckpt_load_model_init(&t->model, mc->init);
    ts_zero_dematerialize(&t->zero, st == TS_OK);
    return st;
}

/* Rank 0's start-up lines on the pipeline: the partition and the schedule's placement. */
static void log_pipeline(const ts_trainer *t)
{
    if (t->groups->world.rank != 0 || t->part.n_chunks <= 1) return;
    char *d = ts_partition_describe(&t->part, t->sched.chunk_rank), where[512];
    ts_log_info("%s", d);
    free(d);
    ts_log_info("schedule %s, %s", t->sched.name,
                ts_placement_describe(&t->sched, where, sizeof where));
}

/* This rank's chunks of the model, laid out once from one spec (model/model.h): its
 * tensor- and context-parallel groups, selective recompute (every layer, or the layers of
 * the chunks auto's memory check chose, so the layout is the one it counted), and the
 * full-size buffers the ZeRO level keeps (`level`: zero with more than one replica):
 * ZeRO-2 no gradients, ZeRO-3 no weights either. */
static void build_model(ts_trainer *t, int level)
{
    const ts_config *cfg = &t->cfg;
    const ts_topology *topo = t->topo;
    bool *owned = ts_calloc((size_t)cfg->model.n_layer + 2, sizeof(bool));
    ts_partition_owned(&t->part, t->sched.chunk_rank, topo->coords.pp, owned);
    bool *selective = ts_calloc((size_t)cfg->model.n_layer + 2, sizeof(bool));
    for (int c = 0; t->recompute_selective && c < t->sched.n_chunks; c++)
        if (ts_chunk_rank(&t->sched, c) == topo->coords.pp && t->recompute_selective[c])
            for (int l = 0; l < t->part.n_chunk_layers[c]; l++)
                selective[t->part.first_layer[c] + l] = true;
    const ts_model_spec spec = {
        .arch = &cfg->model, .k = t->k, .owned = owned,
        .tp = ts_tp_make(cfg->parallel.tp, topo->coords.tp, &t->groups->tp, t->k),
        .sequence_parallel = cfg->parallel.sequence_parallel,
        .tp_overlap = cfg->parallel.tp_overlap,
        .cp = ts_cp_make(cfg->parallel.cp, topo->coords.cp, &t->groups->cp, t->k,
                         cfg->model.seq_len),
        .selective_all =
            ts_recompute_from_name(cfg->parallel.recompute) == TS_RECOMPUTE_SELECTIVE,
        .selective = selective,
        .without_weights = level >= 3,
        .without_grads = level >= 2,
        .moe_z_loss = (float)cfg->train.moe_z_loss,
        .moe_aux_loss = (float)cfg->train.moe_aux_loss,
        .ep = cfg->model.moe_experts > 0 ? &t->groups->ep : NULL,
        .ep_overlap = cfg->parallel.ep_overlap,
        .etp = cfg->model.moe_experts > 0 ? &t->groups->etp : NULL,
        .mtp_loss = cfg->train.mtp_loss,
        .document_mask = cfg->data.document_mask,
        .document_token = ts_config_document_token(cfg)};
    ts_model_build(&t->model, &spec);
    free(selective);
    free(owned);
}

static ts_status trainer_init(ts_trainer *t, const ts_config *cfg, ts_topology *topo,
                              bool eval_only)
{
    memset(t, 0, sizeof *t);
    t->eval_only = eval_only;
    t->cfg = *cfg;
    t->topo = topo;
    t->t0_ms = ts_now_ms();
    ts_watchdog_context("setup: partition, schedule, model, data and pipeline", 0, 0, 0);
    t->groups = &topo->groups;
    ts_lr_schedule_of(&cfg->train, &t->lr_schedule);
    ts_spike_guard_init(&t->spike, cfg->train.skip_spikes, cfg->train.spike_window);
    /* Every failure below is agreed across ranks, so every rank leaves by `fail`. */
    if (ts_comm_agree(&t->groups->world, ts_trainer_select_device(t)) != TS_OK) goto fail;
    /* checkpoint.dir first: a busy or unusable directory fails the run before the costly
     * set-up below (layer-cost measurement, model init, the data's checksums). */
    if (ts_trainer_claim_checkpoint_dir(t) != TS_OK) goto fail;
    /* train.batch_rampup: every batch it names must run on the schedule (rampup.c). */
    if (ts_comm_agree(&t->groups->world, ts_trainer_rampup_init(t)) != TS_OK) goto fail;

    /* The schedule, then the memory check on the modelled partition before anything
     * large is allocated (measuring the layer costs allocates a layer of each kind),
     * then the measured partition and the check again on the cut that will run. */
    ts_status st = ts_schedule_build(&t->sched, cfg->parallel.schedule, cfg->parallel.pp,
                                     cfg->parallel.virtual_stages, ts_config_num_microbatches(cfg));
    if (st == TS_OK) st = ts_partition_build(cfg, false, &t->part);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK || ts_trainer_check_memory(t, false) != TS_OK)
        goto fail;
    ts_partition_free(&t->part);
    st = ts_trainer_build_partition(t);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK || ts_trainer_check_memory(t, true) != TS_OK)
        goto fail;

    /* This rank's chunks of the model (its weights come below), the data, and the engine
     * that runs the schedule over them. */
    const int level = t->groups->replica.size > 1 ? cfg->parallel.zero : 0;
    build_model(t, level);
    st = ts_trainer_open_data(t);
    if (st == TS_OK)
        st = ts_engine_init(&t->engine, &t->cfg, &t->model, &t->sched, &t->part, &t->train_data,
                            &t->groups->pp, topo->coords.dp, t->recompute_keep);
    if (ts_comm_agree(&t->groups->world, st) != TS_OK ||
        (!eval_only && ts_comm_agree(&t->groups->world, ts_trainer_agree_data(t)) != TS_OK))
        goto fail;
    if (t->groups->world.rank == 0 && !eval_only) ts_trainer_log_data(t);

    /* Data parallelism, the weights, then a checkpoint, which replaces the initial
     * weights and moments; then the outputs (a resumed run appends to its metrics file)
     * and the BLAS report, the metrics' first line. */
    if (ts_comm_agree(&t->groups->world, setup_data_parallel(t, level)) != TS_OK ||
        ts_comm_agree(&t->groups->world, init_weights(t)) != TS_OK ||
        ts_trainer_load_checkpoint(t) != TS_OK ||
        ts_comm_agree(&t->groups->world, ts_trainer_open_outputs(t)) != TS_OK ||
        ts_comm_agree(&t->groups->world, ts_trainer_open_tensorboard(t)) != TS_OK ||
        ts_trainer_report_blas(t) != TS_OK)
        goto fail;
    ts_model_refresh_compute(&t->model); /* the weights the first forward reads */
    observe(t, true);
    log_pipeline(t);
    return TS_OK;

fail:
    ts_trainer_free(t);
    return TS_ERR;
}

ts_status ts_trainer_init(ts_trainer *t, const ts_config *cfg, ts_topology *topo)
{
    return trainer_init(t, cfg, topo, false);
}

ts_status ts_trainer_init_eval(ts_trainer *t, const ts_config *cfg, ts_topology *topo)
{
    return trainer_init(t, cfg, topo, true);
}

void ts_trainer_free(ts_trainer *t)
{
    if (t->groups) observe(t, false); /* the groups outlive the trainer */
    if (t->saving) ts_ckpt_save_abandon(t->saving); /* the run failed mid-save */
    ts_ckpt_claim_release(&t->claim);
    free(t->staging.mem);
    if (t->metrics) fclose(t->metrics);
    ts_tfevents_close(&t->tboard);
    free(t->step_max);
    free(t->straggler_sum);
    if (t->tracing) ts_trace_free(&t->trace);
    ts_zero_free(&t->zero); /* before the reducer: it frees the segments' buffers */
    ts_reducer_free(&t->reducer);
    ts_group_sums_free(&t->sums);
    ts_adamw_free(&t->optim);
    ts_muon_dist_free(&t->muon_dist); /* before the state it points at */
    ts_muon_free(&t->muon);
    ts_engine_free(&t->engine);
    if (t->has_train) ts_sampler_close(&t->train_data);
    free(t->data_tokens);
    free(t->data_crc);
    if (t->has_val) ts_data_close(&t->val_data);
    if (t->has_hellaswag) ts_hellaswag_free(&t->hellaswag);
    ts_model_free(&t->model);
    ts_schedule_free(&t->sched);
    ts_partition_free(&t->part);
    free(t->recompute_keep);
    free(t->recompute_selective);
    free(t->moe_counts);
    ts_spike_guard_free(&t->spike);
    memset(t, 0, sizeof *t);
}

/* Sum of a double over the whole grid (losses, squared norms, bubbles). */
static double grid_sum(const ts_trainer *t, double local)
{
    ts_host_allreduce_sum_f64(&t->groups->world, &local, 1);
    return local;
}

/* The MoE blocks' step (model.h ts_model_moe_*): their routed-token counts and loss sums
 * over the whole grid (each token is one rank's in each block, tp rank 0's of its group,
 * or under sequence parallelism the tp rank holding its row),
 * the balancing bias moved from them, identically on every rank, and the metrics. */
static void moe_step_end(ts_trainer *t, ts_step_stats *out)
{
    ts_model *m = &t->model;
    out->moe = m->moe_experts > 0;
    out->moe_counts = NULL;
    out->a2a = m->moe_dispatch != NULL; /* the same on every rank: ep > 1 */
    out->a2a_ms = out->a2a_wait_ms = out->a2a_hidden = 0.0;
    if (!out->moe) return;
    const size_t n = (size_t)ts_model_blocks(m) * m->moe_experts;
    if (!t->moe_counts) t->moe_counts = ts_malloc(n * sizeof(int)); /* kept for the report */
    int *counts = t->moe_counts;
    double *sums = ts_malloc((n + 4) * sizeof(double));
    float losses[2];
    ts_model_moe_read(m, counts, losses);
    /* The tp ranks run the MoE replicated (moe.c): tp rank 0's count once; under
     * sequence parallelism each routes its own rows: every rank's. */
    const double once = m->tp.rank == 0 || m->tp.sp ? 1.0 : 0.0;
    for (size_t i = 0; i < n; i++) sums[i] = once * counts[i];
    sums[n] = once * losses[0];
    sums[n + 1] = once * losses[1];
    /* The ep exchanges' time, start to completion, and the part blocked in their
     * finishes, this rank's (the step's maxima taken with the other comm times) and
     * summed: the share hidden is every rank's. */
    if (m->moe_dispatch)
        ts_expert_dispatch_take_times(m->moe_dispatch, &out->a2a_ms, &out->a2a_wait_ms);
    sums[n + 2] = out->a2a_ms;
    sums[n + 3] = out->a2a_wait_ms;
    ts_host_allreduce_sum_f64(&t->groups->world, sums, (int)(n + 4));
    if (sums[n + 2] > 0) {
        const double hidden = 1.0 - sums[n + 3] / sums[n + 2];
        out->a2a_hidden = hidden < 0 ? 0.0 : hidden > 1 ? 1.0 : hidden;
    }
    for (size_t i = 0; i < n; i++) counts[i] = (int)sums[i];
    const long long tokens = (long long)t->step_batch * t->cfg.model.seq_len; /* the step's */
    /* A skipped step (non-finite loss or norm, or a spike) changes nothing, the bias
     * included. */
    if (!out->skipped && !out->spike.skip)
        ts_model_moe_update_bias(m, counts, tokens, (float)t->cfg.train.moe_bias_rate);
    out->moe_z_loss = sums[n];
    out->moe_aux_loss = sums[n + 1];
    out->moe_max_load = ts_moe_worst_load(m, counts);
    out->moe_dropped = ts_moe_dropped_share(m, counts, tokens);
    out->moe_counts = counts;
    free(sums);
}

void ts_trainer_step(ts_trainer *t, int step, ts_step_stats *out)
{
    const ts_config *c = &t->cfg;
    /* B: the step's global batch, train.global_batch or train.batch_rampup's (set with
     * the step's first sequence and schedule by ts_trainer_rampup_step). */
    const int B = t->step_batch, T = c->model.seq_len;
    double t0 = ts_now_ms();

    /* Forward and backward of every micro-batch, as the schedule orders them. Every
     * target of the global batch weighs 1/(B*T), so summing over micro-batches and
     * replicas gives the gradient of the mean loss. */
    if (t->model.grad_mem) /* ZeRO-2/3 zero each chunk's buffer as it is allocated */
        t->model.k->memset_zero(t->model.grad_mem, t->model.num_floats * sizeof(float));
    t->tp_busy_ms = 0.0;
    t->cp_busy_ms = 0.0;
    ts_reducer_begin(&t->reducer);
    ts_zero_begin(&t->zero);
    ts_model_moe_begin(&t->model);
    ts_model_mtp_begin(&t->model);
    if (t->model.moe_dispatch) { /* the step's exchanges only (not a validation's) */
        double a2a_ms, wait_ms;
        ts_expert_dispatch_take_times(t->model.moe_dispatch, &a2a_ms, &wait_ms);
    }
    ts_engine_run(&t->engine, step, t->step_seq0, B);

    double t1 = ts_now_ms();
    /* The replicas' reduction and the group sums (sharded, the sums first, then their
     * tensors' reduce-scatter: data/reducer.h). */
    ts_watchdog_context("data-parallel gradient sync and tied-embedding sync", 0, 0, 0);
    ts_reducer_finish(&t->reducer);
    double t2 = ts_now_ms();
    ts_trainer_trace_span(t, "dpsync", t1, t2);

    /* Each logical gradient element once over the grid: dp replicas hold identical
     * gradients, so dp rank 0 counts them, or with ZeRO-1 every dp rank its own shard;
     * the tied copy of the embedding and the tp-replicated parameters off tp rank 0 are
     * skipped inside. The loss too: every tp rank of the last stage holds the same
     * losses, so tp rank 0's count. */
    ts_watchdog_context("gradient norm and optimizer step", 0, 0, 0);
    const bool counts = ts_reducer_counts_norm(&t->reducer);
    double sumsq = 0.0;
    if ((t->model.moe_ep > 1 || t->model.moe_etp > 1) && !t->reducer.sharded) {
        /* Expert parallelism: an expert's gradient (or its etp slice's) is this (ep, etp)
         * rank's alone, the same on its edp group: edp rank 0 counts it, replica rank 0
         * the dense ones. */
        if (counts) sumsq += ts_adamw_grad_sum_squares_of(&t->optim, &t->model, false);
        if (t->groups->edp.rank == 0)
            sumsq += ts_adamw_grad_sum_squares_of(&t->optim, &t->model, true);
    } else if (counts) {
        sumsq = ts_adamw_grad_sum_squares(&t->optim, &t->model);
    }
    double norm = sqrt(grid_sum(t, sumsq));
    out->loss = grid_sum(t, ts_tp_once(&t->model.tp, t->engine.loss_sum)) / ((double)B * T);
    /* Multi-token prediction's depths, as the loss: the last stage's tp rank 0 each. */
    out->mtp_depths = t->model.mtp_layers;
    bool mtp_finite = true;
    if (out->mtp_depths > 0) {
        TS_ASSERT(out->mtp_depths <= (int)(sizeof out->mtp_loss / sizeof out->mtp_loss[0]));
        ts_model_mtp_read(&t->model, out->mtp_loss);
        for (int k = 0; k < out->mtp_depths; k++)
            out->mtp_loss[k] = ts_tp_once(&t->model.tp, out->mtp_loss[k]);
        ts_host_allreduce_sum_f64(&t->groups->world, out->mtp_loss, out->mtp_depths);
        for (int k = 0; k < out->mtp_depths; k++) {
            out->mtp_loss[k] /= (double)B * T;
            mtp_finite &= isfinite(out->mtp_loss[k]) != 0;
        }
    }
    /* A non-finite loss or norm (every rank sees the same sums) never reaches the
     * weights: the update is dropped, and train.on_nonfinite says whether the run stops
     * (ts_trainer_run) or goes on with the next step. Otherwise AdamW on this rank's
     * ranges, and with ZeRO-1 the all-gather of the updated parameters. */
    out->skipped = !isfinite(norm) || !isfinite(out->loss) || !mtp_finite;
    /* train.skip_spikes: a finite step whose loss or norm spikes above its window is not
     * applied either, its batch consumed (spike_guard.h); decided from these global
     * values alone, so alike on every rank. */
    out->spike = ts_spike_guard_step(&t->spike, step, !out->skipped,
                                     out->loss, norm);
    const bool apply = !out->skipped && !out->spike.skip;
    /* The bias moves with every step the data saw, as the counts were made by its
     * selection (DeepSeek-V3 updates it per step, apart from the optimizer). */
    moe_step_end(t, out);
    double lr = ts_trainer_rampup_lr(t, &t->lr_schedule, step);
    out->muon = t->use_muon;
    out->update_rms_muon = out->update_rms_adamw = 0.0;
    out->muon_ms = 0.0;
    double gather_ms = 0.0;
    if (apply) {
        ts_trainer_optimizer_step(t, lr, ts_clip_coef(norm, c->train.grad_clip), step + 1, out);
        if (t->reducer.sharded) ts_watchdog_context("ZeRO parameter all-gather", 0, 0, 0);
        const double g0 = ts_now_ms();
        ts_zero_gather_params(&t->zero);
        gather_ms = ts_now_ms() - g0;
        ts_model_refresh_compute(&t->model); /* bf16: the next step's compute weights */
    }
    double t3 = ts_now_ms();
    ts_trainer_trace_span(t, "optim", t2, t3);

    /* Idle fraction of the pipeline's makespan: the longest span of actions among this
     * rank's pipeline group (every rank starts the step together, released by the last
     * step's collectives); replicas in other pipelines do not count. */
    ts_watchdog_context("step statistics", 0, 0, 0);
    double makespan = t->engine.span_ms;
    ts_host_allreduce_max_f64(&t->groups->pp, &makespan, 1);
    double busy = makespan > 0 ? t->engine.compute_ms / makespan : 1.0;
    /* The idle fractions' sum and, with packed documents, the step's attention pairs
     * (each sequence counted by the tp and cp rank 0 of the rank that ran its first
     * chunk): one all-reduce. */
    const bool once = t->model.tp.rank == 0 && t->model.cp.rank == 0;
    double sums[2] = {1.0 - busy, once ? t->engine.doc_pairs : 0.0};
    ts_host_allreduce_sum_f64(&t->groups->world, sums, 2);
    out->bubble = sums[0] / t->groups->world.size;
    out->grad_norm = norm;
    out->lr = lr;
    out->step_ms = ts_now_ms() - t0;
    out->tokens = (long long)B * T;
    out->tokens_per_s = (double)out->tokens / (out->step_ms * 1e-3);
    /* The step's model FLOPs: train.global_batch's scaled to this step's batch
     * (train.batch_rampup); with packed documents attention's by the pairs computed. */
    out->model_flops = t->model_flops * B / t->cfg.train.global_batch;
    if (t->attn_flops_per_pair > 0)
        out->model_flops += t->attn_flops_per_pair * (sums[1] - (double)B * (double)T * T);
    out->dp_overlap = ts_reducer_overlap(&t->reducer);
    /* The longest dp wait (ZeRO-1's all-gather too), tp and cp time: one collective. */
    /* The optimizer's times too (metrics: optim_ms, optim_gather_ms, muon_ms), and every
     * rank's compute and wait time in slots of its own (straggler.c): this rank's time
     * to here less its waits (pipeline idle, tp/cp collectives, ep waits, the dp
     * reduction's and ZeRO's gathers) is its compute. */
    const int world = t->groups->world.size;
    if (!t->step_max) t->step_max = ts_malloc((8 + 2 * (size_t)world) * sizeof(double));
    double *comm_ms = t->step_max;
    const double dp_wait = t->reducer.wait_ms + t->zero.gather_ms;
    const double idle = t->engine.span_ms > t->engine.compute_ms
                            ? t->engine.span_ms - t->engine.compute_ms : 0.0;
    const double waits = idle + t->tp_busy_ms + t->cp_busy_ms + out->a2a_wait_ms + dp_wait;
    const double mine[8] = {dp_wait, t->tp_busy_ms, t->cp_busy_ms, out->a2a_ms,
                            out->a2a_wait_ms, t3 - t2, gather_ms, out->muon_ms};
    memcpy(comm_ms, mine, sizeof mine);
    memset(comm_ms + 8, 0, 2 * (size_t)world * sizeof(double));
    ts_straggler_put(comm_ms + 8, t->groups->world.rank, (t3 - t0) - waits, waits);
    ts_host_allreduce_max_f64(&t->groups->world, comm_ms, 8 + 2 * (size_t)world);
    ts_straggler_step(t, comm_ms + 8, out);
    out->dp_wait_ms = comm_ms[0];
    out->dp_bytes = t->groups->replica.size > 1 ? (double)t->model.num_floats * sizeof(float) : 0.0;
    out->tp_comm_ms = comm_ms[1];
    out->cp_comm_ms = comm_ms[2];
    out->a2a_ms = comm_ms[3];
    out->a2a_wait_ms = comm_ms[4];
    out->optim_ms = comm_ms[5];
    out->optim_gather_ms = comm_ms[6];
    out->muon_ms = comm_ms[7];
}

double ts_trainer_eval(ts_trainer *t, double *mtp_loss)
{
    const int D = t->model.mtp_layers;
    double sums[64];
    const int n = t->cfg.data.val_windows;
    /* ZeRO-3: the forwards need every chunk's weights; gathered for the evaluation. */
    ts_watchdog_context("validation: gathering the ZeRO-3 weights", 0, 0, 0);
    ts_zero_materialize(&t->zero, TS_ZERO_GATHER_COMPUTE);
    double local = ts_engine_eval(&t->engine, &t->val_data, n, sums);
    ts_zero_dematerialize(&t->zero, false);
    ts_watchdog_context("validation: summing the loss", 0, 0, 0);
    const double denom = (double)n * t->cfg.model.seq_len;
    if (D > 0) { /* multi-token prediction's depths, as the loss */
        for (int k = 0; k < D; k++) sums[k] = ts_tp_once(&t->model.tp, sums[k]);
        ts_host_allreduce_sum_f64(&t->groups->world, sums, D);
        for (int k = 0; mtp_loss && k < D; k++) mtp_loss[k] = sums[k] / denom;
    }
    local = ts_tp_once(&t->model.tp, local); /* the tp ranks hold the same losses */
    return grid_sum(t, local) / denom;
}

ts_status ts_trainer_run(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const int steps = c->train.steps;
    const bool saving = c->checkpoint.dir[0] != '\0';
    double total_ms = 0.0;
    int timed = 0;
    /* A stop signal during the set-up (caught since the start: ts_cmd_train): stop
     * before the first step; the checkpoint loaded, if any, is still the newest. */
    int early = ts_stop_signal();
    ts_host_allreduce_max_i32(&t->groups->world, &early, 1);
    if (early) {
        if (t->groups->world.rank == 0)
            ts_log_info("received %s during set-up: stopping before step %d", ts_stop_signal_name(early),
                        t->start_step);
        t->stop_signal = early;
        t->preempted = saving;
        return TS_OK;
    }
    /* The steps' peak memory, without the set-up's transients (step_peak_rss_mb). */
    t->setup_peak_rss = ts_sysmem_peak_rss();
    t->peak_reset = ts_sysmem_reset_peak();
    for (int step = t->start_step; step < steps; step++) {
        ts_step_stats s;
        ts_watchdog_step(step);
        if (ts_trainer_rampup_step(t, step) != TS_OK) return TS_ERR; /* the step's batch */
        ts_trainer_step(t, step, &s);
        if (s.skipped && strcmp(c->train.on_nonfinite, "skip") != 0)
            return ts_fail("%s became %g at step %d: its update was not applied and nothing "
                           "of it is saved; lower train.lr or check the data (train.on_nonfinite "
                           "= \"skip\" drops such steps and goes on)",
                           isfinite(s.loss) ? "the gradient norm" : "the loss",
                           isfinite(s.loss) ? s.grad_norm : s.loss, step);
        if (step > t->start_step) { /* the first step pays for page faults; keep it out of the ETA */
            total_ms += s.step_ms;
            timed++;
        }
        ts_status st = ts_trainer_report_step(t, step, &s, timed ? total_ms / timed : s.step_ms);
        bool last = step == steps - 1;
        if ((t->has_val || t->has_hellaswag) && ((step + 1) % c->data.eval_every == 0 || last)) {
            /* Collective: every rank, whatever st is. One metrics line holds them. */
            char line[40 * 64 + 512] = "", prog[160] = "";
            if (t->has_val) {
                double vm[64];
                double vl = ts_trainer_eval(t, vm);
                snprintf(line, sizeof line, ",\"val_loss\":%.9g", vl);
                /* Multi-token prediction: each depth's validation loss too. */
                for (int k = 0; k < t->model.mtp_layers; k++)
                    snprintf(line + strlen(line), sizeof line - strlen(line), "%s%.9g",
                             k == 0 ? ",\"val_mtp_loss\":[" : ",", vm[k]);
                if (t->model.mtp_layers > 0)
                    snprintf(line + strlen(line), sizeof line - strlen(line), "]");
                snprintf(prog, sizeof prog, " | val_loss %.4f", vl);
            }
            if (t->has_hellaswag) {
                ts_hellaswag_score hs;
                ts_trainer_hellaswag(t, &hs, NULL);
                snprintf(line + strlen(line), sizeof line - strlen(line),
                         ",\"hellaswag_acc\":%.9g,\"hellaswag_acc_norm\":%.9g,"
                         "\"hellaswag_acc_norm_tokens\":%.9g,\"hellaswag_items\":%d",
                         (double)hs.acc / hs.n, (double)hs.acc_norm / hs.n,
                         (double)hs.acc_norm_tokens / hs.n, hs.n);
                snprintf(prog + strlen(prog), sizeof prog - strlen(prog),
                         " | hellaswag acc %.4f acc_norm %.4f (%d items)", (double)hs.acc / hs.n,
                         (double)hs.acc_norm / hs.n, hs.n);
            }
            if (st == TS_OK) st = ts_trainer_metrics_line(t, "{\"step\":%d%s}", step, line);
            ts_log_info("step %5d/%d%s", step, steps, prog);
        }
        /* Rank 0 alone writes the metrics and the events: agree each step (one small
         * all-reduce, only when there is a file), so its failure stops every rank now. */
        if ((c->log.metrics[0] || c->log.tensorboard[0]) &&
            ts_comm_agree(&t->groups->world, st) != TS_OK)
            return TS_ERR;
        ts_straggler_report(t, step);

        /* A stop signal on any rank stops every rank after this step, with a save; an
         * asynchronous save is committed once every rank has written its part. */
        int flags[2] = {ts_stop_signal(), t->saving && !ts_ckpt_save_written(t->saving)};
        ts_host_allreduce_max_i32(&t->groups->world, flags, 2);
        if (t->saving && !flags[1] && ts_trainer_finish_save(t) != TS_OK) return TS_ERR;
        const int stop = flags[0];
        if (stop) {
            if (t->groups->world.rank == 0 && saving)
                ts_log_info("received %s after step %d: saving a checkpoint and stopping",
                            ts_stop_signal_name(stop), step);
            else if (t->groups->world.rank == 0)
                ts_log_warn("received %s after step %d: stopping (nothing saved: no "
                            "checkpoint.dir)",
                            ts_stop_signal_name(stop), step);
            if (saving && ts_trainer_save_checkpoint(t, step + 1, false) != TS_OK) return TS_ERR;
            t->stop_signal = stop;
            t->preempted = saving;
            return TS_OK;
        }
        if (saving && c->checkpoint.every > 0 && (step + 1) % c->checkpoint.every == 0 && !last &&
            ts_trainer_save_checkpoint(t, step + 1, true) != TS_OK)
            return TS_ERR;
    }
    /* The end of every run is saved, unless it is the very checkpoint just loaded. */
    if (saving) {
        char final[TS_PATH_MAX + 64];
        snprintf(final, sizeof final, "%s/step_%08d", c->checkpoint.dir, steps);
        bool same = t->start_step == steps && t->loaded_from[0] && !strcmp(final, t->loaded_from);
        if (!same && ts_trainer_save_checkpoint(t, steps, false) != TS_OK) return TS_ERR;
    }
    ts_watchdog_context("finishing: memory report and trace", 0, 0, 0);
    if (ts_comm_agree(&t->groups->world, ts_trainer_report_memory(t)) != TS_OK) return TS_ERR;
    if (t->tracing) return ts_trainer_write_trace(t);
    return TS_OK;
}
