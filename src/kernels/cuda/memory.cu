/* The CUDA backend's memory, ordering and reductions: the one compute stream and the
 * cuBLAS handle bound to it, device buffers, copies (host copies wait for the stream, so
 * the host may reuse or read its buffer as soon as the call returns), streams and
 * events, and the deterministic double-precision sums (the same input gives the same
 * bits on every run: block partials in a fixed order, then one block sums them). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_internal.h"

void ts_cuda_fail(const char *file, int line, const char *call, const char *why)
{
    fprintf(stderr, "tessera: CUDA error at %s:%d: %s: %s\n", file, line, call,
            why ? why : "(unknown)");
    fflush(stderr);
    abort();
}

/* ---- the compute stream and the cuBLAS handle (C++ function-local statics: made once,
 * thread-safely, on the device current at first use) */

static cudaStream_t make_stream(void)
{
    cudaStream_t s = nullptr;
    TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

cudaStream_t ts_cuda_stream(void)
{
    static cudaStream_t s = make_stream();
    return s;
}

static cublasHandle_t make_cublas(void)
{
    cublasHandle_t h = nullptr;
    TS_CUBLAS_CHECK(cublasCreate(&h));
    TS_CUBLAS_CHECK(cublasSetStream(h, ts_cuda_stream()));
    /* fp32 mode matches the CPU backend to 1e-5: no TF32 tensor-core rounding. */
    TS_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
}

cublasHandle_t ts_cuda_cublas(void)
{
    static cublasHandle_t h = make_cublas();
    return h;
}

int ts_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not an error here */
        return 0;
    }
    return n;
}

int ts_cuda_select_device(int local_rank)
{
    int n = ts_cuda_device_count();
    TS_ASSERT(n > 0 && local_rank >= 0);
    TS_CUDA_CHECK(cudaSetDevice(local_rank % n));
    return local_rank % n;
}

/* ---- device memory */

void *ts_cuda_dev_alloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes); /* 256-byte aligned */
    if (e != cudaSuccess || !p) {
        char what[160];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes = %.1f MiB) for a device buffer", bytes,
                 (double)bytes / (1024.0 * 1024.0));
        ts_cuda_fail(__FILE__, __LINE__, what, cudaGetErrorString(e));
    }
    cudaStream_t s = ts_cuda_stream();
    TS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
    return p;
}

void ts_cuda_dev_free(void *p)
{
    if (!p) return;
    /* Work queued on the compute stream may still read p: wait for it (cudaFree also
     * synchronises the device, but say so rather than rely on it). */
    TS_CUDA_CHECK(cudaStreamSynchronize(ts_cuda_stream()));
    TS_CUDA_CHECK(cudaFree(p));
}

void ts_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    cudaStream_t s = ts_cuda_stream();
    TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    TS_CUDA_CHECK(cudaStreamSynchronize(s)); /* the host buffer may be reused at once */
}

void ts_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    cudaStream_t s = ts_cuda_stream();
    TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
}

/* A column block: one 2-D copy on the compute stream (the buffers do not overlap). */
void ts_cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows)
{
    if (!width || !rows) return;
    TS_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                    cudaMemcpyDeviceToDevice, ts_cuda_stream()));
}

/* memmove's rule. cudaMemcpy on overlapping ranges is undefined, so an overlapping move
 * goes through a temporary device buffer (ZeRO-1 moves a rank's piece within the
 * gradient buffer, once a step: the extra copy is cheap). Queued on the compute stream,
 * ordered with the kernels around it. */

void ts_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    cudaStream_t s = ts_cuda_stream();
    uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
    bool overlap = d < r + bytes && r < d + bytes;
    if (!overlap) {
        TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        return;
    }
    /* Stream-ordered, as every device Tessera builds for (sm_80, sm_90) allows: a
     * cudaFree here would synchronise the whole device, which deadlocks when another
     * stream's NCCL kernel waits for a peer that waits for this rank's host (a pipeline
     * receive). */
    void *tmp = NULL;
    TS_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, s));
    TS_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, s));
    TS_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, s));
    TS_CUDA_CHECK(cudaFreeAsync(tmp, s));
}

