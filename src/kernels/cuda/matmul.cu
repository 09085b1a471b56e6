/* nn.Linear on the GEMM layer (gemm_lt.h, cuBLASLt), for both activation types:
 * out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias.
 *
 * cuBLAS is column-major: a row-major [R,K] matrix is a column-major [K,R] one with
 * leading dimension K, so each row-major product is computed transposed:
 *   out^T [OC,N]     = weight [OC,C]-as-(C x OC)^T * inp^T + bias  (OP_T, OP_N), bias epilogue
 *   dinp^T [C,N]     = weight^T (C x OC) * dout^T (OC x N)          (OP_N, OP_N)
 *   dweight^T [C,OC] += inp^T (C x N) * dout (N x OC)               (OP_N, OP_T), beta = 1
 * The compute type is CUBLAS_COMPUTE_32F (no TF32) in both precisions.
 *
 * fp32 tables: fp32 operands and results, matching the CPU backend to fp32 rounding.
 *
 * bf16 tables: inp, dout and the weight (the model's bf16 compute copy) are bf16 GEMM
 * operands as they lie in memory (no cast, no copy); out and dinp are written bf16 by the
 * GEMM, rounded once from the fp32 accumulator; dweight accumulates in fp32 (fp32 D,
 * beta = 1). The fp32 bias must be added before that one rounding (kernels.h), but
 * cuBLASLt's bias epilogue takes a bias of D's type only (cublasLt.h,
 * CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: bf16 for a bf16 D), so a biased bf16 forward runs
 * in row chunks through a fixed fp32 scratch: the GEMM (bf16 operands, fp32 bias
 * epilogue) into the scratch, then one conversion to bf16 into out. dbias sums the bf16
 * dout in fp32 (the deterministic column sum below). */
#include <mutex>
#include <stdio.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/linear_gemm.h"

/* dbias[o] += sum over rows of dout[:, o]. A block owns DB_COLS columns; its DB_ROWS
 * thread rows each sum a fixed strided set of rows (coalesced: a warp reads 32
 * consecutive columns of one row), then thread row 0 adds the DB_ROWS partials in order:
 * the same bits on every run. */
static constexpr int DB_COLS = 32, DB_ROWS = 16;

template <typename A> __global__ void dbias_kernel(float *dbias, const A *dout, int N, int OC)
{
    __shared__ float sh[DB_ROWS][DB_COLS];
    int o = blockIdx.x * DB_COLS + threadIdx.x;
    float s = 0.0f;
    if (o < OC)
        for (int n = threadIdx.y; n < N; n += DB_ROWS) s += ts_act_load(dout, (size_t)n * OC + o);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float t = 0.0f;
        for (int r = 0; r < DB_ROWS; r++) t += sh[r][threadIdx.x];
        dbias[o] += t;
    }
}

template <typename A> static void dbias_accumulate(float *dbias, const void *dout, int N, int OC)
{
    if (!dbias || N <= 0 || OC <= 0) return;
    dim3 block(DB_COLS, DB_ROWS);
    dbias_kernel<A><<<ts_cuda_blocks((size_t)OC, DB_COLS), block, 0, ts_cuda_stream()>>>(
        dbias, (const A *)dout, N, OC);
    TS_CUDA_LAUNCHED();
}

/* out = bias on every row (or 0): the product of an empty inner dimension. */
template <typename A>
__global__ void fill_bias_kernel(A *out, const float *bias, size_t rows, int OC)
{
    size_t total = rows * (size_t)OC;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        ts_act_store(out, i, bias ? bias[i % (size_t)OC] : 0.0f);
}

template <typename A> static void empty_forward(void *out, const float *bias, int N, int OC)
{
    size_t total = (size_t)N * OC;
    if (total == 0) return;
    size_t threads_needed = total < ((size_t)1 << 24) ? total : ((size_t)1 << 24);
    fill_bias_kernel<A><<<ts_cuda_blocks(threads_needed, 256), 256, 0, ts_cuda_stream()>>>(
        (A *)out, bias, (size_t)N, OC);
    TS_CUDA_LAUNCHED();
}

/* ---- the biased bf16 forward through an fp32 scratch (see the top) */

