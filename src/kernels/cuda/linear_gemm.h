/* The three GEMMs of nn.Linear (out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias), for
 * matmul.cu's fp32 and bf16 slots, which differ only in the element types: one place
 * states each product's transposes and leading dimensions. matmul.cu's comment derives
 * them (each row-major product computed transposed, in cuBLAS's column-major view).
 * `ab` is the operands' type (the activations' and the compute weight's), `d` the
 * result's (gemm_lt.h: a bf16 result needs bf16 operands and takes no bias). Each needs
 * N, C, OC >= 1. */
#ifndef TS_KERNELS_CUDA_LINEAR_GEMM_H
#define TS_KERNELS_CUDA_LINEAR_GEMM_H

#include "kernels/cuda/gemm_lt.h"

/* One product D = op(A) op(B) + beta D (+ bias): gemm_lt.h's terms, one call. */
static inline void ts_linear_gemm(ts_dtype ab, ts_dtype d, bool transa, bool transb, int m,
                                  int n, int k, const void *A, int lda, const void *B, int ldb,
                                  void *D, int ldd, float beta, const float *bias)
{
    ts_gemm g = {};
    g.ab = ab, g.d = d;
    g.transa = transa, g.transb = transb;
    g.m = m, g.n = n, g.k = k;
    g.A = A, g.lda = lda;
    g.B = B, g.ldb = ldb;
    g.D = D, g.ldd = ldd;
    g.beta = beta;
    g.bias = bias;
    ts_cuda_gemm(&g);
}

/* out^T [OC,N] = weight^T-as-stored (OP_T) * inp^T + bias: the forward, bias epilogue
 * (bias only with an fp32 out). */
static inline void ts_linear_forward_gemm(ts_dtype ab, ts_dtype d, void *out, const void *inp,
                                          const void *weight, const float *bias, int N, int C,
                                          int OC)
{
    ts_linear_gemm(ab, d, true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, bias);
}

/* dinp^T [C,N] = weight (C x OC) * dout^T (OC x N): overwrites dinp, in the operands'
 * type. */
static inline void ts_linear_dinp_gemm(ts_dtype ab, void *dinp, const void *dout,
                                       const void *weight, int N, int C, int OC)
{
    ts_linear_gemm(ab, ab, false, false, C, N, OC, weight, C, dout, OC, dinp, C, 0.0f, NULL);
}

/* dweight^T [C,OC] += inp^T (C x N) * dout (N x OC): accumulates (beta = 1) into the fp32
 * gradient, whatever the operands' type. */
static inline void ts_linear_dweight_gemm(ts_dtype ab, float *dweight, const void *inp,
                                          const void *dout, int N, int C, int OC)
{
    ts_linear_gemm(ab, TS_DTYPE_F32, false, true, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f,
                   NULL);
}

#endif
