/* nn.Linear on OpenBLAS: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias. */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* The bias is fused by starting `out` from it and letting sgemm accumulate (beta = 1):
 * sgemm with beta = 0 would spend the same pass zeroing `out`. */
void ts_cpu_matmul_forward(void *out_, const void *inp_, const void *weight_, const float *bias,
                           int N, int C, int OC)
{
    float *out = out_;
    const float *inp = inp_;
    const float *weight = weight_;
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
                out, OC);
}

/* [begin, end) of part `i` of `parts` of n rows, cut at multiples of 16 rows. */
static void split_rows(int n, int parts, int i, int *begin, int *end)
{
    size_t b, e, blocks = ((size_t)n + 15) / 16;
    ts_cpu_split(blocks, parts, i, &b, &e);
    *begin = (int)(b * 16 < (size_t)n ? b * 16 : (size_t)n);
    *end = (int)(e * 16 < (size_t)n ? e * 16 : (size_t)n);
}

/* dinp rows [n0, n1) = dout[n0:n1] @ weight */
static void dinp_rows(float *dinp, const float *dout, const float *weight, int C, int OC, int n0,
                      int n1)
{
    if (n1 > n0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, C, OC, 1.0f,
                    dout + (size_t)n0 * OC, OC, weight, C, 0.0f, dinp + (size_t)n0 * C, C);
}

/* dweight rows [o0, o1) += dout[:, o0:o1]^T @ inp */
static void dweight_rows(float *dweight, const float *dout, const float *inp, int N, int C, int OC,
                         int o0, int o1)
{
    if (o1 > o0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f, dout + o0, OC, inp,
                    C, 1.0f, dweight + (size_t)o0 * C, C);
}

/* dbias[o0, o1) += column sums of dout, rows in order: the same sums for any split of
 * the columns among threads. */
static void dbias_cols(float *dbias, const float *dout, int N, int OC, int o0, int o1)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * OC;
#pragma omp simd
        for (int o = o0; o < o1; o++) dbias[o] += d[o];
    }
}

/* dinp and dweight are independent products of the same dout. With two threads or more
 * they run side by side, each on half of the threads (each thread a block of rows, one
 * single-threaded sgemm: OpenBLAS runs single-threaded inside a parallel region), rather
 * than one after the other on all threads: at a small model's sizes OpenBLAS's threaded
 * sgemm loses time to its threads waiting on each other's packed panels (measured ~5%
 * of a tiny.cfg step, ~2% at GPT-2 124M, 2 threads). dbias rides with the dweight rows. */
static void backward_side_by_side(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, int N, int C, int OC)
{
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads(), half = nt / 2, lo, hi;
        if (nt < 2) { /* the runtime gave one thread: both products on it */
            dinp_rows(dinp, dout, weight, C, OC, 0, N);
            dweight_rows(dweight, dout, inp, N, C, OC, 0, OC);
            if (dbias) dbias_cols(dbias, dout, N, OC, 0, OC);
        } else if (t < half) {
            split_rows(N, half, t, &lo, &hi);
            dinp_rows(dinp, dout, weight, C, OC, lo, hi);
        } else {
            split_rows(OC, nt - half, t - half, &lo, &hi);
            dweight_rows(dweight, dout, inp, N, C, OC, lo, hi);
            if (dbias) dbias_cols(dbias, dout, N, OC, lo, hi);
        }
    }
}

void ts_cpu_matmul_backward(void *dinp_, float *dweight, float *dbias, const void *dout_,
                            const void *inp_, const void *weight_, int N, int C, int OC)
{
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    const float *weight = weight_;
    if (dinp && dweight && omp_get_max_threads() >= 2) {
        backward_side_by_side(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        return;
    }
    /* dinp[N,C] = dout[N,OC] @ weight[OC,C] */
    if (dinp) dinp_rows(dinp, dout, weight, C, OC, 0, N);
    /* dweight[OC,C] += dout^T @ inp (skipped when NULL: a zero-bubble schedule's
     * input-gradient pass defers it to the weight-gradient pass) */
    if (dweight) dweight_rows(dweight, dout, inp, N, C, OC, 0, OC);
    if (dbias) {
        /* Each thread owns a range of columns (in cache lines). */
#pragma omp parallel
        {
            int o0, o1;
            split_rows(OC, omp_get_num_threads(), omp_get_thread_num(), &o0, &o1);
            dbias_cols(dbias, dout, N, OC, o0, o1);
        }
    }
}
