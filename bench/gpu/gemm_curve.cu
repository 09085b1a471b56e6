/* The GPU's two ceilings, measured (bench/gpu/bench_gpu.sh runs this first):
 *
 *   1. cuBLASLt bf16 GEMM throughput: square n x n x n for n = 256 .. 16384, and the
 *      GEMMs one training step of GPT-2 124M runs (forward, input and weight gradients,
 *      the attention's batched products), as TFLOP/s and as a fraction of the dense bf16
 *      peak. Inputs bf16, fp32 accumulation (CUBLAS_COMPUTE_32F); output fp32 as
 *      Tessera's GEMM layer writes it (src/kernels/cuda/gemm_lt.h) and, for comparison,
 *      bf16 as PyTorch's bf16 matmuls write it. The algorithm is cuBLASLt's heuristic
 *      choice with a 32 MiB workspace, as in gemm_lt.cu.
 *   2. Device memory bandwidth: a grid-stride 16-byte copy kernel and cudaMemcpy D2D,
 *      counting bytes read plus bytes written.
 *
 * Prints one line per measurement (prefixed "gemm" / "bandwidth", fields key=value) and
 * last the cluster-file line (a configs/clusters file, device.gemm_efficiency) for the
 * square sizes, Tessera's fp32-output column.
 *
 *   gemm_curve [--tokens M] [--peak TFLOPS] [--max-n N]
 *     --tokens  B*T of the training shapes (default 16384: 16 sequences of 1024)
 *     --peak    dense bf16 peak the fractions are of (default 989: H100/H200 SXM)
 *     --max-n   largest square size (default 16384)
 * Exits 77 when no CUDA device is present (the benchmark's dry run skips it).
 *
 * Timing: inputs are random (not zeros, which run faster: .library/device/METHOD.md),
 * rotated over enough copies to exceed the 60 MB L2 for small shapes; 3 warm-up calls,
 * then 7 batches of calls timed with CUDA events, each batch ~20 ms; the median batch. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "gemm_curve: %s failed: %s (%s:%d)\n", #call,                 \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                          \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define CKB(call)                                                                         \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "gemm_curve: %s failed: %s (%s:%d)\n", #call,                 \
                    cublasLtGetStatusString(s_), __FILE__, __LINE__);                     \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static const size_t WORKSPACE_BYTES = (size_t)32 << 20;
static const size_t ROTATE_BYTES = (size_t)256 << 20; /* > 4x the 60 MB L2 */