void ts_cuda_memset_zero(void *dst, size_t bytes)
{
    if (!bytes) return;
    TS_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, ts_cuda_stream()));
}

/* ---- deterministic sums in double.
 * Pass 1: `blocks` blocks (a function of n alone, never of the device, so every GPU
 * gives the same bits), each thread summing a fixed grid-stride set of elements, then a
 * fixed shared-memory tree, one partial per block. Pass 2: one block sums the partials
 * in the same fixed way and adds the total to acc[0]. The partials live in one small
 * scratch buffer reused by every call: the calls are ordered on the compute stream. */

static constexpr unsigned SUM_THREADS = 256, SUM_MAX_BLOCKS = 1024, SUM_PER_THREAD = 8;

template <bool SQUARES>
__global__ void sum_partials_kernel(double *partials, const float *x, size_t n)
{
    __shared__ double sh[SUM_THREADS];
    double s = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = (double)x[i];
        s += SQUARES ? v * v : v;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = SUM_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void sum_finish_kernel(double *acc, const double *partials, unsigned nparts)
{
    __shared__ double sh[SUM_THREADS];
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < nparts; i += SUM_THREADS) s += partials[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = SUM_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) acc[0] += sh[0];
}

/* SUM_MAX_BLOCKS partials, then one double for sum_squares' result. */
static double *sum_scratch(void)
{
    static double *scratch = (double *)ts_cuda_dev_alloc((SUM_MAX_BLOCKS + 1) * sizeof(double));
    return scratch;
}

template <bool SQUARES>
static void sum_into(double *acc, const float *x, size_t n)
{
    if (n == 0) return; /* acc += 0 */
    const size_t per_block = (size_t)SUM_THREADS * SUM_PER_THREAD;
    size_t want = (n + per_block - 1) / per_block;
    unsigned blocks = want < SUM_MAX_BLOCKS ? (unsigned)want : SUM_MAX_BLOCKS;
    cudaStream_t s = ts_cuda_stream();
    double *partials = sum_scratch();
    sum_partials_kernel<SQUARES><<<blocks, SUM_THREADS, 0, s>>>(partials, x, n);
    TS_CUDA_LAUNCHED();
    sum_finish_kernel<<<1, SUM_THREADS, 0, s>>>(acc, partials, blocks);
    TS_CUDA_LAUNCHED();
}

void ts_cuda_sum_into(double *acc, const float *x, size_t n) { sum_into<false>(acc, x, n); }

void ts_cuda_sum_squares_into(double *acc, const float *x, size_t n)
{
    sum_into<true>(acc, x, n);
}

double ts_cuda_sum_squares(const float *x, size_t n)
{
    double *result = sum_scratch() + SUM_MAX_BLOCKS;
    TS_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), ts_cuda_stream()));
    sum_into<true>(result, x, n);
    double host = 0.0;
    ts_cuda_memcpy_d2h(&host, result, sizeof host);
    return host;
}

/* ---- streams and events (NULL = the compute stream) */

static cudaStream_t stream_of(ts_stream s)
{
    return s ? reinterpret_cast<cudaStream_t>(s) : ts_cuda_stream();
}

ts_stream ts_cuda_stream_create(void)
{
    cudaStream_t s = nullptr;
    TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return reinterpret_cast<ts_stream>(s);
}

void ts_cuda_stream_destroy(ts_stream s)
{
    if (!s) return; /* the compute stream lives as long as the process */
    TS_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
    TS_CUDA_CHECK(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(s)));
}

void ts_cuda_stream_sync(ts_stream s) { TS_CUDA_CHECK(cudaStreamSynchronize(stream_of(s))); }

ts_event ts_cuda_event_record(ts_stream s)
{
    cudaEvent_t e = nullptr;
    TS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TS_CUDA_CHECK(cudaEventRecord(e, stream_of(s)));
    return reinterpret_cast<ts_event>(e);
}

void ts_cuda_event_wait(ts_event e)
{
    if (!e) return;
    cudaEvent_t ev = reinterpret_cast<cudaEvent_t>(e);
    TS_CUDA_CHECK(cudaEventSynchronize(ev));
    TS_CUDA_CHECK(cudaEventDestroy(ev));
}
