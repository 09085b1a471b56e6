/* Where a single-rank training step spends its time: the model's forward and backward
 * over the micro-batches and the optimizer, in one process (no MPI, no data loader),
 * each kernel call timed through a wrapping kernel table.
 *
 *   bench_step tiny|124m|124m-1024 [threads] [steps] [micro_batch] [fp32|bf16]
 *
 * tiny: configs/tiny.cfg (4 layers, 128 wide, T 64, 4 micro-batches of 4);
 * 124m: GPT-2 124M at T 256, one micro-batch of 4; 124m-1024: at T 1024, one of 2
 * (micro_batch overrides, dividing the global batch of 16, 4 or 2). The precision picks
 * the CPU table (fp32: OpenBLAS; bf16: oneDNN, bf16 activations and compute weights). Each micro-batch runs forward then backward, as the 1F1B
 * engine does on one rank. Steps after the first (page faults) are timed: the step
 * line gives the median and minimum, the kernel table the mean per step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/optim.h"
#include "kernels/cpu/blas_core.h"

/* ---- a kernel table that times every call, keyed by kernel and shape */

typedef struct {
    char key[64];
    double ms;
    long calls;
} entry;

static entry entries[64];
static int n_entries;
static int timing; /* off during the warm-up step */

static void account(const char *key, double ms)
{
    if (!timing) return;
    for (int i = 0; i < n_entries; i++) {
        if (!strcmp(entries[i].key, key)) {
            entries[i].ms += ms;
            entries[i].calls++;
            return;
        }
    }
    if (n_entries == 64) return;
    snprintf(entries[n_entries].key, sizeof entries[n_entries].key, "%s", key);
    entries[n_entries].ms = ms;
    entries[n_entries].calls = 1;
    n_entries++;
}

static const ts_kernels *K = &ts_kernels_cpu;

#define TIMED(key, call)                                                                         \
    do {                                                                                         \
        double t0_ = ts_now_ms();                                                                \
        call;                                                                                    \
        account(key, ts_now_ms() - t0_);                                                         \
    } while (0)

static void enc_f(void *out, const int *tok, const float *wte, const float *wpe, int B, int T,
                  int C)
{
    TIMED("encoder_forward", K->encoder_forward(out, tok, wte, wpe, B, T, C));
}
static void enc_b(float *dwte, float *dwpe, const void *dout, const int *tok, int B, int T, int C)
{
    TIMED("encoder_backward", K->encoder_backward(dwte, dwpe, dout, tok, B, T, C));
}
static void ln_f(void *out, float *mean, float *rstd, const void *inp, const float *w,
                 const float *b, int N, int C)
{
    TIMED("layernorm_forward", K->layernorm_forward(out, mean, rstd, inp, w, b, N, C));
}
static void ln_b(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                 const float *w, const float *mean, const float *rstd, int N, int C)
{
    TIMED("layernorm_backward", K->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}
static void mm_f(void *out, const void *inp, const void *w, const float *b, int N, int C, int OC)
{
    char key[64];
    snprintf(key, sizeof key, "matmul_forward %dx%dx%d", N, OC, C);
    TIMED(key, K->matmul_forward(out, inp, w, b, N, C, OC));
}
static void mm_b(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                 const void *w, int N, int C, int OC)
{
    char key[64];
    snprintf(key, sizeof key, "matmul_backward %dx%dx%d", N, OC, C);
    TIMED(key, K->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC));
}
static void att_f(void *out, void *att, const void *qkv, int B, int T, ts_att_heads h)
{
    TIMED("attention_forward", K->attention_forward(out, att, qkv, B, T, h));
}
static void att_b(void *dqkv, void *scratch, const void *dout, const void *qkv,
                  const void *att, int B, int T, ts_att_heads h)
{
    TIMED("attention_backward", K->attention_backward(dqkv, scratch, dout, qkv, att, B, T, h));
}
static void gelu_f(void *out, const void *inp, size_t n)
{
    TIMED("gelu_forward", K->gelu_forward(out, inp, n));
}
static void gelu_b(void *dinp, const void *inp, const void *dout, size_t n)
{
    TIMED("gelu_backward", K->gelu_backward(dinp, inp, dout, n));
}
static void res_f(void *out, const void *a, const void *b, size_t n)
{
    TIMED("residual_forward", K->residual_forward(out, a, b, n));
}
static void xent(float *losses, void *logits, const int *targets, int N, int V, float dloss)
{
    TIMED("crossentropy_forward_backward",
          K->crossentropy_forward_backward(losses, logits, targets, N, V, dloss));
}
static void adamw(float *p, const float *g, float gs, float *m, float *v, size_t n, float lr,
                  float b1, float b2, float eps, float wd, int t)
{
    TIMED("adamw_update", K->adamw_update(p, g, gs, m, v, n, lr, b1, b2, eps, wd, t));
}
static void adamw_spans(float *p, const float *g, float gs, float *m, float *v,
                        const ts_adamw_span *sp, int ns, float lr, float b1, float b2, float eps,
                        float wd, int t)
{
    TIMED("adamw_update_spans", K->adamw_update_spans(p, g, gs, m, v, sp, ns, lr, b1, b2, eps, wd, t));
}
static void res_ln_f(void *r, void *o, float *mu, float *rs, const void *a, const void *b,
                     const float *w, const float *bi, int N, int C)
{
    TIMED("residual_layernorm_forward", K->residual_layernorm_forward(r, o, mu, rs, a, b, w, bi, N, C));
}
static double sumsq(const float *x, size_t n)
{
    double r = 0.0;
    TIMED("sum_squares", r = K->sum_squares(x, n));
    return r;
}

