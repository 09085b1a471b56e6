/* Attention with document masks (kernels.h ts_att_heads.doc_start) on the CPU tables:
 * forward + backward of B sequences of T positions cut into documents of L positions
 * (T / L each; L = T: one document), against the same call without masks (causal).
 * Prints one line per L: the query-key pairs computed (ts_attention_pairs), the median
 * milliseconds of forward, backward and both over the repetitions (wall clock), the
 * median process CPU time of both (on a shared machine the work done: the wall clock
 * also counts other processes' turns), and the ratios to the one-document run (wall,
 * CPU, pairs), so the skipping is measured against what it should save.
 * Usage: bench_attention_docmask [T] [NH] [HS] [REPS] [fp32|bf16] [L...]
 *        (defaults 4096 2 64 5 fp32, L = 512 4096) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "core/timer.h"
#include "kernels/attention_sizes.h"
#include "kernels/kernels.h"

/* This process's CPU time in ms (every thread's): on a shared, loaded machine the work
 * done, where the wall clock also counts the time other processes held the cores. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const int T = argc > 1 ? atoi(argv[1]) : 4096, NH = argc > 2 ? atoi(argv[2]) : 2;
    const int HS = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 5;
    const bool bf16 = argc > 5 && strcmp(argv[5], "bf16") == 0;
    int lens[16], n_lens = 0;
    for (int i = 6; i < argc && n_lens < 16; i++) lens[n_lens++] = atoi(argv[i]);
    if (n_lens == 0) {
        lens[n_lens++] = 512;
        lens[n_lens++] = T;
    }
    const ts_kernels *K = bf16 ? &ts_kernels_cpu_bf16 : &ts_kernels_cpu;
    if (bf16 && !ts_cpu_bf16_supported()) {
        fprintf(stderr, "bench_attention_docmask: this CPU has no BF16 instructions\n");
        return 77;
    }
    const int B = 1;
    const ts_att_heads h0 = ts_att_heads_gqa(NH, NH, HS);
    const size_t N = (size_t)B * T, C3 = ts_att_qkv_width(h0), CO = ts_att_out_width(h0);
    const size_t ab = ts_dtype_bytes(K->act_dtype);
    float *qkv32 = bench_random_floats(N * C3, 2.0f, 1), *dout32 = bench_random_floats(N * CO, 1.0f, 2);
    void *qkv = K->dev_alloc(N * C3 * ab), *dout = K->dev_alloc(N * CO * ab);
    K->convert(qkv, K->act_dtype, qkv32, TS_DTYPE_F32, N * C3);
    K->convert(dout, K->act_dtype, dout32, TS_DTYPE_F32, N * CO);
    void *out = K->dev_alloc(N * CO * ab), *dqkv = K->dev_alloc(N * C3 * ab);
    void *att = K->dev_alloc(K->attention_saved_bytes(B, T, h0));
    void *scr = K->dev_alloc(K->attention_scratch_bytes(B, T, h0));
    int *ds = malloc(N * sizeof(int));
    double *fw = malloc((size_t)reps * sizeof(double)), *bw = malloc((size_t)reps * sizeof(double));
    double *all = malloc((size_t)reps * sizeof(double)), *cpu = malloc((size_t)reps * sizeof(double));
    printf("bench_attention_docmask: %s, B %d T %d NH %d HS %d, %d threads, median of %d\n",
           K->name, B, T, NH, HS, ts_cpu_get_threads(), reps);
    printf("%8s %14s %10s %10s %10s %10s %10s %10s %12s\n", "doc_len", "pairs", "fwd_ms",
           "bwd_ms", "fwd+bwd_ms", "cpu_ms", "wall_ratio", "cpu_ratio", "pairs_ratio");
    double base_ms = 0, base_cpu = 0, base_pairs = 0;
    for (int li = n_lens - 1; li >= 0; li--) { /* the one-document run first: the base */
        const int L = lens[li];
        for (int t = 0; t < T; t++) ds[t] = t / L * L;
        ts_att_heads h = h0;
        h.doc_start = ds; /* host memory is the CPU backend's */
        K->attention_forward(out, att, qkv, B, T, h); /* warm-up */
        K->attention_backward(dqkv, scr, dout, qkv, att, B, T, h);
        for (int r = 0; r < reps; r++) {
            const double c0 = cpu_ms(), t0 = ts_now_ms();
            K->attention_forward(out, att, qkv, B, T, h);
            const double t1 = ts_now_ms();
            K->attention_backward(dqkv, scr, dout, qkv, att, B, T, h);
            const double t2 = ts_now_ms();
            fw[r] = t1 - t0;
            bw[r] = t2 - t1;
            all[r] = t2 - t0;
            cpu[r] = cpu_ms() - c0;
        }
        qsort(cpu, (size_t)reps, sizeof(double), cmp_double);
        qsort(fw, (size_t)reps, sizeof(double), cmp_double);
        qsort(bw, (size_t)reps, sizeof(double), cmp_double);
        qsort(all, (size_t)reps, sizeof(double), cmp_double);
        const double pairs = ts_attention_pairs(ds, T), ms = all[reps / 2], c = cpu[reps / 2];
        if (li == n_lens - 1) {
            base_ms = ms;
            base_cpu = c;
            base_pairs = pairs;
        }
        printf("%8d %14.0f %10.2f %10.2f %10.2f %10.2f %10.3f %10.3f %12.3f\n", L, pairs,
               fw[reps / 2], bw[reps / 2], ms, c, ms / base_ms, c / base_cpu, pairs / base_pairs);
    }
    /* The causal kernel without masks, for the one-document run's overhead. */
    for (int r = 0; r < reps; r++) {
        const double c0 = cpu_ms(), t0 = ts_now_ms();
        K->attention_forward(out, att, qkv, B, T, h0);
        K->attention_backward(dqkv, scr, dout, qkv, att, B, T, h0);
        all[r] = ts_now_ms() - t0;
        cpu[r] = cpu_ms() - c0;
    }
    qsort(all, (size_t)reps, sizeof(double), cmp_double);
    qsort(cpu, (size_t)reps, sizeof(double), cmp_double);
    printf("%8s %14.0f %10s %10s %10.2f %10.2f %10.3f %10.3f %12s\n", "causal",
           ts_attention_pairs(NULL, T), "-", "-", all[reps / 2], cpu[reps / 2],
           all[reps / 2] / base_ms, cpu[reps / 2] / base_cpu, "(no mask)");
    free(qkv32), free(dout32), free(ds), free(fw), free(bw), free(all), free(cpu);
    K->dev_free(qkv), K->dev_free(dout), K->dev_free(out), K->dev_free(dqkv), K->dev_free(att);
    K->dev_free(scr);
    return 0;
}
