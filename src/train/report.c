/* What a run reports: the metrics file (JSON Lines, rank 0; docs/CONTRACT.md), the
 * start-up BLAS report, each step's metrics and progress lines, the end-of-run memory
 * report, and the Chrome trace (log.trace). */
#include "train/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>

#include "core/sysmem.h"
#include <unistd.h>

#include "checkpoint/claim.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "kernels/kernels.h"

/* Rank 0's outputs, checked before the first step: the metrics file is opened, and the
 * trace (written whole at the end) is tried once, so a bad path fails now, not after
 * the whole run. Neither may be a directory, a device or a pipe. */
ts_status ts_trainer_open_outputs(ts_trainer *t)
{
    const char *path = t->cfg.log.metrics, *trace = t->cfg.log.trace;
    const ts_checkpoint_config *k = &t->cfg.checkpoint;
    if (t->groups->world.rank != 0) return TS_OK;
    if (ts_ckpt_check_output(trace, "log.trace", k->dir, t->loaded_from) != TS_OK ||
        ts_ckpt_check_output(path, "log.metrics", k->dir, t->loaded_from) != TS_OK)
        return TS_ERR;
    if (trace[0]) {
        ts_atomic_file probe;
        if (ts_atomic_open(&probe, trace, "log.trace") != TS_OK) return TS_ERR;
        ts_atomic_abort(&probe);
    }
    if (!path[0]) return TS_OK;
    if (ts_check_output_path(path, "log.metrics") != TS_OK) return TS_ERR;
    if (ts_mkdir_parent(path) != TS_OK) return ts_error_prefix("log.metrics: ");
    /* Locked for the run (released when the process ends, however it ends), so a
     * second run cannot interleave its lines; opened without truncating, since only
     * the lock holder may cut it. A resumed run continues the file of the run it
     * continues; a fresh one starts it anew. */
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ts_fail("log.metrics: cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        close(fd);
        if (err == EWOULDBLOCK)
            return ts_fail("log.metrics: %s is being written by another run (it holds the "
                           "file's lock): two runs writing one file lose lines; wait for it to "
                           "end, or choose another log.metrics",
                           path);
        return ts_fail("log.metrics: cannot lock %s: %s", path, strerror(err));
    }
    const off_t end = t->start_step > 0 ? lseek(fd, 0, SEEK_END) : 0;
    if (end < 0 || (t->start_step == 0 && ftruncate(fd, 0) != 0) ||
        !(t->metrics = fdopen(fd, "a"))) {
        const int err = errno;
        close(fd);
        return ts_fail("log.metrics: cannot open %s: %s", path, strerror(err));
    }
    /* A failed write cuts the file back to here at most: never into the lines of the
     * run this one continues. */
    t->metrics_end = (long)end;
    return TS_OK;
}

bool ts_trainer_reporting(const ts_trainer *t)
{
    return t->metrics || ts_tfevents_is_open(&t->tboard);
}

/* The line into the metrics file, flushed. */
static ts_status write_metrics(ts_trainer *t, const char *text)
{
    if (!t->metrics) return TS_OK;
    errno = 0;
    int err = 0;
    if (fputs(text, t->metrics) == EOF || fputc('\n', t->metrics) == EOF || fflush(t->metrics) != 0)
        err = errno ? errno : EIO;
    if (!err) {
        t->metrics_end = ftell(t->metrics);
        return TS_OK;
    }
    /* Cut a partly written line so the file stays valid JSON Lines. */
    if (ftruncate(fileno(t->metrics), t->metrics_end) != 0) { /* best effort */
    }
    fclose(t->metrics);
    t->metrics = NULL;
    return ts_fail("log.metrics: writing %s failed: %s; the run stops here (the file ends at "
                   "the last complete line)",
                   t->cfg.log.metrics, strerror(err));
}

/* One JSON line into the metrics file (rank 0) and, with log.tensorboard, its numbers
 * into the event file; a failed write (a full disk) is an error naming the file, which
 * is closed so nothing more is written there. */
