/* The CUDA backend's one GEMM entry point (gemm_lt.cu), on cuBLASLt: the nn.Linear
 * products of matmul.cu and bf16.cu, and any other kernel file that needs a GEMM
 * (batched products included).
 *
 * Column-major, cuBLAS's convention: D[m, n] (leading dimension ldd) =
 *   op(A)[m, k] * op(B)[k, n] + beta * D (+ bias[m] on every column, when bias != NULL).
 * op(X) is X or X^T (transa / transb), where A is stored [m, k] (transa false) or [k, m]
 * (transa true) with leading dimension lda, and B likewise [k, n] or [n, k] with ldb.
 * D is fp32 always; A and B are fp32 (TS_GEMM_FP32) or bf16 (TS_GEMM_BF16). Both modes
 * accumulate in fp32 (CUBLAS_COMPUTE_32F, fp32 alpha/beta): TS_GEMM_FP32 is plain fp32
 * with no TF32, so it matches the CPU backend to fp32 rounding.
 *
 * Everything is queued on the compute stream (ts_cuda_stream); the 32 MiB workspace is
 * made once on that stream's device. A shape's plan (descriptors and the heuristic's
 * algorithm) is made on its first call and kept: the key is the shape, the modes, the
 * strides and each pointer's alignment (cuBLASLt's algorithms differ in what alignment
 * they need), never the pointers themselves. Thread-safe. */
#ifndef TS_KERNELS_CUDA_GEMM_LT_H
#define TS_KERNELS_CUDA_GEMM_LT_H

#include <cuda_bf16.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TS_GEMM_FP32 = 0, TS_GEMM_BF16 = 1 } ts_gemm_mode;

typedef struct {
    ts_gemm_mode mode;
    bool transa, transb;
    int m, n, k;
    const void *A; /* float * (TS_GEMM_FP32) or __nv_bfloat16 * (TS_GEMM_BF16) */
    int lda;
    const void *B;
    int ldb;
    float *D;
    int ldd;
    float beta;        /* 0: D = product (+ bias); 1: D += product (gradients accumulate) */
    const float *bias; /* [m] or NULL; added to every column (every batch entry) */
    /* batch > 1: `batch` products, the i-th at A + i*strideA, B + i*strideB,
     * D + i*strideD (strides in elements). batch 0 or 1: one product. */
    int batch;
    int64_t strideA, strideB, strideD;
} ts_gemm;

/* Queue g on the compute stream. m, n, k >= 1 (an empty product is the caller's case to
 * handle: D = 0 or bias needs no GEMM). Aborts with the shape on a cuBLAS error. */
void ts_cuda_gemm(const ts_gemm *g);

/* dst[i] = bf16(src[i]) (round to nearest even) for i < n, queued on the compute
 * stream. */
void ts_cuda_cast_bf16(__nv_bfloat16 *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
