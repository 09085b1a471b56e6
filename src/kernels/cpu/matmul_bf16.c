/* nn.Linear on oneDNN bf16 GEMMs: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias, the
 * weight being the model's bf16 compute copy. fp32 accumulation; the bias (fp32) is
 * added by oneDNN before the output's one rounding. */
#include <omp.h>

#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dnnl_matmul.h"

void ts_cpu_bf16_matmul_forward(void *out, const void *inp, const void *weight, const float *bias,
                                int N, int C, int OC)
{
    ts_dnnl_gemm g = ts_dnnl_gemm_2d(N, OC, C, C, C, true, OC);
    g.bias = bias != NULL;
    ts_dnnl_matmul(&g, out, inp, weight, bias);
}

/* dbias[o0, o1) += column sums of dout, rows in order (matmul.c's order), widened
 * a chunk of columns at a time. */
static void dbias_cols(float *dbias, const ts_bf16 *dout, int N, int OC, int o0, int o1)
{
    float d[TS_BF16_CHUNK];
    for (int k0 = o0; k0 < o1; k0 += TS_BF16_CHUNK) {
        int m = o1 - k0 < TS_BF16_CHUNK ? o1 - k0 : TS_BF16_CHUNK;
        for (int n = 0; n < N; n++) {
            ts_bf16_to_f32_array(d, dout + (size_t)n * OC + k0, (size_t)m);
#pragma omp simd
            for (int o = 0; o < m; o++) dbias[k0 + o] += d[o];
        }
    }
}

/* dinp[N,C] = dout[N,OC] @ weight[OC,C] (bf16, one rounding); dweight[OC,C] +=
 * dout^T @ inp in fp32 (oneDNN's sum post-op: no bf16 rounding of the gradient);
 * dbias[OC] += column sums of dout. Each product runs on all threads in turn. */
void ts_cpu_bf16_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                 const void *inp, const void *weight, int N, int C, int OC)
{
    if (dinp) {
        ts_dnnl_gemm g = ts_dnnl_gemm_2d(N, C, OC, OC, C, false, C);
        ts_dnnl_matmul(&g, dinp, dout, weight, NULL);
    }
    if (dweight) { /* skipped when NULL: a zero-bubble schedule defers it */
        /* A = dout^T: element (o, n) at n * OC + o, read in place. */
        ts_dnnl_gemm g = ts_dnnl_gemm_2d(OC, C, N, 0, C, false, C);
        g.a_m = 1;
        g.a_k = OC;
        g.c_type = TS_DTYPE_F32;
        g.accumulate = true;
        ts_dnnl_matmul(&g, dweight, dout, inp, NULL);
    }
    if (dbias) {
        /* Each thread owns a range of columns (whole cache lines of dbias). */
#pragma omp parallel
        {
            size_t lines = ((size_t)OC + 15) / 16, l0, l1;
            ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
            int o0 = (int)(l0 * 16), o1 = (int)(l1 * 16 < (size_t)OC ? l1 * 16 : (size_t)OC);
            if (o1 > o0) dbias_cols(dbias, (const ts_bf16 *)dout, N, OC, o0, o1);
        }
    }
}
