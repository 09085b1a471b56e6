/* Tensor-parallel layers against the unsharded ones, on 2, 3 or 4 ranks (run under
 * mpirun by test_tp_layers.sh): for the embedding, a block and the head, the sharded
 * forward output and the input and weight gradients equal the unsharded layer's on
 * random data, and the sharded initial weights are the slices of the one-rank initial
 * weights bit for bit. The vocabulary (61, prime) splits unevenly on every tp > 1.
 * Every rank checks; the job fails if any rank fails. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "config/config.h"
#include "core/rng.h"
#include "model/model.h"
#include "optim/optim.h"
#include "test_util.h"

static void fill(float *x, size_t n, uint64_t key, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * ts_rng_normal(7, key, i));
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* This rank's part of a full-model tensor (the shard spec's runs), into slice. */
static void take_slice(const ts_param *P, const float *full, float *slice)
{
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, 0, P->numel); ts_shard_next(&it, &r);)
        memcpy(slice + r.local, full + r.logical, r.len * sizeof(float));
}

/* The sharded parameter p's gradient against the full model's slice of it. */
static double grad_err(const ts_model *shard, int p, const ts_model *full, int q)
{
    const ts_param *P = &shard->params[p];
    float *slice = ts_alloc_floats(P->numel);
    take_slice(P, ts_param_grad(full, q), slice);
    double e = rel_err(ts_param_grad(shard, p), slice, P->numel);
    free(slice);
    return e;
}