/* 8 Mi floats (32 MiB): chunks of thousands of rows at GPT-2's widths, so each GEMM stays
 * large. Made once, stream-ordered on the compute stream (a cudaMalloc could synchronise
 * the device while another stream's NCCL kernel waits for a peer that waits for this
 * rank's host: a pipeline receive). Calls queue on the one compute stream, so chunk k+1's
 * GEMM overwrites the scratch only after chunk k's conversion has read it; the mutex
 * keeps two host threads' chunks from interleaving in that queue. */
static constexpr size_t BIAS_SCRATCH_FLOATS = (size_t)8 << 20;

static std::mutex &bias_scratch_mutex(void)
{
    static std::mutex *mu = new std::mutex; /* lives as long as the process */
    return *mu;
}

static float *bias_scratch(void)
{
    static float *scratch = [] {
        void *p = nullptr;
        TS_CUDA_CHECK(cudaMallocAsync(&p, BIAS_SCRATCH_FLOATS * sizeof(float), ts_cuda_stream()));
        return (float *)p;
    }();
    return scratch;
}

static void bf16_forward_biased(bf16 *out, const bf16 *inp, const bf16 *weight, const float *bias,
                                int N, int C, int OC)
{
    if ((size_t)OC > BIAS_SCRATCH_FLOATS) {
        char why[160];
        snprintf(why, sizeof why, "a biased bf16 matmul with OC = %d is wider than its fp32 "
                                  "scratch row (%zu floats)", OC, BIAS_SCRATCH_FLOATS);
        ts_cuda_fail(__FILE__, __LINE__, "ts_cuda_bf16_matmul_forward", why);
    }
    const size_t fit = BIAS_SCRATCH_FLOATS / (size_t)OC;
    const int rows = fit < (size_t)N ? (int)fit : N;
    std::lock_guard<std::mutex> lock(bias_scratch_mutex());
    float *tmp = bias_scratch();
    for (int r0 = 0; r0 < N; r0 += rows) {
        int nr = N - r0 < rows ? N - r0 : rows;
        ts_linear_forward_gemm(TS_DTYPE_BF16, TS_DTYPE_F32, tmp, inp + (size_t)r0 * C, weight,
                               bias, nr, C, OC);
        ts_cuda_convert(out + (size_t)r0 * OC, TS_DTYPE_BF16, tmp, TS_DTYPE_F32,
                        (size_t)nr * OC);
    }
}

/* ---- the slots */

template <typename A> static constexpr ts_dtype act_dtype(void)
{
    return sizeof(A) == sizeof(float) ? TS_DTYPE_F32 : TS_DTYPE_BF16;
}

template <typename A>
static void matmul_forward(void *out, const void *inp, const void *weight, const float *bias,
                           int N, int C, int OC)
{
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {
        empty_forward<A>(out, bias, N, OC);
        return;
    }
    constexpr ts_dtype t = act_dtype<A>();
    if (t == TS_DTYPE_BF16 && bias)
        bf16_forward_biased((bf16 *)out, (const bf16 *)inp, (const bf16 *)weight, bias, N, C, OC);
    else
        ts_linear_forward_gemm(t, t, out, inp, weight, bias, N, C, OC);
}

template <typename A>
static void matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC)
{
    constexpr ts_dtype t = act_dtype<A>();
    if (dinp && N > 0 && C > 0) {
        if (OC > 0) {
            ts_linear_dinp_gemm(t, dinp, dout, weight, N, C, OC);
        } else { /* an empty product: zeros (all-zero bits in either type) */
            TS_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(A), ts_cuda_stream()));
        }
    }
    if (dweight && N > 0 && C > 0 && OC > 0)
        ts_linear_dweight_gemm(t, dweight, inp, dout, N, C, OC);
    dbias_accumulate<A>(dbias, dout, N, OC);
}

#define TS_MATMUL_SLOTS(p, A)                                                                   \
    extern "C" void p##matmul_forward(void *out, const void *inp, const void *weight,           \
                                      const float *bias, int N, int C, int OC)                  \
    {                                                                                           \
        matmul_forward<A>(out, inp, weight, bias, N, C, OC);                                    \
    }                                                                                           \
    extern "C" void p##matmul_backward(void *dinp, float *dweight, float *dbias,                \
                                       const void *dout, const void *inp, const void *weight,   \
                                       int N, int C, int OC)                                    \
    {                                                                                           \
        matmul_backward<A>(dinp, dweight, dbias, dout, inp, weight, N, C, OC);                  \
    }

TS_MATMUL_SLOTS(ts_cuda_, float)
TS_MATMUL_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_MATMUL_SLOTS
