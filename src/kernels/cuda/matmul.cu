/* nn.Linear on cuBLAS, fp32: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias.
 *
 * cuBLAS is column-major: a row-major [R,K] matrix is a column-major [K,R] one with
 * leading dimension K, so each row-major product is computed transposed:
 *   out^T [OC,N]     = weight [OC,C]-as-(C x OC)^T * inp^T      (OP_T, OP_N)
 *   dinp^T [C,N]     = weight^T (C x OC) * dout^T (OC x N)       (OP_N, OP_N)
 *   dweight^T [C,OC] += inp^T (C x N) * dout (N x OC)            (OP_N, OP_T), beta = 1
 * The math mode is CUBLAS_DEFAULT_MATH (memory.cu): no TF32, so results match the CPU
 * backend to fp32 rounding.
 *
 * Next step (issue 13, bf16): cuBLASLt matmuls in bf16 with fp32 accumulation, the bias
 * (and GELU) fused as epilogues (CUBLASLT_EPILOGUE_BIAS / _GELU_AUX_BIAS, and BGRADB for
 * dbias in the dweight product), replacing the separate bias kernels below. */
#include "kernels/cuda/cuda_internal.h"

/* out[n, o] += bias[o] over N rows of OC. */
__global__ void add_bias_kernel(float *out, const float *bias, size_t rows, int OC)
{
    size_t total = rows * (size_t)OC;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] += bias[i % (size_t)OC];
}

/* dbias[o] += sum over rows of dout[:, o]. A block owns DB_COLS columns; its DB_ROWS
 * thread rows each sum a fixed strided set of rows (coalesced: a warp reads 32
 * consecutive columns of one row), then thread row 0 adds the DB_ROWS partials in order:
 * the same bits on every run. */
static constexpr int DB_COLS = 32, DB_ROWS = 16;

__global__ void dbias_kernel(float *dbias, const float *dout, int N, int OC)
{
    __shared__ float sh[DB_ROWS][DB_COLS];
    int o = blockIdx.x * DB_COLS + threadIdx.x;
    float s = 0.0f;
    if (o < OC)
        for (int n = threadIdx.y; n < N; n += DB_ROWS) s += dout[(size_t)n * OC + o];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float t = 0.0f;
        for (int r = 0; r < DB_ROWS; r++) t += sh[r][threadIdx.x];
        dbias[o] += t;
    }
}

void ts_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC)
{
    if (N <= 0 || OC <= 0) return;
    cudaStream_t s = ts_cuda_stream();
    if (C <= 0) { /* an empty product: out = bias (or 0) */
        TS_CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(float), s));
    } else {
        const float one = 1.0f, zero = 0.0f;
        TS_CUBLAS_CHECK(cublasSgemm(ts_cuda_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one,
                                    weight, C, inp, C, &zero, out, OC));
    }
    if (bias) {
        size_t total = (size_t)N * OC;
        add_bias_kernel<<<ts_cuda_blocks(total < ((size_t)1 << 24) ? total : ((size_t)1 << 24), 256),
                          256, 0, s>>>(out, bias, (size_t)N, OC);
        TS_CUDA_LAUNCHED();
    }
}

void ts_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC)
{
    cublasHandle_t h = ts_cuda_cublas();
    const float one = 1.0f, zero = 0.0f;
    if (dinp && N > 0 && C > 0) {
        if (OC > 0)
            TS_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                                        dout, OC, &zero, dinp, C));
        else
            TS_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(float), ts_cuda_stream()));
    }
    if (dweight && N > 0 && C > 0 && OC > 0)
        TS_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
                                    &one, dweight, C));
    if (dbias && N > 0 && OC > 0) {
        dim3 block(DB_COLS, DB_ROWS);
        dbias_kernel<<<ts_cuda_blocks((size_t)OC, DB_COLS), block, 0, ts_cuda_stream()>>>(
            dbias, dout, N, OC);
        TS_CUDA_LAUNCHED();
    }
}