ts_status ts_trainer_metrics_line(ts_trainer *t, const char *fmt, ...)
{
    if (!ts_trainer_reporting(t)) return TS_OK;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *text = n >= 0 ? ts_malloc((size_t)n + 1) : NULL;
    if (text) vsnprintf(text, (size_t)n + 1, fmt, again);
    va_end(again);
    if (!text) return ts_fail("log.metrics: cannot format a metrics line");
    ts_status st = write_metrics(t, text);
    if (st == TS_OK) st = ts_trainer_tensorboard_line(t, text);
    free(text);
    return st;
}

/* The GEMM rate MFU is measured against, GFLOP/s on this rank: an fp32 CPU run's is the
 * sgemm rate just measured (`sgemm`: its GEMMs are that call); any other table's (oneDNN's
 * bf16 GEMMs, cuBLAS) its own matmul_forward, timed here the same way, so the peak is
 * what this rank's kernels reach on a GEMM, not a datasheet's. Shapes: the sgemm probe's
 * GPT-2-like 512 x 768 x 768 on a CPU; 4096 x 4096 x 4096 on a device, which a small
 * GEMM would leave mostly idle. Best of several runs after a warm-up, each synchronised. */
static double measure_gemm_gflops(const ts_kernels *k, double sgemm)
{
    if (!k->device_memory && k->act_dtype == TS_DTYPE_F32) return sgemm;
    const int N = k->device_memory ? 4096 : 512, C = k->device_memory ? 4096 : 768, OC = C;
    const size_t n_in = (size_t)N * C, n_w = (size_t)OC * C, n_out = (size_t)N * OC;
    const size_t e = ts_dtype_bytes(k->act_dtype), n_max = n_in > n_w ? n_in : n_w;
    float *host = ts_alloc_floats(n_max);
    for (size_t i = 0; i < n_max; i++) host[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
    /* Non-zero inputs (a GPU draws less power, and may run faster, on zeros), in the
     * table's activation dtype through its own conversion. */
    float *staged = k->dev_alloc(n_max * sizeof(float));
    void *inp = k->dev_alloc(n_in * e), *w = k->dev_alloc(n_w * e), *out = k->dev_alloc(n_out * e);
    k->memcpy_h2d(staged, host, n_max * sizeof(float));
    k->convert(inp, k->act_dtype, staged, TS_DTYPE_F32, n_in);
    k->convert(w, k->act_dtype, staged, TS_DTYPE_F32, n_w);
    k->stream_sync(NULL);
    double best = 1e30, spent = 0.0;
    for (int rep = 0; rep < 20 && (rep < 3 || spent < 20.0); rep++) {
        const double t0 = ts_now_ms();
        k->matmul_forward(out, inp, w, NULL, N, C, OC);
        k->stream_sync(NULL);
        const double dt = ts_now_ms() - t0;
        spent += dt;
        if (rep > 0 && dt < best) best = dt; /* rep 0 warms up (oneDNN's primitive, cuBLAS) */
    }
    k->dev_free(out);
    k->dev_free(w);
    k->dev_free(inp);
    k->dev_free(staged);
    free(host);
    return 2.0 * N * C * OC / (best * 1e-3) / 1e9;
}

/* The OpenBLAS core every rank runs and a quick sgemm rate with its threads, gathered
 * to rank 0: a start-up line and the metrics' first line {"cpu", "blas_core",
 * "blas_core_note", "blas_gflops":[per rank], "zero", "gemm_dtype", "gemm_gflops":[per
 * rank]}, so a slow kernel is seen, not guessed; a bf16 CPU run adds the ISA oneDNN
 * dispatches its GEMMs to ("dnnl_isa"). gemm_gflops is each rank's GEMM rate in the run's
 * precision (measure_gemm_gflops), whose sum over ranks is MFU's peak; "zero" the ZeRO
 * level that runs (0 with one replica, whatever parallel.zero says). */
ts_status ts_trainer_report_blas(ts_trainer *t)
{
    enum { NAME = 32 };
    char core[NAME] = {0}, note[256], cpu[128];
    snprintf(core, sizeof core, "%s", ts_blas_core());
    double gflops[2];
    gflops[0] = ts_blas_measure_gflops();
    gflops[1] = measure_gemm_gflops(t->k, gflops[0]);
    const int n = t->groups->world.size;
    char *cores = t->groups->world.rank == 0 ? ts_calloc((size_t)n, NAME) : NULL;
    double *rates = t->groups->world.rank == 0 ? ts_calloc((size_t)n * 2, sizeof(double)) : NULL;
    ts_watchdog_context("setup: gathering the BLAS report", 0, 0, 0);
    ts_gather_bytes(&t->groups->world, core, NAME, cores, 0);
    ts_gather_bytes(&t->groups->world, gflops, sizeof gflops, rates, 0);
    ts_status st = TS_OK;
    if (t->groups->world.rank == 0) {
        double lo = rates[0], hi = rates[0], peak = 0.0;
        int other = -1;
        for (int r = 0; r < n; r++) {
            lo = rates[2 * r] < lo ? rates[2 * r] : lo;
            hi = rates[2 * r] > hi ? rates[2 * r] : hi;
            peak += rates[2 * r + 1];
            if (other < 0 && r > 0 && strncmp(cores + (size_t)r * NAME, core, NAME) != 0)
                other = r;
        }
        t->mfu_peak_flops = peak * 1e9;
        ts_blas_core_note(note, sizeof note);
        ts_cpu_model(cpu, sizeof cpu);
        ts_log_info("blas: OpenBLAS core %s on %s; sgemm %.1f GFLOP/s per rank with %d thread%s "
                    "(%.1f-%.1f over ranks)",
                    note, cpu, gflops[0], t->topo->threads, t->topo->threads == 1 ? "" : "s", lo,
                    hi);
        if (other > 0)
            ts_log_warn("ranks run different OpenBLAS cores: %s on rank 0, %.*s on rank %d",
                        core, NAME, cores + (size_t)other * NAME, other);
        const bool dnnl = !t->k->device_count && t->k->act_dtype == TS_DTYPE_BF16;
        if (dnnl)
            ts_log_info("dnnl: oneDNN runs the bf16 GEMMs with its %s kernels", ts_dnnl_isa());
        const char *dtype = ts_dtype_name(t->k->act_dtype);
        ts_log_info("mfu: model FLOPs per second over the sum of the ranks' %s GEMM rates, "
                        "%.1f GFLOP/s (%s%.1f per rank on average)",
                        dtype, peak, t->k->act_dtype == TS_DTYPE_F32 && !t->k->device_memory
                                         ? "the sgemm rate above: " : "measured now: ",
                        peak / n);
        json_t *line = json_pack("{s:s, s:s, s:s, s:o, s:i, s:s, s:o}", "cpu", cpu, "blas_core",
                                 core, "blas_core_note", note, "blas_gflops", json_array(),
                                 "zero", t->zero.level, "gemm_dtype", dtype,
                                 "gemm_gflops", json_array());
        if (dnnl) json_object_set_new(line, "dnnl_isa", json_string(ts_dnnl_isa()));
        for (int r = 0; r < n; r++) {
            json_array_append_new(json_object_get(line, "blas_gflops"),
                                  json_real(round(rates[2 * r] * 10.0) / 10.0));
            json_array_append_new(json_object_get(line, "gemm_gflops"),
                                  json_real(round(rates[2 * r + 1] * 10.0) / 10.0));
        }
        char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(line);
        st = ts_trainer_metrics_line(t, "%s", text ? text : "{}");
        free(text);
    }
    free(cores);
    free(rates);
    return ts_comm_agree(&t->groups->world, st);
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

/* A metrics number: "%.9g", or null when it is not finite. */
static void json_number(char *buf, size_t n, double v)
{
    if (isfinite(v))
        snprintf(buf, n, "%.9g", v);
    else
        snprintf(buf, n, "null");
}

/* The data the run has read through step `step` (the batch rule, identical on every
 * rank): each dataset's share of the sequences since step 0 and the epochs of it read,
 * as ",\"data_shares\":[...],\"data_epochs\":[...]" (shares only for a blend). */
static void describe_data(ts_trainer *t, int step, char *buf, size_t cap)
{
    ts_sampler *s = &t->train_data;
    (void)step; /* the step under way: its first sequence and batch */
    ts_sampler_prepare(s, t->step_seq0, t->step_batch); /* cached: the step read it */
    uint64_t counts[TS_MAX_DATASETS];
    ts_sampler_counts(s, counts);
    const double total = (double)t->step_seq0 + t->step_batch;
    size_t at = 0;
    buf[0] = '\0';
    if (s->n_sets > 1) {
        at += (size_t)snprintf(buf + at, cap - at, ",\"data_shares\":[");
        for (int d = 0; d < s->n_sets && at < cap; d++)
            at += (size_t)snprintf(buf + at, cap - at, "%s%.6f", d ? "," : "",
                                   (double)counts[d] / total);
        if (at < cap) at += (size_t)snprintf(buf + at, cap - at, "]");
    }
    if (at < cap) at += (size_t)snprintf(buf + at, cap - at, ",\"data_epochs\":[");
    for (int d = 0; d < s->n_sets && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%.6g", d ? "," : "",
                               (double)counts[d] / (double)s->windows[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* log.moe_every's line after step `step` (docs/CONTRACT.md "Metrics"): each MoE block's
 * tokens per expert over the global batch, {"step", "moe_layers": [l...], "moe_tokens":
 * [[E counts]...]}, every moe_every steps (0: none) and after the run's last step, as
 * Megatron and torchtitan log their per-layer MoE statistics at an interval. */
static ts_status report_moe_tokens(ts_trainer *t, int step, const ts_step_stats *s)
{
    const ts_model_config *mc = &t->cfg.model;
    const int every = t->cfg.log.moe_every;
    const bool due = (every > 0 && (step + 1) % every == 0) || step == t->cfg.train.steps - 1;
    if (!s->moe || !s->moe_counts || !due || !ts_trainer_reporting(t)) return TS_OK;
    json_t *layers = json_array(), *tokens = json_array();
    for (int l = 0; l < mc->n_layer + mc->mtp_layers; l++) { /* MTP's blocks last */
        if (!ts_model_block_is_moe(mc, l)) continue;
        json_t *row = json_array();
        for (int e = 0; e < mc->moe_experts; e++)
            json_array_append_new(row, json_integer(s->moe_counts[(size_t)l * mc->moe_experts + e]));
        json_array_append_new(layers, json_integer(l));
        json_array_append_new(tokens, row);
    }
    json_t *line = json_pack("{s:i, s:o, s:o}", "step", step, "moe_layers", layers,
                             "moe_tokens", tokens);
    char *text = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(line);
    if (!text) return ts_fail("log.metrics: out of memory for step %d's MoE token counts", step);
    const ts_status st = ts_trainer_metrics_line(t, "%s", text);
    free(text);
    return st;
}

ts_status ts_trainer_report_step(ts_trainer *t, int step, const ts_step_stats *s, double avg_ms)
{
    t->report_step = step;
    const int steps = t->cfg.train.steps;
    /* JSON has no NaN or infinity: a skipped step's non-finite values are null. */
    char loss[32], norm[32];
    json_number(loss, sizeof loss, s->loss);
    json_number(norm, sizeof norm, s->grad_norm);
    char data[64 + 48 * TS_MAX_DATASETS];
    describe_data(t, step, data, sizeof data);
    /* MFU: the model's FLOPs per second over the ranks' summed GEMM rate (rank 0 knows
     * the sum, and only rank 0 writes); absent when either is unknown. model_flops is
     * train.global_batch's step: scaled to this step's batch (train.batch_rampup); with
     * packed documents the step's own count (attention by the pairs computed). */
    const double flops = s->model_flops;
    const bool has_mfu = flops > 0 && t->mfu_peak_flops > 0 && s->step_ms > 0;
    const double mfu = has_mfu ? flops / (s->step_ms * 1e-3) / t->mfu_peak_flops : 0.0;
    char mfu_json[32] = "", mfu_text[32] = "";
    if (has_mfu) {
        snprintf(mfu_json, sizeof mfu_json, ",\"mfu\":%.4f", mfu);
        snprintf(mfu_text, sizeof mfu_text, " | MFU %.1f%%", mfu * 100.0);
    }
    char moe[320] = "";
    if (s->moe)
        snprintf(moe, sizeof moe,
                 ",\"moe_aux_loss\":%.9g,\"moe_z_loss\":%.9g,\"moe_max_load\":%.4f",
                 s->moe_aux_loss, s->moe_z_loss, s->moe_max_load);
    char dropped_text[32] = "";
    if (s->moe && t->cfg.model.moe_capacity > 0) { /* model.moe_capacity: the dropped share */
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), ",\"moe_dropped\":%.6f",
                 s->moe_dropped);
        snprintf(dropped_text, sizeof dropped_text, " | MoE dropped %.2f%%",
                 s->moe_dropped * 100.0);
    }
    if (s->moe && s->a2a)
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe),
                 ",\"a2a_ms\":%.3f,\"a2a_wait_ms\":%.3f,\"a2a_hidden\":%.4f", s->a2a_ms,
                 s->a2a_wait_ms, s->a2a_hidden);
    /* Multi-token prediction: each depth's loss, "mtp_loss": [l_1, ..., l_D]. */
    char mtp[40 * 64 + 16] = "";
    for (int k = 0; k < s->mtp_depths; k++) {
        char v[32];
        json_number(v, sizeof v, s->mtp_loss[k]);
        snprintf(mtp + strlen(mtp), sizeof mtp - strlen(mtp), "%s%s",
                 k == 0 ? ",\"mtp_loss\":[" : ",", v);
    }
    if (s->mtp_depths > 0) snprintf(mtp + strlen(mtp), sizeof mtp - strlen(mtp), "]");
    /* Muon: the update RMS of its matrices and of AdamW's group. */
    char upd[192];
    snprintf(upd, sizeof upd, ",\"optim_ms\":%.3f,\"optim_gather_ms\":%.3f", s->optim_ms,
             s->optim_gather_ms);
    if (s->muon)
        snprintf(upd + strlen(upd), sizeof upd - strlen(upd),
                 ",\"update_rms_muon\":%.6g,\"update_rms_adamw\":%.6g,\"muon_ms\":%.3f",
                 s->update_rms_muon, s->update_rms_adamw, s->muon_ms);
    /* train.skip_spikes: the spike guard's verdict and z-scores. */
    char spike[160];
    ts_spike_verdict_json(&s->spike, spike, sizeof spike);
    ts_status st = ts_trainer_metrics_line(
        t,
        "{\"step\":%d,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"tokens\":%lld,"
        "\"global_batch\":%d,\"micro_batches\":%d,"
        "\"step_ms\":%.3f,\"tokens_per_s\":%.1f%s,\"bubble\":%.4f,\"dp_overlap\":%.4f,"
        "\"dp_wait_ms\":%.3f,\"dp_bytes\":%.0f,\"tp_comm_ms\":%.3f,\"cp_comm_ms\":%.3f%s%s%s%s,"
        "\"rank_slowest\":%d,\"rank_fastest\":%d,\"compute_ms_max\":%.3f,\"compute_ms_min\":%.3f,"
        "\"wait_ms_max\":%.3f,\"wait_ms_min\":%.3f%s%s}",
        step, loss, s->lr, norm, s->tokens, t->step_batch, t->sched.m, s->step_ms,
        s->tokens_per_s, mfu_json, s->bubble,
        s->dp_overlap, s->dp_wait_ms, s->dp_bytes, s->tp_comm_ms, s->cp_comm_ms, moe, upd, mtp,
        data, s->rank_slowest, s->rank_fastest, s->compute_ms_max, s->compute_ms_min,
        s->wait_ms_max, s->wait_ms_min,
        s->skipped ? ",\"skipped\":true" : "", spike);
    if (st == TS_OK) st = report_moe_tokens(t, step, s);
    if (t->cfg.log.progress) {
        char eta[32];
        format_eta(eta, sizeof eta, avg_ms * (steps - step - 1) * 1e-3);
        ts_log_info("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s | %.1f ms | "
                    "bubble %.2f%s | ETA %s",
                    step, steps, s->loss, s->lr, s->grad_norm, s->tokens_per_s, mfu_text,
                    s->step_ms, s->bubble, dropped_text, eta);
    }
    if (s->skipped) /* with or without progress lines: a dropped update is news */
        ts_log_warn("step %d: the loss or gradient norm is not finite; its update was dropped "
                    "(train.on_nonfinite = \"skip\")",
                    step);
    return st;
}

/* Peak resident, activation and optimizer memory of every rank, gathered to rank 0: a
 * line on stderr and the metrics' last line {"peak_rss_mb":[...], "activation_mb":[...],
 * "optimizer_mb":[...]} (one entry per rank). */
ts_status ts_trainer_report_memory(ts_trainer *t)
{
    const double MiB = 1024.0 * 1024.0;
    enum { K = 7 };
    /* The process's real peak: the larger of the set-up's (read before ts_trainer_run
     * restarted the count) and the steps' (VmHWM since then). getrusage's ru_maxrss is
     * the same kernel count and no better; it stands in only where /proc is missing. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double steps_peak = t->peak_reset ? ts_sysmem_peak_rss() : 0.0;
    if (steps_peak <= 0.0) steps_peak = (double)ru.ru_maxrss * 1024.0;
    double peak = fmax(fmax(steps_peak, t->setup_peak_rss), (double)ru.ru_maxrss * 1024.0);
    /* The peak; the activation sets allocated (sized, not allocated again, so the report
     * adds nothing to the peak it reports); the optimizer's moments; the steps' own peak
     * (set-up's transients excluded); the state kept through the run (weights, gradients
     * and moments as this rank holds them) and ZeRO-2/3's chunk buffers at their most; the
     * pre-flight estimate of the peak (setup.c), to set beside the first. */
    double mine[K] = {peak / MiB,
                      (double)ts_engine_activation_bytes(&t->engine) / MiB,
                      (double)(ts_adamw_state_bytes(&t->optim) +
                               ts_muon_state_bytes(&t->muon)) / MiB,
                      steps_peak / MiB,
                      (ts_zero_state_bytes(&t->zero) + (double)ts_adamw_state_bytes(&t->optim) +
                       (double)ts_muon_state_bytes(&t->muon)) / MiB,
                      t->zero.zbuf_peak / MiB, t->estimate_bytes / MiB};
    const ts_comm *world = &t->groups->world;
    double *all = world->rank == 0 ? ts_calloc((size_t)world->size * K, sizeof(double)) : NULL;
    ts_watchdog_context("finishing: gathering the memory report", 0, 0, 0);
    ts_gather_bytes(world, mine, sizeof mine, all, 0);
    ts_status st = TS_OK;
    if (world->rank == 0) {
        const char *keys[K] = {"peak_rss_mb", "activation_mb", "optimizer_mb",
                               "step_peak_rss_mb", "state_mb", "zero_buffers_mb",
                               "estimate_mb"};
        json_t *line = json_object();
        for (int k = 0; k < K; k++) {
            json_t *list = json_array();
            for (int r = 0; r < world->size; r++)
                json_array_append_new(list, json_real(round(all[K * r + k] * 10.0) / 10.0));
            json_object_set_new(line, keys[k], list);
        }
        char *text = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(10));
        json_decref(line);
        st = ts_trainer_metrics_line(t, "%s", text ? text : "{}");
        free(text);
        /* On a device the estimate is the device's bytes, not the host's resident ones. */
        ts_log_info("memory: peak resident %.1f MiB on rank 0, %s %.1f MiB (activations "
                    "%.1f MiB, optimizer state %.1f MiB)%s",
                    all[0], t->k->device_memory ? "device memory estimated" : "estimated",
                    all[6], all[1], all[2],
                    t->metrics && world->size > 1 ? "; per rank in the metrics file" : "");
    }
    free(all);
    return st;
}

