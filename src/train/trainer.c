#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/log.h"
#include "core/timer.h"
#include "optim/optim.h"

/* Agree on success across ranks: a failure anywhere fails everywhere, and the message
 * of the lowest failing rank is the one rank 0 prints. */
static ts_status agree(ts_status local, MPI_Comm comm, int rank)
{
    int fail_rank = local == TS_OK ? INT32_MAX : rank, first = INT32_MAX;
    MPI_Allreduce(&fail_rank, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == INT32_MAX) return TS_OK;
    char msg[2048] = {0};
    if (rank == first) snprintf(msg, sizeof msg, "%s", ts_error_message());
    MPI_Bcast(msg, sizeof msg, MPI_CHAR, first, comm);
    if (first != 0)
        return ts_fail("on rank %d: %s", first, msg);
    return ts_fail("%s", msg);
}

static ts_status open_data(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const char *paths[TS_MAX_SHARDS];
    for (int i = 0; i < c->data.n_train; i++) paths[i] = c->data.train[i];
    if (ts_data_open(&t->train_data, paths, c->data.n_train, c->model.vocab_size) != TS_OK)
        return TS_ERR;
    if (ts_data_num_windows(&t->train_data, c->model.seq_len) == 0)
        return ts_fail("data.train holds %llu tokens, fewer than one window of seq_len + 1 = %d",
                       (unsigned long long)t->train_data.n_tokens, c->model.seq_len + 1);
    t->has_val = c->data.val[0] != '\0';
    if (t->has_val) {
        const char *vp = c->data.val;
        if (ts_data_open(&t->val_data, &vp, 1, c->model.vocab_size) != TS_OK) return TS_ERR;
        if (ts_data_num_windows(&t->val_data, c->model.seq_len) == 0)
            return ts_fail("data.val (%s) holds fewer than seq_len + 1 = %d tokens", vp,
                           c->model.seq_len + 1);
    }
    return TS_OK;
}

static ts_status open_metrics(ts_trainer *t)
{
    const char *path = t->cfg.log.metrics;
    if (t->rank != 0 || !path[0]) return TS_OK;
    if (ts_mkdir_parent(path) != TS_OK) return ts_error_prefix("log.metrics: ");
    t->metrics = fopen(path, "w");
    if (!t->metrics) return ts_fail("log.metrics: cannot open %s: %s", path, strerror(errno));
    return TS_OK;
}

ts_status ts_trainer_init(ts_trainer *t, const ts_config *cfg, MPI_Comm world)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->world = world;
    MPI_Comm_rank(world, &t->rank);
    MPI_Comm_size(world, &t->world_size);
    t->num_microbatches = ts_config_num_microbatches(cfg);
    if (cfg->parallel.pp != 1 || cfg->parallel.tp != 1) {
        /* Pipeline (step 3) and tensor (step 4) parallelism are not built yet. */
        return ts_fail("parallel.pp = %d and parallel.tp = %d: this build trains with data "
                       "parallelism only (pp = tp = 1); set parallel.dp to the number of ranks",
                       cfg->parallel.pp, cfg->parallel.tp);
    }
    ts_comm_wrap(&t->world_comm, world, "world");
    /* With pp = tp = 1 every rank is one data-parallel replica. */
    ts_comm_wrap(&t->dp_comm, world, "dp");
    t->dp_rank = t->dp_comm.rank;

    ts_model_build(&t->model, &cfg->model, NULL, &ts_kernels_cpu);
    ts_status st = TS_OK;
    if (cfg->model.init[0])
        st = ts_model_init_from_file(&t->model, cfg->model.init);
    else
        ts_model_init_random(&t->model, (uint64_t)cfg->train.seed);
    if (st == TS_OK) st = open_data(t);
    if (st == TS_OK) st = open_metrics(t);
    if (agree(st, world, t->rank) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }

    const int B = cfg->parallel.micro_batch, T = cfg->model.seq_len;
    ts_acts_init(&t->acts, &t->model, 0, t->model.n_layers, B, T);
    ts_scratch_init(&t->scratch, &t->model, B, T);
    t->dx = ts_alloc_floats((size_t)B * T * cfg->model.n_embd);
    ts_grad_sync_init(&t->grad_sync, &t->model, &t->dp_comm,
                      (size_t)cfg->parallel.bucket_mb << 20, cfg->parallel.overlap_grad_sync);
    return TS_OK;
}

void ts_trainer_free(ts_trainer *t)
{
    if (t->metrics) fclose(t->metrics);
    ts_grad_sync_free(&t->grad_sync);
    free(t->dx);
    ts_scratch_free(&t->scratch);
    ts_acts_free(&t->acts);
    ts_data_close(&t->train_data);
    if (t->has_val) ts_data_close(&t->val_data);
    ts_model_free(&t->model);
}

static void on_layer_done(void *ctx, int layer)
{
    ts_grad_sync_layer_done((ts_grad_sync *)ctx, layer);
}

/* Sum of a double over the whole grid (losses, squared norms): deterministic, one
 * all-reduce over the world. */
static double grid_sum(const ts_trainer *t, double local)
{
    ts_allreduce_sum_f64(&t->world_comm, &local, 1);
    return local;
}