static int find(const ts_model *m, const char *name)
{
    for (int p = 0; p < m->n_params; p++)
        if (!strcmp(ts_param_name(m, p), name)) return p;
    return -1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ts_comm tp;
    ts_comm_world(&tp);
    tp.name = "tp";
    ts_cpu_set_threads(1);

    ts_config cfg;
    ts_config_defaults(&cfg);
    cfg.model.n_layer = 2;
    cfg.model.n_head = 12;
    cfg.model.n_embd = 48;
    cfg.model.vocab_size = 61;
    cfg.model.seq_len = 8;
    const int B = 2, T = 8, N = B * T, C = cfg.model.n_embd, V = cfg.model.vocab_size;

    ts_model full, shard;
    ts_model_build(&full, &(ts_model_spec){.arch = &cfg.model, .k = &ts_kernels_cpu});
    const ts_tp ctx = ts_tp_make(size, rank, &tp, &ts_kernels_cpu);
    ts_model_build(&shard, &(ts_model_spec){.arch = &cfg.model, .k = ctx.k, .tp = ctx});
    ts_model_init_random(&full, 1234);
    ts_model_init_random(&shard, 1234);

    /* Initial weights: bit-identical slices. */
    for (int p = 0; p < shard.n_params; p++) {
        const ts_param *P = &shard.params[p];
        int q = find(&full, P->shard.name);
        int same = q >= 0;
        if (same) {
            float *slice = ts_alloc_floats(P->numel);
            take_slice(P, ts_param_data(&full, q), slice);
            same = !memcmp(slice, ts_param_data(&shard, p), P->numel * sizeof(float));
            free(slice);
        }
        CHECKF(same, "rank %d: initial %s is not the slice of the unsharded tensor", rank,
               P->shard.name);
        /* Split tensors: the parts add up to the whole (uneven for the vocabulary). */
        unsigned long total = (unsigned long)P->numel;
        MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (P->shard.split_axis >= 0) CHECK(total == full.params[q].numel);
    }

    ts_scratch sf, ss;
    ts_scratch_init(&sf, &full, B, T);
    ts_scratch_init(&ss, &shard, B, T);
    float *x = ts_alloc_floats((size_t)N * C), *dxf = ts_alloc_floats((size_t)N * C),
          *dxs = ts_alloc_floats((size_t)N * C);
    fill(x, (size_t)N * C, 1, 1.0f);
    const char *kinds[] = {"embedding", "block", "head"};
    const int layers[] = {0, 1, full.n_layers - 1};
    for (int li = 0; li < 3; li++) {
        int l = layers[li];
        ts_acts af, as;
        ts_acts_init(&af, &full, l, l + 1, B, T);
        ts_acts_init(&as, &shard, l, l + 1, B, T);
        for (int i = 0; i < N; i++) {
            af.tokens[i] = as.tokens[i] = (int)(ts_rng_mix64((uint64_t)i * 3 + 1) % V);
            af.targets[i] = as.targets[i] = (int)(ts_rng_mix64((uint64_t)i * 5 + 2) % V);
        }
        af.input = as.input = x;
        memset(full.grad_mem, 0, full.num_floats * sizeof(float));
        memset(shard.grad_mem, 0, shard.num_floats * sizeof(float));
        double lf = 0, ls = 0;
        ts_model_forward(&full, &af, 1.0f / N, &lf);
        ts_model_forward(&shard, &as, 1.0f / N, &ls);
        if (l == full.n_layers - 1) {
            CHECKF(fabs(lf - ls) <= 1e-5 * fabs(lf), "rank %d: head loss %.9g vs %.9g", rank, ls, lf);
        } else {
            double e = rel_err(ts_acts_output(&shard, &as, l), ts_acts_output(&full, &af, l), (size_t)N * C);
            CHECKF(e < 1e-5, "rank %d: %s forward differs (%.3g)", rank, kinds[li], e);
        }
        fill(dxf, (size_t)N * C, 2, 0.1f);
        memcpy(dxs, dxf, (size_t)N * C * sizeof(float));
        ts_model_backward(&full, &af, dxf, &sf, NULL, NULL);
        ts_model_backward(&shard, &as, dxs, &ss, NULL, NULL);
        if (l > 0) {
            double e = rel_err(dxs, dxf, (size_t)N * C);
            CHECKF(e < 1e-5, "rank %d: %s input gradient differs (%.3g)", rank, kinds[li], e);
        }
        for (int p = shard.layers[l].first_param; p < shard.layers[l].first_param + shard.layers[l].n_params; p++) {
            double e = grad_err(&shard, p, &full, find(&full, ts_param_name(&shard, p)));
            CHECKF(e < 1e-5, "rank %d: %s gradient of %s differs (%.3g)", rank, kinds[li],
                   ts_param_name(&shard, p), e);
        }
        /* The head's tied wte gradient lives with the embedding on one rank. */
        if (l == full.n_layers - 1) {
            int p = shard.head_wte_param;
            double e = grad_err(&shard, p, &full, find(&full, ts_param_name(&shard, p)));
            CHECKF(e < 1e-5, "rank %d: LM head weight gradient differs (%.3g)", rank, e);
        }
        ts_acts_free(&af);
        ts_acts_free(&as);
    }

    /* Training steps on the whole sharded model: the replicated parameters (LayerNorms,
     * row-parallel biases, wpe) must stay identical on every tp rank, bit for bit. */
    {
        ts_acts a;
        ts_acts_init(&a, &shard, 0, shard.n_layers, B, T);
        ts_train_config tc = cfg.train;
        ts_adamw opt;
        ts_adamw_init(&opt, &shard);
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < N; i++) {
                a.tokens[i] = (int)(ts_rng_mix64((uint64_t)(step * N + i) * 3 + 1) % V);
                a.targets[i] = (int)(ts_rng_mix64((uint64_t)(step * N + i) * 5 + 2) % V);
            }
            memset(shard.grad_mem, 0, shard.num_floats * sizeof(float));
            ts_model_forward(&shard, &a, 1.0f / N, NULL);
            ts_model_backward(&shard, &a, dxs, &ss, NULL, NULL);
            ts_adamw_step(&opt, &shard, &tc, 1e-3, 1.0f, step + 1);
        }
        ts_adamw_free(&opt);
        int replicated = 0;
        for (int p = 0; p < shard.n_params; p++) {
            const ts_param *P = &shard.params[p];
            if (P->shard.split_axis >= 0) continue;
            replicated++;
            float *mine = ts_param_data(&shard, p), *root = ts_alloc_floats(P->numel);
            memcpy(root, mine, P->numel * sizeof(float));
            MPI_Bcast(root, (int)P->numel, MPI_FLOAT, 0, MPI_COMM_WORLD);
            CHECKF(!memcmp(root, mine, P->numel * sizeof(float)),
                   "rank %d: replicated %s drifted from rank 0's after 3 steps", rank,
                   P->shard.name);
            free(root);
        }
        CHECK(replicated == 2 * cfg.model.n_layer * 3 + 1 + 2); /* ln x2 (w,b), proj biases x2; wpe; ln_f */
        ts_acts_free(&a);
    }

    int failed = ts_test_failed, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("tp=%d: ", size);
    /* ts_test_report fails rank 0 when no check ran; every other rank likewise. */
    int code = rank == 0 ? ts_test_report() : (failed != 0 || ts_test_passed == 0);
    free(x);
    free(dxf);
    free(dxs);
    ts_scratch_free(&sf);
    ts_scratch_free(&ss);
    ts_model_free(&full);
    ts_model_free(&shard);
    MPI_Finalize();
    return any ? 1 : code;
}