/* A collective's span on the communication track (the dp reduction's, a tensor- or
 * context-parallel collective's: blocking, the call; tp_overlap's, start to completion,
 * which the main track's kernels run beside), category `cat`, named prefix + what. */
static void comm_span(ts_trainer *t, const char *cat, const char *prefix, const char *what,
                      double t0, double t1)
{
    if (!t->tracing) return;
    ts_trace_event ev = ts_trace_event_make(cat, t->groups->world.rank, -1, -1,
                                            (t0 - t->t0_ms) * 1e3,
                                            (t1 - t0) * 1e3);
    snprintf(ev.name, sizeof ev.name, "%s%s", prefix, what);
    ev.track = TS_TRACE_TRACK_DP;
    ts_trace_add(&t->trace, &ev);
}

void ts_trainer_on_replica_span(void *ctx, const char *what, size_t bytes, double t0, double t1)
{
    (void)bytes;
    comm_span(ctx, "dpreduce", "", what, t0, t1);
}

void ts_trainer_on_tp_span(void *ctx, const char *what, size_t bytes, double t0, double t1)
{
    (void)bytes;
    comm_span(ctx, "tpcomm", "tp ", what, t0, t1);
}

void ts_trainer_on_cp_span(void *ctx, const char *what, size_t bytes, double t0, double t1)
{
    (void)bytes;
    comm_span(ctx, "cpcomm", "cp ", what, t0, t1);
}