/* The CPU table with the model's kernels timed (the memory calls and the rest as they
 * are, so the table stays complete). */
static ts_kernels timed_kernels;
static void init_timed_kernels(void)
{
    timed_kernels = *K;
    timed_kernels.name = "cpu (timed)";
    timed_kernels.encoder_forward = enc_f;
    timed_kernels.encoder_backward = enc_b;
    timed_kernels.layernorm_forward = ln_f;
    timed_kernels.layernorm_backward = ln_b;
    timed_kernels.matmul_forward = mm_f;
    timed_kernels.matmul_backward = mm_b;
    timed_kernels.attention_forward = att_f;
    timed_kernels.attention_backward = att_b;
    timed_kernels.gelu_forward = gelu_f;
    timed_kernels.gelu_backward = gelu_b;
    timed_kernels.residual_forward = res_f;
    timed_kernels.crossentropy_forward_backward = xent;
    timed_kernels.adamw_update = adamw;
    timed_kernels.adamw_update_spans = adamw_spans;
    timed_kernels.residual_layernorm_forward = res_ln_f;
    timed_kernels.sum_squares = sumsq;
}

static int cmp_entry(const void *a, const void *b)
{
    double x = ((const entry *)a)->ms, y = ((const entry *)b)->ms;
    return (x < y) - (x > y);
}

