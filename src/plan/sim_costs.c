/* The simulator's cost table as the planners assemble it (sim_costs.h). */
#include "plan/sim_costs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "pipeline/memory.h"

void ts_plan_sim_costs_init(ts_plan_sim_costs *s, int n_chunks, double msg_bytes)
{
    memset(s, 0, sizeof *s);
    s->f = ts_calloc((size_t)n_chunks, sizeof(double));
    s->i = ts_calloc((size_t)n_chunks, sizeof(double));
    s->w = ts_calloc((size_t)n_chunks, sizeof(double));
    s->costs = (ts_sim_costs){.n_chunks = n_chunks, .f = s->f, .i = s->i, .w = s->w,
                              .msg_bytes = msg_bytes};
}

double *ts_plan_sim_costs_optim(ts_plan_sim_costs *s, int pp)
{
    free(s->optim);
    s->optim = ts_calloc((size_t)pp, sizeof(double));
    s->costs.optim = s->optim;
    return s->optim;
}

int ts_plan_dp_buckets(double bytes, int layers, int bucket_mb)
{
    const double k = ceil(bytes / ((double)bucket_mb * 1048576.0));
    if (layers < 1) layers = 1;
    return k < 1 ? 1 : k > layers ? layers : (int)k;
}

void ts_plan_sim_costs_dp(ts_plan_sim_costs *s, const double *grad_bytes, const int *layers,
                          int bucket_mb, bool overlap, double latency, double bandwidth)
{
    const int n = s->costs.n_chunks;
    free(s->dp_bytes);
    free(s->dp_pieces);
    s->dp_bytes = ts_malloc(sizeof(double) * (size_t)n);
    s->dp_pieces = ts_malloc(sizeof(int) * (size_t)n);
    for (int c = 0; c < n; c++) {
        s->dp_bytes[c] = grad_bytes[c];
        s->dp_pieces[c] = ts_plan_dp_buckets(grad_bytes[c], layers[c], bucket_mb);
    }
    s->costs.dp_bytes = s->dp_bytes;
    s->costs.dp_pieces = overlap ? s->dp_pieces : NULL;
    s->costs.dp_latency = latency;
    s->costs.dp_bandwidth = bandwidth;
}

void ts_plan_sim_costs_free(ts_plan_sim_costs *s)
{
    free(s->f);
    free(s->i);
    free(s->w);
    free(s->optim);
    free(s->dp_bytes);
    free(s->dp_pieces);
    memset(s, 0, sizeof *s);
}

void ts_plan_sim_costs_of_config(ts_plan_sim_costs *s, const ts_config *cfg,
                                 const ts_partition *part, const ts_plan_cost_opts *o)
{
    const ts_parallel_config *p = &cfg->parallel;
    const int n = part->n_chunks;
    /* A context-parallel rank holds seq_len / cp positions of each sequence, and sequence
     * parallelism sends each tp rank's rows only (pipeline/engine.c e->rows). */
    const int cp = p->cp > 1 ? p->cp : 1;
    const double rows = (double)p->micro_batch * cfg->model.seq_len / cp /
                        (p->sequence_parallel ? p->tp : 1);
    const double msg_bytes = 4.0 * rows * cfg->model.n_embd;
    ts_plan_sim_costs_init(s, n, msg_bytes);
    for (int c = 0; c < n; c++) {
        if (o->uniform) {
            s->f[c] = s->i[c] = s->w[c] = 1.0;
        } else if (o->traced) {
            s->f[c] = o->traced->f[c];
            s->i[c] = o->traced->i[c];
            s->w[c] = o->traced->w[c];
        } else {
            /* ideal tensor and context parallelism: the work split tp * cp ways */
            s->f[c] = part->chunk_fwd_ms[c] / (p->tp * cp);
            s->i[c] = s->w[c] = 0.5 * part->chunk_bwd_ms[c] / (p->tp * cp);
        }
    }
    s->costs.act_bytes = part->chunk_act_bytes;
    /* Milliseconds: latency in ms, bandwidth in bytes per ms. */
    if (!o->uniform) {
        s->costs.latency = o->latency_us * 1e-3;
        s->costs.bandwidth = o->bandwidth_gbs * 1e6;
    }
    if (o->optim_ms > 0) {
        double *optim = ts_plan_sim_costs_optim(s, p->pp);
        for (int q = 0; q < p->pp; q++) optim[q] = o->optim_ms;
    }
    /* The dp reduction: every chunk's gradient bytes, on the dp link's costs, in the
     * trainer's buckets: each starts as the chunk's last backward finishes its layers,
     * not after the whole chunk. */
    /* (the context-parallel ranks reduce with the replicas: dp * cp ranks) */
    if (p->dp * cp > 1 && !o->uniform) {
        double *bytes = ts_malloc(sizeof(double) * (size_t)n);
        for (int c = 0; c < n; c++) bytes[c] = ts_memory_chunk_grad_bytes(cfg, part, c);
        ts_plan_sim_costs_dp(s, bytes, part->n_chunk_layers, p->bucket_mb, p->overlap_grad_sync,
                             o->dp_latency_us * 1e-3, o->dp_bandwidth_gbs * 1e6);
        free(bytes);
    }
}