void ts_trainer_on_a2a_span(void *ctx, const ts_expert_span *s)
{
    ts_trainer *t = ctx;
    if (!t->tracing) return;
    int chunk, mb;
    ts_trace_current_action(&chunk, &mb);
    ts_trace_event ev = ts_trace_event_make("a2a", t->groups->world.rank, chunk, mb,
                                            (s->start_ms - t->t0_ms) * 1e3,
                                            (s->done_ms - s->start_ms) * 1e3);
    snprintf(ev.name, sizeof ev.name, "%c %s L%d", s->pass, s->what, s->block);
    ev.track = TS_TRACE_TRACK_DP;
    ts_trace_add(&t->trace, &ev);
    if (s->wait_ms <= 0) return;
    ev = ts_trace_event_make("a2await", t->groups->world.rank, chunk, mb,
                             (s->done_ms - s->wait_ms - t->t0_ms) * 1e3, s->wait_ms * 1e3);
    ts_trace_add(&t->trace, &ev);
}

void ts_trainer_trace_span(ts_trainer *t, const char *cat, double t0, double t1)
{
    if (!t->tracing) return;
    ts_trace_event ev = ts_trace_event_make(cat, t->groups->world.rank, -1, -1,
                                            (t0 - t->t0_ms) * 1e3,
                                            (t1 - t0) * 1e3);
    ts_trace_add(&t->trace, &ev);
}