/* Uniform values in [-1, 1) from a counter hash: random data, reproducible, no cuRAND. */
__global__ void fill_kernel(__nv_bfloat16 *x, size_t n, unsigned seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned h = (unsigned)i * 2654435761u ^ seed * 2246822519u ^ (unsigned)(i >> 32);
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

/* One 16-byte load and one 16-byte store per element, grid-stride. */
__global__ void copy_kernel(int4 *__restrict__ dst, const int4 *__restrict__ src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}

typedef struct {
    const char *name;
    bool ta, tb;    /* column-major op(A) [m,k], op(B) [k,n], as cuBLAS */
    long m, n, k;
    int batch;      /* > 1: strided-batched */
    int count;      /* how many such GEMMs one training step runs (for the step total) */
} shape;

static cublasLtHandle_t lt;
static void *workspace;
static int sm_count;

/* Time one shape in one output type; returns the median ms per GEMM. */
static double time_gemm(const shape *s, cudaDataType_t dtype_d)
{
    size_t a_elems = (size_t)s->m * s->k, b_elems = (size_t)s->k * s->n;
    size_t d_elems = (size_t)s->m * s->n;
    size_t d_size = dtype_d == CUDA_R_32F ? 4 : 2;
    size_t set_bytes = (size_t)s->batch * ((a_elems + b_elems) * 2 + d_elems * d_size);
    int sets = (int)std::min<size_t>(32, std::max<size_t>(1, ROTATE_BYTES / set_bytes));
    __nv_bfloat16 *A, *B;
    void *D;
    CK(cudaMalloc(&A, (size_t)sets * s->batch * a_elems * 2));
    CK(cudaMalloc(&B, (size_t)sets * s->batch * b_elems * 2));
    CK(cudaMalloc(&D, (size_t)sets * s->batch * d_elems * d_size));
    fill_kernel<<<sm_count * 8, 256>>>(A, (size_t)sets * s->batch * a_elems, 1);
    fill_kernel<<<sm_count * 8, 256>>>(B, (size_t)sets * s->batch * b_elems, 2);
    CK(cudaGetLastError());

    cublasLtMatmulDesc_t op;
    CKB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    long a_rows = s->ta ? s->k : s->m, a_cols = s->ta ? s->m : s->k;
    long b_rows = s->tb ? s->n : s->k, b_cols = s->tb ? s->k : s->n;
    cublasLtMatrixLayout_t la, lb, ld;
    CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, a_cols, a_rows));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, b_cols, b_rows));
    CKB(cublasLtMatrixLayoutCreate(&ld, dtype_d, s->m, s->n, s->m));
    if (s->batch > 1) {
        int64_t sa = (int64_t)a_elems, sb = (int64_t)b_elems, sd = (int64_t)d_elems;
        cublasLtMatrixLayout_t ls[3] = {la, lb, ld};
        int64_t st[3] = {sa, sb, sd};
        for (int i = 0; i < 3; i++) {
            CKB(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                 &s->batch, sizeof s->batch));
            CKB(cublasLtMatrixLayoutSetAttribute(
                ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]));
        }
    }
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &WORKSPACE_BYTES, sizeof WORKSPACE_BYTES));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0) {
        fprintf(stderr, "gemm_curve: cuBLASLt has no algorithm for %s\n", s->name);
        exit(1);
    }

    const float alpha = 1.0f, beta = 0.0f;
    int call = 0;
    auto run = [&](int n) {
        for (int i = 0; i < n; i++, call++) {
            size_t set = (size_t)(call % sets) * s->batch;
            CKB(cublasLtMatmul(lt, op, &alpha, A + set * a_elems, la, B + set * b_elems, lb,
                               &beta, (char *)D + set * d_elems * d_size, ld,
                               (char *)D + set * d_elems * d_size, ld, &heur.algo, workspace,
                               WORKSPACE_BYTES, 0));
        }
    };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    run(3);
    CK(cudaEventRecord(e0));
    run(1);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float one_ms;
    CK(cudaEventElapsedTime(&one_ms, e0, e1));
    int reps = std::max(1, std::min(1000, (int)(20.0 / std::max(one_ms, 1e-3f))));
    std::vector<double> ms;
    for (int b = 0; b < 7; b++) {
        CK(cudaEventRecord(e0));
        run(reps);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back((double)t / reps);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());

    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CKB(cublasLtMatmulPreferenceDestroy(pref));
    CKB(cublasLtMatrixLayoutDestroy(la));
    CKB(cublasLtMatrixLayoutDestroy(lb));
    CKB(cublasLtMatrixLayoutDestroy(ld));
    CKB(cublasLtMatmulDescDestroy(op));
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(D));
    return ms[ms.size() / 2];
}

static void bandwidth(void)
{
    const size_t bytes = (size_t)2 << 30; /* 2 GiB each way: far beyond L2 */
    void *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    fill_kernel<<<sm_count * 8, 256>>>((__nv_bfloat16 *)src, bytes / 2, 3);
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int kind = 0; kind < 2; kind++) {
        std::vector<double> ms;
        for (int r = 0; r < 13; r++) {
            CK(cudaEventRecord(e0));
            if (kind == 0)
                copy_kernel<<<sm_count * 16, 512>>>((int4 *)dst, (const int4 *)src,
                                                    bytes / sizeof(int4));
            else
                CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 3) ms.push_back(t); /* 3 warm-ups */
        }
        std::sort(ms.begin(), ms.end());
        double med = ms[ms.size() / 2];
        printf("bandwidth kind=%s bytes=%zu ms=%.4f gbs=%.1f\n",
               kind == 0 ? "copy_kernel" : "memcpy_d2d", 2 * bytes, med,
               2.0 * (double)bytes / (med * 1e-3) / 1e9);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(src));
    CK(cudaFree(dst));
}

