/* nn.Linear on OpenBLAS: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias. */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* The bias is fused by starting `out` from it and letting sgemm accumulate (beta = 1):
 * sgemm with beta = 0 would spend the same pass zeroing `out`. */
void ts_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
                out, OC);
}

void ts_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC)
{
    /* dinp[N,C] = dout[N,OC] @ weight[OC,C] */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                    0.0f, dinp, C);
    /* dweight[OC,C] += dout^T @ inp (skipped when NULL: a zero-bubble schedule's
     * input-gradient pass defers it to the weight-gradient pass) */
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dweight, C);
    if (dbias) {
        /* Column sums: each thread owns a range of columns (in cache lines) and adds
         * the rows in order, so the result is independent of the thread count. */
#pragma omp parallel
        {
            size_t lines = ((size_t)OC + 15) / 16, l0, l1;
            ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
            size_t o0 = l0 * 16, o1 = l1 * 16 < (size_t)OC ? l1 * 16 : (size_t)OC;
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
#pragma omp simd
                for (size_t o = o0; o < o1; o++) dbias[o] += d[o];
            }
        }
    }
}
