/* The grouped expert GEMMs (kernels.h grouped_matmul_*) on cuBLAS, both activation
 * types: each expert's nn.Linear product is matmul.cu's (linear_gemm.h: every row-major
 * product computed transposed in cuBLAS's column-major view), the experts' products of
 * one kind in one cublasGemmGroupedBatchedEx call (one group per expert with rows, group
 * size 1: its own m/n/k, leading dimensions and pointers) where cuBLAS has that call for
 * the types, else one cuBLASLt call per expert (ts_cuda_gemm):
 *   fp32 forward, input and weight gradients: grouped (fp32 A, B, C, CUBLAS_COMPUTE_32F:
 *     no TF32, as the handle's math mode);
 *   bf16 forward and input gradient: grouped (bf16 A, B and C, fp32 compute);
 *   bf16 weight gradient: bf16 A and B into the fp32 gradient (beta = 1), a type mix the
 *     grouped call does not list (cuBLAS's table for cublasGemmGroupedBatchedEx: A, B
 *     and C all 16F, all 16BF or all 32F under CUBLAS_COMPUTE_32F): the cuBLASLt loop.
 * The grouped call takes its A/B/C pointer arrays in device memory: the host builds them
 * and copies them into a buffer allocated and freed in stream order on the compute
 * stream (a pageable-memory copy returns once the source is read, so the host arrays
 * are freed at once). Compiled only: no GPU has run it yet (bench/gpu_check.sh runs
 * test_cuda_kernels' grouped cases). */
#include <stdlib.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/linear_gemm.h"

namespace {

enum product { PRODUCT_OUT, PRODUCT_DINP, PRODUCT_DWEIGHT };

/* One product of every expert with rows, as one grouped call. */
struct grouped_call {
    int count = 0; /* groups: the experts with rows */
    cublasOperation_t *ta = nullptr, *tb = nullptr;
    int *m = nullptr, *n = nullptr, *k = nullptr, *lda = nullptr, *ldb = nullptr, *ldc = nullptr,
        *size = nullptr;
    float *alpha = nullptr, *beta = nullptr;
    const void **A = nullptr, **B = nullptr;
    void **C = nullptr;
};

/* Host arrays for L groups at most, in one allocation each type. */
static void call_init(grouped_call *g, int L)
{
    g->ta = (cublasOperation_t *)ts_malloc(2 * (size_t)L * sizeof(cublasOperation_t));
    g->tb = g->ta + L;
    g->m = (int *)ts_malloc(7 * (size_t)L * sizeof(int));
    g->n = g->m + L, g->k = g->m + 2 * L, g->lda = g->m + 3 * L, g->ldb = g->m + 4 * L;
    g->ldc = g->m + 5 * L, g->size = g->m + 6 * L;
    g->alpha = (float *)ts_malloc(2 * (size_t)L * sizeof(float));
    g->beta = g->alpha + L;
    g->A = (const void **)ts_malloc(3 * (size_t)L * sizeof(void *));
    g->B = g->A + L;
    g->C = (void **)(g->A + 2 * L);
}

static void call_free(grouped_call *g)
{
    free(g->ta);
    free(g->m);
    free(g->alpha);
    free(g->A);
}

/* Adds one expert's product (linear_gemm.h's operands and leading dimensions). */
static void call_add(grouped_call *g, bool transa, bool transb, int m, int n, int k,
                     const void *A, int lda, const void *B, int ldb, void *C, int ldc, float beta)
{
    const int i = g->count++;
    g->ta[i] = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    g->tb[i] = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    g->m[i] = m, g->n[i] = n, g->k[i] = k;
    g->lda[i] = lda, g->ldb[i] = ldb, g->ldc[i] = ldc;
    g->size[i] = 1;
    g->alpha[i] = 1.0f, g->beta[i] = beta;
    g->A[i] = A, g->B[i] = B, g->C[i] = C;
}

static void call_run(const grouped_call *g, cudaDataType_t ab, cudaDataType_t c)
{
    if (g->count == 0) return;
    cudaStream_t s = ts_cuda_stream();
    const size_t bytes = 3 * (size_t)g->count * sizeof(void *);
    void **dev = nullptr;
    TS_CUDA_CHECK(cudaMallocAsync((void **)&dev, bytes, s));
    /* The groups' A, B and C pointers into one device buffer [A | B | C], count each. */
    TS_CUDA_CHECK(cudaMemcpyAsync(dev, g->A, (size_t)g->count * sizeof(void *),
                                  cudaMemcpyHostToDevice, s));
    TS_CUDA_CHECK(cudaMemcpyAsync(dev + g->count, g->B, (size_t)g->count * sizeof(void *),
                                  cudaMemcpyHostToDevice, s));
    TS_CUDA_CHECK(cudaMemcpyAsync(dev + 2 * g->count, g->C, (size_t)g->count * sizeof(void *),
                                  cudaMemcpyHostToDevice, s));
    TS_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        ts_cuda_cublas(), g->ta, g->tb, g->m, g->n, g->k, g->alpha, (const void *const *)dev, ab,
        g->lda, (const void *const *)(dev + g->count), ab, g->ldb, g->beta, dev + 2 * g->count,
        c, g->ldc, g->count, g->size, CUBLAS_COMPUTE_32F));
    TS_CUDA_CHECK(cudaFreeAsync(dev, s));
}

