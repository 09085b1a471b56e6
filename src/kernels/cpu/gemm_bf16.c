/* Muon's Newton-Schulz GEMM on the bf16 CPU table: c (fp32) = alpha * op(a) @ op(b) +
 * beta * c with bf16 operands, oneDNN's fp32 accumulation (kernels.h "gemm"). Transposed
 * operands are passed by strides, in place. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/dnnl_matmul.h"

void ts_cpu_bf16_gemm(float *c, const void *a, const void *b, int M, int N, int K, bool ta,
                      bool tb, float alpha, float beta)
{
    if (M <= 0 || N <= 0) return;
    const size_t n = (size_t)M * N;
    /* oneDNN's alpha is part of a primitive's description (one made per value, in
     * milliseconds), and Muon's alphas change with every matrix's norm: the primitive runs
     * with alpha 1, c = alpha * (op(a) @ op(b) + (beta / alpha) * c), the scalings on c. */
    const float pre = alpha != 0.0f ? beta / alpha : 0.0f;
    if (beta == 0.0f || alpha == 0.0f) {
        if (alpha == 0.0f) {
            for (size_t i = 0; i < n; i++) c[i] = beta == 0.0f ? 0.0f : c[i] * beta;
            return;
        }
    } else if (pre != 1.0f) {
        for (size_t i = 0; i < n; i++) c[i] *= pre;
    }
    ts_dnnl_gemm g = ts_dnnl_gemm_2d(M, N, K, K, N, false, N);
    g.a_m = ta ? 1 : K;
    g.a_k = ta ? M : 1;
    g.b_k = tb ? 1 : N;
    g.b_n = tb ? K : 1;
    g.c_type = TS_DTYPE_F32;
    g.accumulate = beta != 0.0f;
    ts_dnnl_matmul(&g, c, a, b, NULL);
    if (alpha != 1.0f)
        for (size_t i = 0; i < n; i++) c[i] *= alpha;
}
