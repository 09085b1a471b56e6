/* oneDNN matmul for the bf16 CPU kernels: C (=, or +=) alpha * A @ B (+ bias), A and B
 * bf16, C fp32 or bf16, fp32 accumulation, an optional fp32 bias[N] added before C's one
 * rounding. Every operand is described by strides (in elements), so a transposed
 * operand, a sub-block of a larger matrix, or one head's columns inside attention's
 * packed qkv [B,T,3C] are passed in place, without copies; up to two batch dimensions
 * (attention's batch and head) with their own strides.
 *
 * Primitives cost milliseconds to create: each distinct description is made once and
 * kept in a fixed table (kernels/cpu/dnnl_matmul.c). Safe to call from inside an OpenMP
 * parallel region (attention calls it per head, each thread on its own): oneDNN then
 * runs single-threaded on the calling thread, with that thread's scratchpad and stream.
 * A oneDNN error aborts with the failing call named (a broken description is a
 * programming error, not a user's). */
#ifndef TS_KERNELS_CPU_DNNL_MATMUL_H
#define TS_KERNELS_CPU_DNNL_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"

typedef struct {
    int batch0, batch1; /* batch dimensions (1 when absent) */
    int M, N, K;
    /* A[i,j][m,k] at a_b0*i + a_b1*j + a_m*m + a_k*k; B[.][k,n] and C[.][m,n] alike
     * (C's columns contiguous). A row-major [M,K] is a_m = lda, a_k = 1; B given as
     * [N,K] row-major (nn.Linear's weight, B transposed) is b_k = 1, b_n = ldb. */
    int64_t a_b0, a_b1, a_m, a_k;
    int64_t b_b0, b_b1, b_k, b_n;
    int64_t c_b0, c_b1, c_m;
    ts_dtype c_type;
    float alpha;     /* scales A @ B (1: none); not together with a bias */
    bool accumulate; /* C += ... (oneDNN's sum post-op) rather than C = ... */
    bool bias;       /* a bias[N] is passed */
    /* M (or K) is given only at execution: one primitive serves every value (oneDNN's
     * DNNL_RUNTIME_DIM_VAL), keyed without it. For the grouped expert GEMMs, whose row
     * counts change every micro-batch: a primitive per count would be made (milliseconds
     * each) and would evict the dense layers' from the table. M and K still hold this
     * call's values; the strides must not depend on them. Where oneDNN has no kernel
     * for the runtime description on this CPU, the call runs the fixed one instead
     * (remembered: asked once per description). */
    bool runtime_m, runtime_k;
} ts_dnnl_gemm;

/* A plain description: C[M,N] = A[M,K] @ B, no batch, row strides lda, ldb, ldc;
 * b_nk: B is given as [N,K] row-major (transposed), else as [K,N]. alpha 1, C bf16,
 * no accumulation, no bias: the caller sets those fields. */
ts_dnnl_gemm ts_dnnl_gemm_2d(int M, int N, int K, int64_t lda, int64_t ldb, bool b_nk,
                             int64_t ldc);

/* Runs g on the given pointers (bias only when g->bias). Blocks until done. */
void ts_dnnl_matmul(const ts_dnnl_gemm *g, void *C, const void *A, const void *B,
                    const float *bias);

#endif