static long parse_long(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "gemm_curve: %s '%s' must be an integer in [%ld, %ld]\n", flag, v, lo,
                hi);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    long tokens = 16384, max_n = 16384;
    double peak = 989.0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--tokens") && v) {
            tokens = parse_long("--tokens", v, 1024, 1 << 20), i++;
        } else if (!strcmp(argv[i], "--max-n") && v) {
            max_n = parse_long("--max-n", v, 256, 32768), i++;
        } else if (!strcmp(argv[i], "--peak") && v) {
            char *end;
            peak = strtod(v, &end);
            if (*end != '\0' || !(peak > 0.0)) {
                fprintf(stderr, "gemm_curve: --peak '%s' must be a positive number\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr,
                    "usage: gemm_curve [--tokens M] [--peak TFLOPS] [--max-n N]\n"
                    "  (unknown or incomplete option '%s')\n",
                    argv[i]);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "gemm_curve: no CUDA device: skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    sm_count = prop.multiProcessorCount;
    printf("device name=\"%s\" sm=%d.%d sms=%d l2_mb=%.1f mem_gib=%.1f peak_bf16_tflops=%.1f\n",
           prop.name, prop.major, prop.minor, sm_count, prop.l2CacheSize / 1e6,
           prop.totalGlobalMem / 1073741824.0, peak);
    CKB(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WORKSPACE_BYTES));

    bandwidth();

    /* GPT-2 124M at the given B*T = M tokens: C = 768, V = 50257, T = 1024, 12 heads of
     * 64, 12 layers. nn.Linear y = x W^T in column-major cuBLAS terms: D[out, M] =
     * W^T-op... written as (m, n, k) = (out, M, in) with A = W (transposed), B = x. */
    const long C = 768, V = 50257, T = 1024, NH = 12, HS = 64, L = 12;
    const int BNH = (int)(tokens / T * NH);
    std::vector<shape> shapes;
    for (long n = 256; n <= max_n; n *= 2)
        shapes.push_back(shape{NULL, false, false, n, n, n, 1, 0});
    shape train[] = {
        {"fwd qkv", true, false, 3 * C, tokens, C, 1, (int)L},
        {"fwd attn_proj", true, false, C, tokens, C, 1, (int)L},
        {"fwd fc", true, false, 4 * C, tokens, C, 1, (int)L},
        {"fwd fc_proj", true, false, C, tokens, 4 * C, 1, (int)L},
        {"fwd lm_head", true, false, V, tokens, C, 1, 1},
        {"bwd_x qkv", false, false, C, tokens, 3 * C, 1, (int)L},
        {"bwd_x attn_proj", false, false, C, tokens, C, 1, (int)L},
        {"bwd_x fc", false, false, C, tokens, 4 * C, 1, (int)L},
        {"bwd_x fc_proj", false, false, 4 * C, tokens, C, 1, (int)L},
        {"bwd_x lm_head", false, false, C, tokens, V, 1, 1},
        {"bwd_w qkv", false, true, C, 3 * C, tokens, 1, (int)L},
        {"bwd_w attn_proj", false, true, C, C, tokens, 1, (int)L},
        {"bwd_w fc", false, true, C, 4 * C, tokens, 1, (int)L},
        {"bwd_w fc_proj", false, true, 4 * C, C, tokens, 1, (int)L},
        {"bwd_w lm_head", false, true, C, V, tokens, 1, 1},
        /* attention per (sequence, head): scores S = K^T Q [T,T], out = V P [HS,T]; the
         * backward runs four such products (dP, dV, dQ, dK) */
        {"attn qk", true, false, T, T, HS, BNH, (int)L},
        {"attn pv", false, false, HS, T, T, BNH, (int)L},
        {"attn bwd (x4)", false, true, HS, T, T, BNH, 4 * (int)L},
    };
    for (const shape &s : train) shapes.push_back(s);

    double step_ms_fp32 = 0.0, step_flop = 0.0, best = 0.0;
    std::vector<std::pair<long, double>> curve;
    for (const shape &s : shapes) {
        double flop = 2.0 * s.m * s.n * s.k * s.batch;
        double ms32 = time_gemm(&s, CUDA_R_32F), ms16 = time_gemm(&s, CUDA_R_16BF);
        double tf32 = flop / (ms32 * 1e-3) / 1e12, tf16 = flop / (ms16 * 1e-3) / 1e12;
        char name[64];
        if (s.name)
            snprintf(name, sizeof name, "%s", s.name);
        else
            snprintf(name, sizeof name, "square");
        for (char *c = name; *c; c++)
            if (*c == ' ') *c = '_';
        printf("gemm name=%s m=%ld n=%ld k=%ld batch=%d ms_f32out=%.4f tflops_f32out=%.1f "
               "eff_f32out=%.3f ms_bf16out=%.4f tflops_bf16out=%.1f eff_bf16out=%.3f\n",
               name, s.m, s.n, s.k, s.batch, ms32, tf32, tf32 / peak, ms16, tf16, tf16 / peak);
        fflush(stdout);
        best = std::max(best, std::max(tf32, tf16));
        if (!s.name) curve.push_back({s.m, std::min(1.0, tf32 / peak)});
        step_ms_fp32 += ms32 * s.count;
        step_flop += flop * s.count;
    }
    printf("gemm_step tokens=%ld gemm_ms=%.2f gemm_tflops=%.1f best_tflops=%.1f\n", tokens,
           step_ms_fp32, step_flop / (step_ms_fp32 * 1e-3) / 1e12, best);
    printf("gemm_efficiency = (");
    for (size_t i = 0; i < curve.size(); i++)
        printf("%s(%ld, %.3f)", i ? ", " : " ", curve[i].first, curve[i].second);
    printf(" );  # %s, cuBLASLt bf16 in / fp32 out, of %.0f TFLOP/s\n", prop.name, peak);
    CK(cudaFree(workspace));
    CKB(cublasLtDestroy(lt));
    return 0;
}
