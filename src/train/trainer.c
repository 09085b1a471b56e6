#include "train/trainer.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/load.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "kernels/cpu/blas_core.h"
#include "optim/optim.h"
#include "pipeline/memory.h"
#ifdef TS_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

static ts_status open_data(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const char *paths[TS_MAX_SHARDS];
    for (int i = 0; i < c->data.n_train; i++) paths[i] = c->data.train[i];
    if (ts_data_open(&t->train_data, paths, c->data.n_train, c->model.vocab_size) != TS_OK)
        return TS_ERR;
    t->has_train = true;
    if (ts_data_num_windows(&t->train_data, c->model.seq_len) == 0)
        return ts_fail("data.train holds %llu tokens, fewer than one window of seq_len + 1 = %d",
                       (unsigned long long)t->train_data.n_tokens, c->model.seq_len + 1);
    if (c->data.val[0] != '\0' && c->data.eval_every > 0) {
        const char *vp = c->data.val;
        if (ts_data_open_key(&t->val_data, "data.val", &vp, 1, c->model.vocab_size) != TS_OK)
            return TS_ERR;
        t->has_val = true;
        const uint64_t S = ts_data_num_windows(&t->val_data, c->model.seq_len);
        if (S == 0)
            return ts_fail("data.val (%s) holds fewer than seq_len + 1 = %d tokens", vp,
                           c->model.seq_len + 1);
        /* By design (the batch rule) window k of an evaluation is window k mod S. */
        if ((uint64_t)c->data.val_windows > S)
            ts_log_warn("data.val_windows = %d but data.val (%s) holds only %llu distinct "
                        "window%s of seq_len + 1 = %d tokens: each evaluation repeats them",
                        c->data.val_windows, vp, (unsigned long long)S, S == 1 ? "" : "s",
                        c->model.seq_len + 1);
    }
    return TS_OK;
}

/* Rank 0's outputs, checked before the first step: the metrics file is opened, and the
 * trace (written whole at the end) is tried once, so a bad path fails now, not after
 * the whole run. Neither may be a directory, a device or a pipe. */
static ts_status open_outputs(ts_trainer *t)
{
    const char *path = t->cfg.log.metrics, *trace = t->cfg.log.trace;
    if (t->world.rank != 0) return TS_OK;
    if (trace[0]) {
        ts_atomic_file probe;
        if (ts_atomic_open(&probe, trace, "log.trace") != TS_OK) return TS_ERR;
        ts_atomic_abort(&probe);
    }
    if (!path[0]) return TS_OK;
    if (ts_check_output_path(path, "log.metrics") != TS_OK) return TS_ERR;
    if (ts_mkdir_parent(path) != TS_OK) return ts_error_prefix("log.metrics: ");
    /* A resumed run continues the file of the run it continues. */
    t->metrics = fopen(path, t->start_step > 0 ? "a" : "w");
    if (!t->metrics) return ts_fail("log.metrics: cannot open %s: %s", path, strerror(errno));
    return TS_OK;
}

/* One JSON line into the metrics file (rank 0), flushed; a failed write (a full disk)
 * is an error naming the file, and the file is closed so nothing more is written. */
