/* The CUDA backend's one GEMM entry point (gemm_lt.cu), on cuBLASLt: the nn.Linear
 * products of matmul.cu (linear_gemm.h), and any other kernel file that needs a GEMM.
 *
 * Column-major, cuBLAS's convention: D[m, n] (leading dimension ldd) =
 *   op(A)[m, k] * op(B)[k, n] + beta * D (+ bias[m] on every column, when bias != NULL).
 * op(X) is X or X^T (transa / transb), where A is stored [m, k] (transa false) or [k, m]
 * (transa true) with leading dimension lda, and B likewise [k, n] or [n, k] with ldb.
 * A and B are both fp32 or both bf16 (`ab`); D is fp32 or, with bf16 A and B, bf16 (`d`).
 * Every mode accumulates in fp32 (CUBLAS_COMPUTE_32F, fp32 alpha/beta) and rounds once,
 * to D's type: fp32 x fp32 is plain fp32 with no TF32, so it matches the CPU backend to
 * fp32 rounding; bf16 x bf16 -> bf16 is the bf16 tables' activations, bf16 x bf16 -> fp32
 * their weight gradients (beta = 1). The bias is fp32 and cuBLASLt's bias has D's type,
 * so a bias goes with an fp32 D only (linear_gemm.h adds a bf16 output's bias in fp32
 * before its rounding).
 *
 * Everything is queued on the compute stream (ts_cuda_stream); the 32 MiB workspace is
 * made once on that stream's device. A shape's plan (descriptors and the heuristic's
 * algorithm) is made on its first call and kept: the key is the shape, the types, the
 * strides and each pointer's alignment (cuBLASLt's algorithms differ in what alignment
 * they need), never the pointers themselves. Thread-safe. */
#ifndef TS_KERNELS_CUDA_GEMM_LT_H
#define TS_KERNELS_CUDA_GEMM_LT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h" /* ts_dtype */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ts_dtype ab; /* A and B: float or __nv_bfloat16 elements */
    ts_dtype d;  /* D: fp32, or bf16 (with bf16 A and B) */
    bool transa, transb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    void *D;
    int ldd;
    float beta;        /* 0: D = product (+ bias); 1: D += product (gradients accumulate) */
    const float *bias; /* [m] or NULL (fp32 D only); added to every column (batch entry) */
    /* batch > 1: `batch` products, the i-th at A + i*strideA, B + i*strideB,
     * D + i*strideD (strides in elements). batch 0 or 1: one product. */
    int batch;
    int64_t strideA, strideB, strideD;
} ts_gemm;

/* Queue g on the compute stream. m, n, k >= 1 (an empty product is the caller's case to
 * handle: D = 0 or bias needs no GEMM). Aborts with the shape on a cuBLAS error. */
void ts_cuda_gemm(const ts_gemm *g);

#ifdef __cplusplus
}
#endif

#endif
