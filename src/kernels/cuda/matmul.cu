/* nn.Linear in fp32 on the GEMM layer (gemm_lt.h, cuBLASLt):
 * out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias.
 *
 * cuBLAS is column-major: a row-major [R,K] matrix is a column-major [K,R] one with
 * leading dimension K, so each row-major product is computed transposed:
 *   out^T [OC,N]     = weight [OC,C]-as-(C x OC)^T * inp^T + bias  (OP_T, OP_N), bias epilogue
 *   dinp^T [C,N]     = weight^T (C x OC) * dout^T (OC x N)          (OP_N, OP_N)
 *   dweight^T [C,OC] += inp^T (C x N) * dout (N x OC)               (OP_N, OP_T), beta = 1
 * The compute type is CUBLAS_COMPUTE_32F (no TF32), so results match the CPU backend to
 * fp32 rounding. The bf16 table's matmuls (bf16.cu) are the same products on bf16
 * copies of the operands, and share the bias gradient below. */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/linear_gemm.h"

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

void ts_cuda_dbias_accumulate(float *dbias, const float *dout, int N, int OC)
{
    if (!dbias || N <= 0 || OC <= 0) return;
    dim3 block(DB_COLS, DB_ROWS);
    dbias_kernel<<<ts_cuda_blocks((size_t)OC, DB_COLS), block, 0, ts_cuda_stream()>>>(dbias, dout,
                                                                                      N, OC);
    TS_CUDA_LAUNCHED();
}

/* out = bias on every row (or 0): the product of an empty inner dimension. */
__global__ void fill_bias_kernel(float *out, const float *bias, size_t rows, int OC)
{
    size_t total = rows * (size_t)OC;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] = bias ? bias[i % (size_t)OC] : 0.0f;
}

void ts_cuda_matmul_empty_forward(float *out, const float *bias, int N, int OC)
{
    size_t total = (size_t)N * OC;
    if (total == 0) return;
    size_t threads_needed = total < ((size_t)1 << 24) ? total : ((size_t)1 << 24);
    fill_bias_kernel<<<ts_cuda_blocks(threads_needed, 256), 256, 0, ts_cuda_stream()>>>(
        out, bias, (size_t)N, OC);
    TS_CUDA_LAUNCHED();
}

void ts_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC)
{
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {
        ts_cuda_matmul_empty_forward(out, bias, N, OC);
        return;
    }
    ts_linear_forward_gemm(TS_GEMM_FP32, out, inp, weight, bias, N, C, OC);
}

void ts_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC)
{
    if (dinp && N > 0 && C > 0) {
        if (OC > 0) {
            ts_linear_dinp_gemm(TS_GEMM_FP32, dinp, dout, weight, N, C, OC);
        } else {
            TS_CUDA_CHECK(
                cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(float), ts_cuda_stream()));
        }
    }
    if (dweight && N > 0 && C > 0 && OC > 0)
        ts_linear_dweight_gemm(TS_GEMM_FP32, dweight, inp, dout, N, C, OC);
    ts_cuda_dbias_accumulate(dbias, dout, N, OC);
}