static ts_status metrics_line(ts_trainer *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ts_status metrics_line(ts_trainer *t, const char *fmt, ...)
{
    if (!t->metrics) return TS_OK;
    errno = 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(t->metrics, fmt, ap);
    va_end(ap);
    int err = 0;
    if (n < 0 || fputc('\n', t->metrics) == EOF || fflush(t->metrics) != 0) err = errno ? errno : EIO;
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

/* The compute backend train.device (and train.precision) name (the config checked
 * them), and the data plane that moves its memory (parallel.comm): MPI reads and writes
 * the CPU backend's buffers in place; NCCL moves a GPU's on the GPU ("auto" picks it for
 * "cuda" where built); memory the host may not touch under "mpi" ("cpu-strict" here, a
 * GPU's without NCCL) travels through host bounce buffers and the backend's copies. The
 * world group keeps MPI: it carries host records only. */
static ts_status select_device(ts_trainer *t)
{
    t->k = ts_kernels_find(t->cfg.train.device);
    TS_ASSERT(t->k);
    const ts_comm_backend *data = NULL;
#ifdef TS_HAVE_CUDA
    if (t->k == &ts_kernels_cuda) {
        /* Configs are checked on machines without GPUs too; the device must be here. */
        if (ts_cuda_device_count() == 0)
            return ts_fail("train.device = \"cuda\", but this rank sees no CUDA device "
                           "(check the driver, CUDA_VISIBLE_DEVICES and the job's GPU "
                           "allocation), or use train.device = \"cpu\"");
        /* The GPU nearest this rank's cores, as the topology shared them out. */
        ts_cuda_select_device(t->topo->gpu_cuda ? t->topo->gpu : t->topo->local_rank);
#ifdef TS_HAVE_NCCL
        if (strcmp(t->cfg.parallel.comm, "mpi") != 0) data = &ts_comm_nccl; /* auto, nccl */
#endif
        /* bf16: the same backend with its GEMMs on bf16 copies of the operands (fp32
         * accumulation; parameters, gradients and moments stay fp32). One table for the
         * whole run: it caches the weights' bf16 copies and sees every write to them. */
        if (strcmp(t->cfg.train.precision, "bf16") == 0) t->k = &ts_kernels_cuda_bf16;
    }
#endif
    if (!data && t->k->host_accessible) return TS_OK;
    if (!data) {
        ts_comm_staged_set_copies(t->k->memcpy_d2h, t->k->memcpy_h2d);
        data = ts_comm_backend_find("mpi-staged");
        TS_ASSERT(data);
    }
    /* Every group, even after one failed: each move is collective over its group, so
     * stopping early would leave the other groups' members waiting. */
    char first[1024] = "";
    ts_comm *groups[] = { &t->dp, &t->pp, &t->tp, &t->embed };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (ts_comm_set_backend(groups[i], data) != TS_OK && !first[0])
            snprintf(first, sizeof first, "%s", ts_error_message());
    return first[0] ? ts_fail("%s", first) : TS_OK;
}

/* The partition: an explicit list, or balanced on per-layer costs that rank 0 measures
 * and broadcasts (every rank must cut the model identically). */
static ts_status build_partition(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    const int n_chunks = c->parallel.pp * c->parallel.virtual_stages;
    if (c->parallel.n_partition > 0 || n_chunks == 1) return ts_partition_build(c, false, &t->part);

    ts_layer_costs costs;
    ts_layer_costs_model(&costs, &c->model, c->parallel.micro_batch);
    int ok = 1;
    if (t->world.rank == 0) {
        ts_layer_costs measured;
        if (ts_layer_costs_measure(&measured, &c->model, c->parallel.micro_batch, t->k) == TS_OK) {
            ts_layer_costs_free(&costs);
            costs = measured;
        } else {
            ok = 0; /* keep the model's costs */
        }
    }
    ts_host_broadcast(&t->world, &ok, sizeof ok, 0);
    if (ok) {
        size_t bytes = (size_t)costs.n_layers * sizeof(double);
        ts_host_broadcast(&t->world, costs.fwd_ms, bytes, 0);
        ts_host_broadcast(&t->world, costs.bwd_ms, bytes, 0);
        ts_host_broadcast(&t->world, costs.act_bytes, bytes, 0);
        costs.source = TS_COST_MEASURED;
    }
    ts_status st = ts_partition_from_costs(c, &costs, &t->part);
    ts_layer_costs_free(&costs);
    return st;
}

/* Refuse a run that cannot fit, with the numbers, before allocating it: this rank's
 * estimate against the address space left under RLIMIT_AS, and the sum over the node's
 * ranks against its physical memory. Collective; agreed. */
static ts_status check_memory(ts_trainer *t, bool log)
{
    const ts_topology *topo = t->topo;
    ts_rank_memory est;
    ts_memory_estimate(&t->cfg, &t->part, &t->sched, topo->coords.pp, topo->threads, &est);
    ts_sysmem lim;
    ts_sysmem_read(&lim);
    char what[256];
    ts_memory_describe(&est, what, sizeof what);
    /* The BLAS threads are running (binding started them): their buffers are in vm_now
     * already, and they are address space, not resident memory. */
    double new_bytes = est.total - est.blas;
    char left[32], limit[32], together[32], phys[32];
    ts_status st = TS_OK;
#ifdef TS_HAVE_CUDA
    /* On a GPU the estimate lives in device memory (plus the bf16 table's weight
     * copies, 2 bytes per parameter): check it against the device's free memory, and
     * leave the host with only what it holds itself. */
    const bool on_gpu = t->k == &ts_kernels_cuda || t->k == &ts_kernels_cuda_bf16;
    if (on_gpu) {
        double dev_bytes = new_bytes + (t->k == &ts_kernels_cuda_bf16 ? est.params / 2 : 0);
        size_t dev_free = 0, dev_total = 0;
        if (ts_cuda_memory_info(&dev_free, &dev_total) && dev_bytes > (double)dev_free)
            st = ts_fail("not enough GPU memory: pipeline rank %d needs %s%s, but GPU %d has %s "
                         "free of %s; shrink the model, parallel.micro_batch or the "
                         "micro-batches in flight (parallel.recompute), or spread it over "
                         "more pipeline/tensor ranks",
                         topo->coords.pp, what,
                         t->k == &ts_kernels_cuda_bf16 ? " and its bf16 weight copies" : "",
                         ts_cuda_current_device(),
                         ts_format_bytes((double)dev_free, left, sizeof left),
                         ts_format_bytes((double)dev_total, limit, sizeof limit));
        new_bytes = 0;
    }
#endif
    double node = new_bytes + lim.rss_now;
    ts_host_allreduce_sum_f64(&topo->node_comm, &node, 1);
    const int ranks_here = topo->node_comm.size;
    if (st == TS_OK && lim.vm_now + new_bytes > lim.address_space)
        st = ts_fail("not enough memory: pipeline rank %d needs %s more, but the address-space "
                     "limit (ulimit -v) leaves %s of %s on host %s; raise the limit, or shrink "
                     "the model, parallel.micro_batch or the micro-batches in flight "
                     "(parallel.recompute), or spread it over more pipeline/tensor ranks",
                     topo->coords.pp, what,
                     ts_format_bytes(lim.address_space - lim.vm_now, left, sizeof left),
                     ts_format_bytes(lim.address_space, limit, sizeof limit), topo->host);
    else if (st == TS_OK && node > lim.physical)
        st = ts_fail("not enough memory: pipeline rank %d needs %s; the ranks on host %s (%d) "
                     "need %s together, but this machine has %s; shrink the model, "
                     "parallel.micro_batch or the micro-batches in flight (parallel.recompute), "
                     "or spread it over more pipeline/tensor ranks or nodes",
                     topo->coords.pp, what, topo->host, ranks_here,
                     ts_format_bytes(node, together, sizeof together),
                     ts_format_bytes(lim.physical, phys, sizeof phys));
    if (ts_comm_agree(&t->world, st) != TS_OK) return TS_ERR;
    if (log && t->world.rank == 0)
        ts_log_info("memory: rank 0 will use about %s", what);
    return TS_OK;
}

/* The OpenBLAS core every rank runs and a quick sgemm rate with its threads, gathered
 * to rank 0: a start-up line and the metrics' first line {"cpu", "blas_core",
 * "blas_core_note", "blas_gflops":[per rank]}, so a slow kernel is seen, not guessed. */
static ts_status report_blas(ts_trainer *t)
{
    enum { NAME = 32 };
    char core[NAME] = {0}, note[256], cpu[128];
    snprintf(core, sizeof core, "%s", ts_blas_core());
    double gflops = ts_blas_measure_gflops();
    const int n = t->world.size;
    char *cores = t->world.rank == 0 ? ts_calloc((size_t)n, NAME) : NULL;
    double *rates = t->world.rank == 0 ? ts_calloc((size_t)n, sizeof(double)) : NULL;
    ts_watchdog_context("setup: gathering the BLAS report", 0, 0, 0);
    ts_gather_bytes(&t->world, core, NAME, cores, 0);
    ts_gather_bytes(&t->world, &gflops, sizeof gflops, rates, 0);
    ts_status st = TS_OK;
    if (t->world.rank == 0) {
        double lo = rates[0], hi = rates[0];
        int other = -1;
        for (int r = 1; r < n; r++) {
            lo = rates[r] < lo ? rates[r] : lo;
            hi = rates[r] > hi ? rates[r] : hi;
            if (other < 0 && strncmp(cores + (size_t)r * NAME, core, NAME) != 0) other = r;
        }
        ts_blas_core_note(note, sizeof note);
        ts_cpu_model(cpu, sizeof cpu);
        ts_log_info("blas: OpenBLAS core %s on %s; sgemm %.1f GFLOP/s per rank with %d thread%s "
                    "(%.1f-%.1f over ranks)",
                    note, cpu, gflops, t->topo->threads, t->topo->threads == 1 ? "" : "s", lo, hi);
        if (other > 0)
            ts_log_warn("ranks run different OpenBLAS cores: %s on rank 0, %.*s on rank %d",
                        core, NAME, cores + (size_t)other * NAME, other);
        json_t *line = json_pack("{s:s, s:s, s:s, s:o}", "cpu", cpu, "blas_core", core,
                                 "blas_core_note", note, "blas_gflops", json_array());
        for (int r = 0; r < n; r++)
            json_array_append_new(json_object_get(line, "blas_gflops"),
                                  json_real(round(rates[r] * 10.0) / 10.0));
        char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(line);
        st = metrics_line(t, "%s", text ? text : "{}");
        free(text);
    }
    free(cores);
    free(rates);
    return ts_comm_agree(&t->world, st);
}

static void on_layers_done(void *ctx, int first, int end)
{
    ts_grad_sync_layers_done((ts_grad_sync *)ctx, first, end);
}

/* The dp group's span hook (comm.h ts_comm_span_fn), set when tracing: each dp
 * collective (a gradient bucket's reduction, from its start until a test or wait saw
 * it complete) becomes a span on this rank's dp track. */
static void on_dp_span(void *ctx, const char *what, size_t bytes, double t0, double t1)
{
    (void)bytes;
    ts_trainer *t = ctx;
    if (!t->tracing) return;
    ts_trace_event ev = ts_trace_event_make("dpreduce", t->world.rank, -1, -1,
                                            (t0 - t->t0_ms) * 1e3, (t1 - t0) * 1e3);
    snprintf(ev.name, sizeof ev.name, "%s", what);
    ev.track = TS_TRACE_TRACK_DP;
    ts_trace_add(&t->trace, &ev);
}

/* checkpoint.load: "latest" (the newest in checkpoint.dir; none yet means a fresh start,
 * so a requeued job script can always pass it) or a checkpoint directory. Rank 0 looks
 * and every rank loads what it found (ranks that looked each for themselves could see
 * different directories, on an unshared or caching file system, and part ways).
 * Collective. */
static ts_status load_checkpoint(ts_trainer *t)
{
    const ts_checkpoint_config *k = &t->cfg.checkpoint;
    if (!k->load[0]) return TS_OK;
    int found = 1;
    ts_status st = TS_OK;
    if (t->world.rank == 0) {
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
    if (ts_comm_agree(&t->world, st != TS_OK ? ts_error_prefix("checkpoint.load: ") : TS_OK) != TS_OK)
        return TS_ERR;
    ts_host_broadcast(&t->world, &found, sizeof found, 0);
    if (!found) return TS_OK;
    ts_host_broadcast(&t->world, t->loaded_from, sizeof t->loaded_from, 0);
    const double t0 = ts_now_ms();
    ts_ckpt_load_args a = {.cfg = &t->cfg, .model = &t->model, .optim = &t->optim, .world = &t->world};
    if (ts_ckpt_load(&a, t->loaded_from, &t->start_step) != TS_OK) return TS_ERR;
    /* Every rank read the same state.json: the same step (checked, not assumed). */
    int lo = t->start_step, hi = t->start_step;
    ts_host_allreduce_min_i32(&t->world, &lo, 1);
    ts_host_allreduce_max_i32(&t->world, &hi, 1);
    st = TS_OK;
    if (lo != hi)
        st = ts_fail("checkpoint.load: the ranks read different steps (%d to %d) from %s: is "
                     "the file system shared and coherent on every node?",
                     lo, hi, t->loaded_from);
    else if (t->start_step > t->cfg.train.steps)
        st = ts_fail("checkpoint.load: %s has already run %d steps, more than train.steps = %d; "
                     "raise train.steps to train on",
                     t->loaded_from, t->start_step, t->cfg.train.steps);
    if (ts_comm_agree(&t->world, st) != TS_OK) return TS_ERR;
    if (t->world.rank == 0)
        ts_log_info("checkpoint: loaded %s (step %d) in %.2f s; continuing at step %d",
                    t->loaded_from, t->start_step, (ts_now_ms() - t0) * 1e-3, t->start_step);
    return TS_OK;
}

ts_status ts_trainer_init(ts_trainer *t, const ts_config *cfg, const ts_topology *topo)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->topo = topo;
    t->t0_ms = ts_now_ms();
    ts_watchdog_context("setup: partition, schedule, model, data and pipeline", 0, 0, 0);
    t->world = topo->world;
    t->dp = topo->dp_comm;
    t->pp = topo->pp_comm;
    t->tp = topo->tp_comm;
    t->tp.busy_ms = &t->tp_busy_ms;
    t->embed = topo->embed_comm;
    if (ts_comm_agree(&t->world, select_device(t)) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }

    /* The schedule, then the memory check on the modelled partition before anything
     * large is allocated (measuring the layer costs allocates a layer of each kind),
     * then the measured partition and the check again on the cut that will run. */
    ts_status st = ts_schedule_build(&t->sched, cfg->parallel.schedule, cfg->parallel.pp,
                                     cfg->parallel.virtual_stages, ts_config_num_microbatches(cfg));
    if (st == TS_OK) st = ts_partition_build(cfg, false, &t->part);
    if (ts_comm_agree(&t->world, st) != TS_OK || check_memory(t, false) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }
    ts_partition_free(&t->part);
    st = build_partition(t);
    if (ts_comm_agree(&t->world, st) != TS_OK || check_memory(t, true) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }

    bool *owned = ts_calloc((size_t)cfg->model.n_layer + 2, sizeof(bool));
    ts_partition_owned(&t->part, topo->coords.pp, owned);
    ts_tp tp = ts_tp_make(cfg->parallel.tp, topo->coords.tp, &t->tp, t->k);
    ts_model_build_tp(&t->model, &cfg->model, owned, &tp);
    free(owned);
    if (cfg->model.init[0])
        st = ts_ckpt_load_model_init(&t->model, cfg->model.init);
    else
        ts_model_init_random(&t->model, (uint64_t)cfg->train.seed);
    if (st == TS_OK) st = open_data(t);
    if (st == TS_OK)
        st = ts_engine_init(&t->engine, &t->cfg, &t->model, &t->sched, &t->part, &t->train_data,
                            &t->pp, topo->coords.dp);
    if (ts_comm_agree(&t->world, st) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }
    if (cfg->log.trace[0]) { /* before grad_sync takes the group: its reductions' spans */
        t->dp.on_span = on_dp_span;
        t->dp.on_span_ctx = t;
    }
    ts_grad_sync_init(&t->grad_sync, &t->model, &t->dp, &t->embed,
                      (size_t)cfg->parallel.bucket_mb << 20, cfg->parallel.overlap_grad_sync,
                      cfg->parallel.zero == 1);
    /* How the overlapped reduction advances while this rank computes: its own thread,
     * or tests between layers (inside pipeline waits MPI advances it anyway). */
    if (strcmp(cfg->parallel.grad_sync_progress, "thread") == 0) {
        if (ts_comm_agree(&t->world, ts_grad_sync_use_thread(&t->grad_sync)) != TS_OK) {
            ts_trainer_free(t);
            return TS_ERR;
        }
    } else if (t->grad_sync.n_buckets > 0 && cfg->parallel.overlap_grad_sync) {
        t->model.between_layers = ts_grad_sync_poll;
        t->model.between_layers_ctx = &t->grad_sync;
    }
    /* The AdamW moments of what this rank updates: everything, or its ZeRO-1 shard. */
    ts_adamw_init_ranges(&t->optim, &t->model, t->grad_sync.shard, t->grad_sync.n_shard,
                         t->grad_sync.sharded);
    /* A checkpoint replaces the initial weights and moments; then the outputs (a resumed
     * run appends to its metrics file) and the BLAS report, the metrics' first line. */
    if (load_checkpoint(t) != TS_OK ||
        ts_comm_agree(&t->world, open_outputs(t)) != TS_OK || report_blas(t) != TS_OK) {
        ts_trainer_free(t);
        return TS_ERR;
    }
    t->engine.chunk_done = on_layers_done;
    t->engine.chunk_done_ctx = &t->grad_sync;
    t->tracing = cfg->log.trace[0] != '\0';
    if (t->tracing) {
        ts_trace_init(&t->trace);
        t->engine.trace = &t->trace;
        t->engine.trace_t0_ms = t->t0_ms;
    }

    if (t->world.rank == 0 && t->part.n_chunks > 1) {
        char *d = ts_partition_describe(&t->part);
        ts_log_info("%s", d);
        free(d);
    }
    return TS_OK;
}

void ts_trainer_free(ts_trainer *t)
{
    if (t->saving) ts_ckpt_save_abandon(t->saving); /* the run failed mid-save */
    free(t->staging.mem);
    if (t->metrics) fclose(t->metrics);
    if (t->tracing) ts_trace_free(&t->trace);
    ts_grad_sync_free(&t->grad_sync);
    ts_adamw_free(&t->optim);
    ts_engine_free(&t->engine);
    /* Release the data planes' per-group state (NCCL communicators, comm streams) on
     * the trainer's copies of the groups; the topology frees the MPI groups. */
    ts_comm *groups[] = { &t->dp, &t->pp, &t->tp, &t->embed };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (groups[i]->backend_comm) ts_comm_set_backend(groups[i], &ts_comm_mpi);
    if (t->has_train) ts_data_close(&t->train_data);
    if (t->has_val) ts_data_close(&t->val_data);
    ts_model_free(&t->model);
    ts_schedule_free(&t->sched);
    ts_partition_free(&t->part);
    memset(t, 0, sizeof *t);
}

/* Sum of a double over the whole grid (losses, squared norms, bubbles). */
static double grid_sum(const ts_trainer *t, double local)
{
    ts_host_allreduce_sum_f64(&t->world, &local, 1);
    return local;
}

static void trace_span(ts_trainer *t, const char *cat, double t0, double t1)
{
    if (!t->tracing) return;
    ts_trace_event ev = ts_trace_event_make(cat, t->world.rank, -1, -1, (t0 - t->t0_ms) * 1e3,
                                            (t1 - t0) * 1e3);
    ts_trace_add(&t->trace, &ev);
}

void ts_trainer_step(ts_trainer *t, int step, ts_step_stats *out)
{
    const ts_config *c = &t->cfg;
    const int B = c->train.global_batch, T = c->model.seq_len;
    double t0 = ts_now_ms();

    /* Forward and backward of every micro-batch, as the schedule orders them. Every
     * target of the global batch weighs 1/(B*T), so summing over micro-batches and
     * replicas gives the gradient of the mean loss. */
    t->model.k->memset_zero(t->model.grad_mem, t->model.num_floats * sizeof(float));
    t->tp_busy_ms = 0.0;
    ts_grad_sync_begin(&t->grad_sync);
    ts_engine_run(&t->engine, step);

    double t1 = ts_now_ms();
    /* The dp reduction and the tied embedding's sum over the embedding group (with
     * ZeRO-1 the tied sum first, then the reduce-scatter: dp/grad_sync.h). */
    ts_watchdog_context("data-parallel gradient sync and tied-embedding sync", 0, 0, 0);
    ts_grad_sync_finish(&t->grad_sync);
    double t2 = ts_now_ms();
    trace_span(t, "dpsync", t1, t2);

    /* Each logical gradient element once over the grid: dp replicas hold identical
     * gradients, so dp rank 0 counts them, or with ZeRO-1 every dp rank its own shard;
     * the tied copy of the embedding and the tp-replicated parameters off tp rank 0 are
     * skipped inside. Then AdamW on this rank's ranges, and with ZeRO-1 the all-gather
     * of the updated parameters. */
    ts_watchdog_context("gradient norm and optimizer step", 0, 0, 0);
    bool counts = t->optim.sharded || t->topo->coords.dp == 0;
    double sumsq = counts ? ts_adamw_grad_sum_squares(&t->optim, &t->model) : 0.0;
    double norm = sqrt(grid_sum(t, sumsq));
    double lr = ts_lr_at(&c->train, step);
    ts_adamw_step(&t->optim, &t->model, &c->train, lr, ts_clip_coef(norm, c->train.grad_clip),
                  step + 1);
    if (t->grad_sync.sharded) ts_watchdog_context("ZeRO-1 parameter all-gather", 0, 0, 0);
    ts_grad_sync_gather_params(&t->grad_sync);
    double t3 = ts_now_ms();
    trace_span(t, "optim", t2, t3);

    /* Idle fraction of the pipeline's makespan: the longest span of actions among this
     * rank's pipeline group (every rank starts the step together, released by the last
     * step's collectives); replicas in other pipelines do not count. */
    ts_watchdog_context("step statistics", 0, 0, 0);
    double makespan = t->engine.span_ms;
    ts_host_allreduce_max_f64(&t->pp, &makespan, 1);
    double busy = makespan > 0 ? t->engine.compute_ms / makespan : 1.0;
    out->bubble = grid_sum(t, 1.0 - busy) / t->world.size;
    /* Every tp rank of the last stage holds the same losses: count tp rank 0's. */
    out->loss = grid_sum(t, ts_tp_once(&t->model.tp, t->engine.loss_sum)) / ((double)B * T);
    out->grad_norm = norm;
    out->lr = lr;
    out->step_ms = ts_now_ms() - t0;
    out->tokens = (long long)B * T;
    out->tokens_per_s = (double)out->tokens / (out->step_ms * 1e-3);
    out->dp_overlap = ts_grad_sync_overlap(&t->grad_sync);
    double wait = t->grad_sync.wait_ms + t->grad_sync.gather_ms; /* ZeRO-1's all-gather too */
    ts_host_allreduce_max_f64(&t->world, &wait, 1);
    out->dp_wait_ms = wait;
    out->dp_bytes = t->dp.size > 1 ? (double)t->model.num_floats * sizeof(float) : 0.0;
    double tp_ms = t->tp_busy_ms;
    ts_host_allreduce_max_f64(&t->world, &tp_ms, 1);
    out->tp_comm_ms = tp_ms;
}

double ts_trainer_eval(ts_trainer *t)
{
    const int n = t->cfg.data.val_windows;
    double local = ts_engine_eval(&t->engine, &t->val_data, n);
    ts_watchdog_context("validation: summing the loss", 0, 0, 0);
    local = ts_tp_once(&t->model.tp, local); /* the tp ranks hold the same losses */
    return grid_sum(t, local) / ((double)n * t->cfg.model.seq_len);
}

/* Gather every rank's events to rank 0 and write the Chrome trace. */
static ts_status write_trace(ts_trainer *t)
{
    int n = t->trace.n, *counts = NULL, total = 0;
    if (t->world.rank == 0) counts = ts_calloc((size_t)t->world.size, sizeof(int));
    ts_watchdog_context("finishing: gathering the trace", 0, 0, 0);
    ts_gather_bytes(&t->world, &n, sizeof n, counts, 0);
    ts_trace_event *all = NULL;
    if (t->world.rank == 0) {
        for (int r = 0; r < t->world.size; r++) total += counts[r];
        all = ts_calloc((size_t)total + 1, sizeof *all);
    }
    ts_gatherv(&t->world, t->trace.events, n, sizeof(ts_trace_event), all, counts, 0);
    ts_status st = TS_OK;
    if (t->world.rank == 0) {
        /* The writer makes the directory and writes atomically (core/fsutil.h). */
        st = ts_trace_write_chrome(t->cfg.log.trace, all, total, t->world.size,
                                   "tessera train (measured)");
        if (st == TS_OK) ts_log_info("trace: wrote %d events to %s", total, t->cfg.log.trace);
    }
    free(all);
    free(counts);
    return ts_comm_agree(&t->world, st);
}

/* Peak resident, activation and optimizer memory of every rank, gathered to rank 0: a
 * line on stderr and the metrics' last line {"peak_rss_mb":[...], "activation_mb":[...],
 * "optimizer_mb":[...]} (one entry per rank). */
static ts_status report_memory(ts_trainer *t)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double MiB = 1024.0 * 1024.0;
    double mine[3] = {(double)ru.ru_maxrss / 1024.0,
                      (double)ts_engine_activation_bytes(&t->engine) / MiB,
                      (double)ts_adamw_state_bytes(&t->optim) / MiB};
    double *all = t->world.rank == 0 ? ts_calloc((size_t)t->world.size * 3, sizeof(double)) : NULL;
    ts_watchdog_context("finishing: gathering the memory report", 0, 0, 0);
    ts_gather_bytes(&t->world, mine, sizeof mine, all, 0);
    ts_status st = TS_OK;
    if (t->world.rank == 0) {
        const char *keys[3] = {"peak_rss_mb", "activation_mb", "optimizer_mb"};
        json_t *line = json_object();
        for (int k = 0; k < 3; k++) {
            json_t *list = json_array();
            for (int r = 0; r < t->world.size; r++)
                json_array_append_new(list, json_real(round(all[3 * r + k] * 10.0) / 10.0));
            json_object_set_new(line, keys[k], list);
        }
        char *text = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(10));
        json_decref(line);
        st = metrics_line(t, "%s", text ? text : "{}");
        free(text);
        ts_log_info("memory: peak resident %.1f MiB on rank 0 (activations %.1f MiB, optimizer "
                    "state %.1f MiB); per rank in the metrics file",
                    all[0], all[1], all[2]);
    }
    free(all);
    return st;
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

/* SIGTERM and SIGUSR1 (what Slurm sends before it preempts or times out a job) ask the
 * run to save and stop after the current step; the ranks agree on it each step. */
static volatile sig_atomic_t g_stop_signal;
/* A second notice changes nothing: Slurm may follow its USR1 with a TERM while the save
 * is running, and that save must finish. (SIGINT and SIGKILL still end a run at once.) */
static void on_stop_signal(int sig) { g_stop_signal = sig; }

void ts_trainer_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* blocking calls (MPI, I/O) carry on; the step ends normally */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

static const char *signal_name(int sig)
{
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a stop signal";
}

/* Commit the asynchronous save in flight (waiting for its writes) and report it. */
static ts_status finish_save(ts_trainer *t)
{
    if (!t->saving) return TS_OK;
    double ms = 0.0;
    ts_status st = ts_ckpt_save_finish(t->saving, &ms);
    t->saving = NULL;
    if (st != TS_OK) return TS_ERR;
    double blocked = t->saving_blocked_ms + ms, total = ts_now_ms() - t->saving_t0_ms;
    ts_host_allreduce_max_f64(&t->world, &blocked, 1);
    const double bytes = 3.0 * (double)ts_model_logical_params(&t->cfg.model) * sizeof(float);
    if (t->world.rank == 0)
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
    return ts_comm_agree(&t->world,
                         metrics_line(t, "{\"checkpoint_step\":%d,\"save_ms\":%.1f,"
                                         "\"blocked_ms\":%.1f,\"save_bytes\":%.0f}",
                                      t->saving_step, total, blocked, bytes));
}

/* Save the state after `step` completed steps into checkpoint.dir (collective): at
 * once, or with checkpoint.async (and `may_defer`) start it and commit it at a later
 * step once every rank has written its part. */
static ts_status save_checkpoint(ts_trainer *t, int step, bool may_defer)
{
    if (finish_save(t) != TS_OK) return TS_ERR; /* one save at a time */
    const ts_topology *topo = t->topo;
    ts_ckpt_save_args a = {.cfg = &t->cfg, .model = &t->model, .optim = &t->optim,
                           .world = &t->world, .dp_rank = topo->coords.dp,
                           .dp_size = t->cfg.parallel.dp, .step = step, .pp = t->cfg.parallel.pp,
                           .dp = t->cfg.parallel.dp, .tp = t->cfg.parallel.tp,
                           .staging = &t->staging};
    const bool async = t->cfg.checkpoint.async && may_defer;
    t->saving_async = async;
    t->saving_t0_ms = ts_now_ms();
    t->saving_step = step;
    if (ts_ckpt_save_start(&a, async, &t->saving, &t->saving_blocked_ms) != TS_OK) return TS_ERR;
    return async ? TS_OK : finish_save(t);
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
    int early = g_stop_signal;
    ts_host_allreduce_max_i32(&t->world, &early, 1);
    if (early) {
        if (t->world.rank == 0)
            ts_log_info("received %s during set-up: stopping before step %d", signal_name(early),
                        t->start_step);
        t->stop_signal = early;
        t->preempted = saving;
        return TS_OK;
    }
    for (int step = t->start_step; step < steps; step++) {
        ts_step_stats s;
        ts_watchdog_step(step);
        ts_trainer_step(t, step, &s);
        if (!isfinite(s.loss))
            return ts_fail("loss became %f at step %d; lower train.lr or check the data", s.loss,
                           step);
        if (step > t->start_step) { /* the first step pays for page faults; keep it out of the ETA */
            total_ms += s.step_ms;
            timed++;
        }
        ts_status st = metrics_line(
            t,
            "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens\":%lld,"
            "\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"bubble\":%.4f,\"dp_overlap\":%.4f,"
            "\"dp_wait_ms\":%.3f,\"dp_bytes\":%.0f,\"tp_comm_ms\":%.3f}",
            step, s.loss, s.lr, s.grad_norm, s.tokens, s.step_ms, s.tokens_per_s, s.bubble,
            s.dp_overlap, s.dp_wait_ms, s.dp_bytes, s.tp_comm_ms);
        if (c->log.progress) {
            char eta[32];
            double avg = timed ? total_ms / timed : s.step_ms;
            format_eta(eta, sizeof eta, avg * (steps - step - 1) * 1e-3);
            ts_log_info("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | "
                        "bubble %.2f | ETA %s",
                        step, steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.step_ms,
                        s.bubble, eta);
        }
        bool last = step == steps - 1;
        if (t->has_val && ((step + 1) % c->data.eval_every == 0 || last)) {
            double vl = ts_trainer_eval(t); /* collective: every rank, whatever st is */
            if (st == TS_OK) st = metrics_line(t, "{\"step\":%d,\"val_loss\":%.9g}", step, vl);
            ts_log_info("step %5d/%d | val_loss %.4f", step, steps, vl);
        }
        /* Rank 0 alone writes the metrics: agree each step (one small all-reduce, only
         * when there is a file), so its failure stops every rank now. */
        if (c->log.metrics[0] && ts_comm_agree(&t->world, st) != TS_OK) return TS_ERR;

        /* A stop signal on any rank stops every rank after this step, with a save; an
         * asynchronous save is committed once every rank has written its part. */
        int flags[2] = {g_stop_signal, t->saving && !ts_ckpt_save_written(t->saving)};
        ts_host_allreduce_max_i32(&t->world, flags, 2);
        if (t->saving && !flags[1] && finish_save(t) != TS_OK) return TS_ERR;
        const int stop = flags[0];
        if (stop) {
            if (t->world.rank == 0 && saving)
                ts_log_info("received %s after step %d: saving a checkpoint and stopping",
                            signal_name(stop), step);
            else if (t->world.rank == 0)
                ts_log_warn("received %s after step %d: stopping (nothing saved: no "
                            "checkpoint.dir)",
                            signal_name(stop), step);
            if (saving && save_checkpoint(t, step + 1, false) != TS_OK) return TS_ERR;
            t->stop_signal = stop;
            t->preempted = saving;
            return TS_OK;
        }
        if (saving && c->checkpoint.every > 0 && (step + 1) % c->checkpoint.every == 0 && !last &&
            save_checkpoint(t, step + 1, true) != TS_OK)
            return TS_ERR;
    }
    /* The end of every run is saved, unless it is the very checkpoint just loaded. */
    if (saving) {
        char final[TS_PATH_MAX + 64];
        snprintf(final, sizeof final, "%s/step_%08d", c->checkpoint.dir, steps);
        bool same = t->start_step == steps && t->loaded_from[0] && !strcmp(final, t->loaded_from);
        if (!same && save_checkpoint(t, steps, false) != TS_OK) return TS_ERR;
    }
    ts_watchdog_context("finishing: memory report and trace", 0, 0, 0);
    if (ts_comm_agree(&t->world, report_memory(t)) != TS_OK) return TS_ERR;
    if (t->tracing) return write_trace(t);
    return TS_OK;
}