void ts_trainer_step(ts_trainer *t, int step, ts_step_stats *out)
{
    const ts_config *c = &t->cfg;
    const int B = c->train.global_batch, T = c->model.seq_len, mb = c->parallel.micro_batch;
    const int M = t->num_microbatches;
    double t0 = ts_now_ms();

    /* Gradients accumulate over micro-batches; every target of the global batch
     * weighs 1/(B*T), so the sum over micro-batches and replicas is the gradient of
     * the mean loss. */
    memset(t->model.grad_mem, 0, t->model.num_floats * sizeof(float));
    ts_grad_sync_begin(&t->grad_sync);
    const float dloss = 1.0f / ((float)B * (float)T);
    double loss_sum = 0.0;
    for (int i = 0; i < M; i++) {
        ts_data_microbatch(&t->train_data, step, B, c->parallel.dp, t->dp_rank, mb, i, T,
                           t->acts.tokens, t->acts.targets);
        double s = 0.0;
        ts_model_forward(&t->model, &t->acts, dloss, &s);
        loss_sum += s;
        /* On the last micro-batch each layer's gradients become final as the backward
         * passes it: that is when its buckets' all-reduce can start. */
        bool last = i == M - 1;
        ts_model_backward(&t->model, &t->acts, t->dx, &t->scratch, last ? on_layer_done : NULL,
                          &t->grad_sync);
    }
    ts_grad_sync_finish(&t->grad_sync);

    /* Every replica now holds the same gradients; count them once (dp rank 0). */
    double sumsq = t->dp_rank == 0 ? ts_grad_sum_squares(&t->model) : 0.0;
    double norm = sqrt(grid_sum(t, sumsq));
    double lr = ts_lr_at(&c->train, step);
    ts_adamw_step(&t->model, &c->train, lr, ts_clip_coef(norm, c->train.grad_clip), step + 1);

    out->loss = grid_sum(t, loss_sum) / ((double)B * T);
    out->grad_norm = norm;
    out->lr = lr;
    out->step_ms = ts_now_ms() - t0;
    out->tokens = (long long)B * T;
    out->tokens_per_s = (double)out->tokens / (out->step_ms * 1e-3);
    out->dp_overlap = ts_grad_sync_overlap(&t->grad_sync);
}

double ts_trainer_eval(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const int T = c->model.seq_len, mb = c->parallel.micro_batch, dp = c->parallel.dp;
    const uint64_t S = ts_data_num_windows(&t->val_data, T);
    const int n = c->data.val_windows;
    /* A fixed set of windows 0..n-1 (mod S), independent of the grid; replica d takes
     * every dp-th group of micro_batch windows. */
    double loss_sum = 0.0;
    for (int w0 = t->dp_rank * mb; w0 < n; w0 += dp * mb) {
        int rows = n - w0 < mb ? n - w0 : mb;
        for (int r = 0; r < mb; r++) {
            uint64_t k = (uint64_t)(w0 + (r < rows ? r : 0)) % S;
            ts_data_window(&t->val_data, k, T, t->acts.tokens + (size_t)r * T,
                           t->acts.targets + (size_t)r * T);
        }
        ts_model_forward(&t->model, &t->acts, 0.0f, NULL);
        /* Padding rows repeat window w0; only the real rows count. */
        const float *losses = ts_acts_losses(&t->model, &t->acts);
        for (int i = 0; i < rows * T; i++) loss_sum += losses[i];
    }
    return grid_sum(t, loss_sum) / ((double)n * T);
}

static void format_eta(char *buf, size_t n, double seconds)
{
    if (seconds < 0 || !isfinite(seconds)) seconds = 0;
    int s = (int)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, n, "%dh%02dm", s / 3600, (s / 60) % 60);
    else if (s >= 60)
        snprintf(buf, n, "%dm%02ds", s / 60, s % 60);
    else
        snprintf(buf, n, "%ds", s);
}

ts_status ts_trainer_run(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const int steps = c->train.steps;
    double total_ms = 0.0;
    int timed = 0;
    for (int step = 0; step < steps; step++) {
        ts_step_stats s;
        ts_trainer_step(t, step, &s);
        if (!isfinite(s.loss))
            return ts_fail("loss became %f at step %d; lower train.lr or check the data", s.loss,
                           step);
        if (step > 0) { /* the first step pays for page faults; keep it out of the ETA */
            total_ms += s.step_ms;
            timed++;
        }
        if (t->metrics) {
            fprintf(t->metrics,
                    "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens\":%lld,"
                    "\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"bubble\":0,\"dp_overlap\":%.4f}\n",
                    step, s.loss, s.lr, s.grad_norm, s.tokens, s.step_ms, s.tokens_per_s,
                    s.dp_overlap);
            fflush(t->metrics);
        }
        if (c->log.progress) {
            char eta[32];
            double avg = timed ? total_ms / timed : s.step_ms;
            format_eta(eta, sizeof eta, avg * (steps - step - 1) * 1e-3);
            ts_log_info("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | "
                        "ETA %s",
                        step, steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.step_ms, eta);
        }
        bool last = step == steps - 1;
        if (t->has_val && c->data.eval_every > 0 && ((step + 1) % c->data.eval_every == 0 || last)) {
            double vl = ts_trainer_eval(t);
            if (t->metrics) {
                fprintf(t->metrics, "{\"step\":%d,\"val_loss\":%.9g}\n", step, vl);
                fflush(t->metrics);
            }
            ts_log_info("step %5d/%d | val_loss %.4f", step, steps, vl);
        }
    }
    return TS_OK;
}