template <typename A> static constexpr ts_dtype dtype_of(void)
{
    return sizeof(A) == sizeof(float) ? TS_DTYPE_F32 : TS_DTYPE_BF16;
}

template <typename A> static constexpr cudaDataType_t cuda_type(void)
{
    return sizeof(A) == sizeof(float) ? CUDA_R_32F : CUDA_R_16BF;
}

/* Every expert's product p: grouped, or (the bf16 weight gradient) one cuBLASLt call per
 * expert. Empty experts are left out (their dweight untouched). */
template <typename A>
static void run_product(product p, void *out, float *const *dweights, const void *src,
                        const void *inp, const void *const *weights, const int *rows, int L,
                        int C, int OC)
{
    constexpr ts_dtype t = dtype_of<A>();
    if (p == PRODUCT_DWEIGHT && t == TS_DTYPE_BF16) {
        size_t o = 0;
        for (int e = 0; e < L; o += (size_t)rows[e], e++)
            if (rows[e] > 0)
                ts_linear_dweight_gemm(t, dweights[e], (const A *)inp + o * C,
                                       (const A *)src + o * OC, rows[e], C, OC);
        return;
    }
    grouped_call g;
    call_init(&g, L);
    size_t o = 0;
    for (int e = 0; e < L; o += (size_t)rows[e], e++) {
        const int n = rows[e];
        if (n == 0) continue;
        if (p == PRODUCT_OUT) /* out^T [OC,n] = weight (OP_T) * inp^T */
            call_add(&g, true, false, OC, n, C, weights[e], C, (const A *)src + o * C, C,
                     (A *)out + o * OC, OC, 0.0f);
        else if (p == PRODUCT_DINP) /* dinp^T [C,n] = weight (C x OC) * dout^T */
            call_add(&g, false, false, C, n, OC, weights[e], C, (const A *)src + o * OC, OC,
                     (A *)out + o * C, C, 0.0f);
        else /* dweight^T [C,OC] += inp^T (C x n) * dout (n x OC) */
            call_add(&g, false, true, C, OC, n, (const A *)inp + o * C, C,
                     (const A *)src + o * OC, OC, dweights[e], C, 1.0f);
    }
    call_run(&g, cuda_type<A>(), p == PRODUCT_DWEIGHT ? CUDA_R_32F : cuda_type<A>());
    call_free(&g);
}

template <typename A>
static void grouped_forward(void *out, const void *inp, const void *const *weights,
                            const int *rows, int L, int C, int OC)
{
    TS_ASSERT(C > 0 && OC > 0);
    run_product<A>(PRODUCT_OUT, out, nullptr, inp, nullptr, weights, rows, L, C, OC);
}

template <typename A>
static void grouped_backward(void *dinp, float *const *dweights, const void *dout,
                             const void *inp, const void *const *weights, const int *rows, int L,
                             int C, int OC)
{
    TS_ASSERT(C > 0 && OC > 0);
    if (dinp) run_product<A>(PRODUCT_DINP, dinp, nullptr, dout, nullptr, weights, rows, L, C, OC);
    if (dweights)
        run_product<A>(PRODUCT_DWEIGHT, nullptr, dweights, dout, inp, weights, rows, L, C, OC);
}

} // namespace

void ts_cuda_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                    const int *rows, int L, int C, int OC)
{
    grouped_forward<float>(out, inp, weights, rows, L, C, OC);
}

void ts_cuda_bf16_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                         const int *rows, int L, int C, int OC)
{
    grouped_forward<bf16>(out, inp, weights, rows, L, C, OC);
}

void ts_cuda_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                     const void *inp, const void *const *weights,
                                     const int *rows, int L, int C, int OC)
{
    grouped_backward<float>(dinp, dweights, dout, inp, weights, rows, L, C, OC);
}

void ts_cuda_bf16_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                          const void *inp, const void *const *weights,
                                          const int *rows, int L, int C, int OC)
{
    grouped_backward<bf16>(dinp, dweights, dout, inp, weights, rows, L, C, OC);
}