/* Gather every rank's events to rank 0 and write the Chrome trace. */
ts_status ts_trainer_write_trace(ts_trainer *t)
{
    int n = t->trace.n, *counts = NULL, total = 0;
    if (t->groups->world.rank == 0) counts = ts_calloc((size_t)t->groups->world.size, sizeof(int));
    ts_watchdog_context("finishing: gathering the trace", 0, 0, 0);
    ts_gather_bytes(&t->groups->world, &n, sizeof n, counts, 0);
    ts_trace_event *all = NULL;
    if (t->groups->world.rank == 0) {
        for (int r = 0; r < t->groups->world.size; r++) total += counts[r];
        all = ts_calloc((size_t)total + 1, sizeof *all);
    }
    ts_gatherv(&t->groups->world, t->trace.events, n, sizeof(ts_trace_event), all, counts, 0);
    ts_status st = TS_OK;
    if (t->groups->world.rank == 0) {
        /* The writer makes the directory and writes atomically (core/fsutil.h). */
        st = ts_trace_write_chrome(t->cfg.log.trace, all, total, t->groups->world.size,
                                   "tessera train (measured)");
        if (st == TS_OK) ts_log_info("trace: wrote %d events to %s", total, t->cfg.log.trace);
        double a2a_us = 0.0;
        const double hidden = ts_trace_hidden_share(all, total, "a2a", "a2await", &a2a_us);
        if (st == TS_OK && a2a_us > 0)
            ts_log_info("trace: ep all-to-all %.1f ms over all ranks, %.1f%% of it hidden "
                        "behind compute",
                        a2a_us * 1e-3, hidden * 100.0);
    }
    free(all);
    free(counts);
    return ts_comm_agree(&t->groups->world, st);
}