int main(int argc, char **argv)
{
    if (argc > 5 && !(K = ts_kernels_for("cpu", argv[5], "gemm"))) {
        fprintf(stderr, "bench_step: precision '%s' is not fp32 or bf16\n", argv[5]);
        return 2;
    }
    init_timed_kernels();
    ts_blas_select_core(argc, argv); /* the OpenBLAS kernel tessera would run */
    const char *which = argc > 1 ? argv[1] : "tiny";
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int steps = argc > 3 ? atoi(argv[3]) : 0;
    ts_model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.arch, sizeof mc.arch, "gpt2");
    int B, global;
    if (!strcmp(which, "124m")) {
        mc.n_layer = 12, mc.n_head = 12, mc.n_embd = 768, mc.vocab_size = 50257, mc.seq_len = 256;
        B = 4, global = 4;
        if (!steps) steps = 6;
    } else if (!strcmp(which, "124m-1024")) {
        mc.n_layer = 12, mc.n_head = 12, mc.n_embd = 768, mc.vocab_size = 50257, mc.seq_len = 1024;
        B = 2, global = 2;
        if (!steps) steps = 3;
    } else if (!strcmp(which, "tiny")) {
        mc.n_layer = 4, mc.n_head = 4, mc.n_embd = 128, mc.vocab_size = 256, mc.seq_len = 64;
        B = 4, global = 16;
        if (!steps) steps = 60;
    } else {
        fprintf(stderr, "usage: bench_step tiny|124m|124m-1024 [threads] [steps] [micro_batch] "
                        "[fp32|bf16]\n");
        return 2;
    }
    if (argc > 4) B = atoi(argv[4]);
    if (B < 1 || global % B) {
        fprintf(stderr, "bench_step: micro_batch must divide %d\n", global);
        return 2;
    }
    const int T = mc.seq_len, N = B * T, micro = global / B;
    ts_cpu_set_threads(threads);

    ts_model model;
    ts_model_build(&model, &(ts_model_spec){.arch = &mc, .k = &timed_kernels});
    ts_model_init_random(&model, 1234);
    ts_acts acts;
    ts_acts_init(&acts, &model, 0, model.n_layers, B, T);
    ts_scratch scratch;
    ts_scratch_init(&scratch, &model, B, T);
    void *dx = K->dev_alloc((size_t)N * mc.n_embd * ts_dtype_bytes(K->act_dtype));
    ts_train_config tc = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                          .weight_decay = 0.1, .grad_clip = 1.0};
    unsigned seed = 1;
    double *step_ms = malloc(sizeof(double) * (size_t)steps);
    double *model_ms = malloc(sizeof(double) * (size_t)steps);
    double loss = 0.0;
    ts_adamw opt;
    ts_adamw_init(&opt, &model);
    for (int s = 0; s <= steps; s++) {
        timing = s > 0;
        double t0 = ts_now_ms();
        memset(model.grad_mem, 0, model.num_floats * sizeof(float));
        for (int mb = 0; mb < micro; mb++) {
            for (int i = 0; i < N; i++) {
                seed = seed * 1664525u + 1013904223u;
                acts.tokens[i] = (int)(seed >> 8) % mc.vocab_size;
                acts.targets[i] = (int)((seed >> 4) % (unsigned)mc.vocab_size);
            }
            ts_model_forward(&model, &acts, 1.0f / ((float)global * T), &loss);
            ts_model_backward(&model, &acts, dx, &scratch, NULL, NULL);
        }
        double t1 = ts_now_ms();
        double norm = sqrt(ts_grad_sum_squares_range(&model, 0, model.num_floats));
        ts_adamw_step(&opt, &model, &tc, tc.lr, ts_clip_coef(norm, tc.grad_clip), s + 1);
        ts_model_refresh_compute(&model);
        double t2 = ts_now_ms();
        if (s > 0) {
            step_ms[s - 1] = t2 - t0;
            model_ms[s - 1] = t1 - t0;
        }
    }
    double kernel_ms = 0.0;
    for (int i = 0; i < n_entries; i++) kernel_ms += entries[i].ms;
    double med = ts_median(step_ms, steps), med_model = ts_median(model_ms, steps);
    printf("bench_step %s (%s): %d threads, %d x %d tokens per step, %d timed steps (loss %.4f)\n",
           which, K->name, threads, micro, N, steps, loss / N);
    printf("step: median %.2f ms (min %.2f), forward+backward %.2f ms, optimizer %.2f ms\n", med,
           step_ms[0], med_model, med - med_model);
    qsort(entries, (size_t)n_entries, sizeof entries[0], cmp_entry);
    printf("\n%-36s %8s %12s %10s %7s\n", "kernel (shape N x OC x C)", "calls", "ms/call",
           "ms/step", "share");
    for (int i = 0; i < n_entries; i++) {
        const entry *e = &entries[i];
        printf("%-36s %8ld %12.4f %10.2f %6.1f%%\n", e->key, e->calls / steps, e->ms / e->calls,
               e->ms / steps, 100.0 * e->ms / kernel_ms);
    }
    printf("%-36s %8s %12s %10.2f\n", "sum of kernels", "", "", kernel_ms / steps);
    free(step_ms);
    free(model_ms);
    K->dev_free(dx);
    ts_scratch_free(&scratch);
    ts_acts_free(&acts);
    ts_adamw_free(&opt);
    ts_model_free(&model);
    return 0;
}
