/* The GEMM layer (gemm_lt.h) on cuBLASLt.
 *
 * Per call: look up the shape's plan (made on first use: a matmul descriptor, the three
 * matrix layouts, and the algorithm cuBLASLt's heuristic picks for them), point the
 * descriptor at this call's bias, queue cublasLtMatmul. The heuristic is told each
 * pointer's real alignment (its default assumes 256 bytes, and a weight inside the
 * parameter buffer is only 4-byte aligned), so the alignments are part of the key.
 *
 * Two fallbacks keep every shape working: when no algorithm fuses the bias epilogue,
 * the plan runs the plain product and a bias kernel; when cuBLASLt has no algorithm at
 * all (an alignment or shape it does not cover), the classic cublasGemmEx entry point
 * (same types, same fp32 compute type, no TF32: the handle's math mode is the default)
 * with the bias kernel. Each fallback says so once, on stderr, when its plan is made.
 *
 * Determinism: a plan's algorithm is fixed once chosen, and cuBLASLt's split-K
 * reductions (in-place with counters, or in the workspace) run in a fixed order, so the
 * same inputs give the same bits on every run on the same GPU model. */
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <stdio.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/gemm_lt.h"

/* cuBLAS's recommendation for Hopper (4 MiB is enough elsewhere; llm.c uses 32 for all). */
static constexpr size_t WORKSPACE_BYTES = (size_t)32 << 20;

/* ---- bias kernel (the fallbacks; fp32 D): D[b][col*ldd + row] += bias[row] */

__global__ void add_bias_kernel(float *D, const float *bias, int m, int n, int ldd, int batch,
                                int64_t strideD)
{
    size_t total = (size_t)batch * n * m;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        size_t row = i % (size_t)m, rest = i / (size_t)m;
        size_t col = rest % (size_t)n, b = rest / (size_t)n;
        D[(size_t)b * strideD + col * (size_t)ldd + row] += bias[row];
    }
}

static void add_bias(const ts_gemm *g, int batch)
{
    size_t total = (size_t)batch * g->n * g->m;
    size_t threads_needed = total < ((size_t)1 << 24) ? total : ((size_t)1 << 24);
    add_bias_kernel<<<ts_cuda_blocks(threads_needed, 256), 256, 0, ts_cuda_stream()>>>(
        (float *)g->D, g->bias, g->m, g->n, g->ldd, batch, g->strideD);
    TS_CUDA_LAUNCHED();
}

/* ---- plans */

namespace {

enum { K_AB, K_D, K_TA, K_TB, K_M, K_N, K_K, K_LDA, K_LDB, K_LDD, K_BATCH, K_SA, K_SB, K_SD,
       K_BIAS, K_ALA, K_ALB, K_ALD, K_ALBIAS, K_COUNT };
typedef std::array<int64_t, K_COUNT> plan_key;

struct plan {
    bool lt;            /* false: no cuBLASLt algorithm; cublasGemmEx instead */
    bool fused_bias;    /* the bias is the epilogue (else, with a bias, a separate kernel) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

struct lt_state {
    std::mutex mu; /* the plans, and a plan's descriptor between its update and its use */
    cublasLtHandle_t handle = nullptr;
    void *workspace = nullptr;
    std::map<plan_key, plan> plans;
};

} // namespace

static lt_state *state(void)
{
    static lt_state *s = [] {
        lt_state *st = new lt_state; /* lives as long as the process, as the stream does */
        TS_CUBLAS_CHECK(cublasLtCreate(&st->handle));
        /* On the compute stream's device: the stream is made on the current device at
         * its first use, and so is this. */
        (void)ts_cuda_stream();
        TS_CUDA_CHECK(cudaMalloc(&st->workspace, WORKSPACE_BYTES));
        return st;
    }();
    return s;
}

static int batch_of(const ts_gemm *g) { return g->batch > 1 ? g->batch : 1; }

/* The alignment (bytes, a power of two, at most 256) every batch entry of a matrix at p
 * with batch stride `stride_bytes` has: the lowest set bit of the address and stride. */
static int64_t alignment(const void *p, int64_t stride_bytes)
{
    uint64_t a = (uint64_t)(uintptr_t)p | (uint64_t)stride_bytes;
    if (a == 0) return 256;
    uint64_t low = a & (~a + 1);
    return low >= 256 ? 256 : (int64_t)low;
}

static cudaDataType_t cuda_type(ts_dtype t)
{
    return t == TS_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* "bf16 x bf16 -> fp32", for messages. */
static const char *types_of(const ts_gemm *g, char *buf, size_t size)
{
    snprintf(buf, size, "%s x %s -> %s", ts_dtype_name(g->ab), ts_dtype_name(g->ab),
             ts_dtype_name(g->d));
    return buf;
}

static plan_key key_of(const ts_gemm *g)
{
    int batch = batch_of(g);
    int64_t eb = (int64_t)ts_dtype_bytes(g->ab), ed = (int64_t)ts_dtype_bytes(g->d);
    plan_key k;
    k[K_AB] = g->ab, k[K_D] = g->d, k[K_TA] = g->transa, k[K_TB] = g->transb;
    k[K_M] = g->m, k[K_N] = g->n, k[K_K] = g->k;
    k[K_LDA] = g->lda, k[K_LDB] = g->ldb, k[K_LDD] = g->ldd, k[K_BATCH] = batch;
    k[K_SA] = batch > 1 ? g->strideA : 0;
    k[K_SB] = batch > 1 ? g->strideB : 0;
    k[K_SD] = batch > 1 ? g->strideD : 0;
    k[K_BIAS] = g->bias != nullptr;
    k[K_ALA] = alignment(g->A, k[K_SA] * eb);
    k[K_ALB] = alignment(g->B, k[K_SB] * eb);
    k[K_ALD] = alignment(g->D, k[K_SD] * ed);
    k[K_ALBIAS] = g->bias ? alignment(g->bias, 0) : 0;
    return k;
}

/* A failing cuBLASLt call, with the GEMM it was for. */
TS_NORETURN static void gemm_fail(const ts_gemm *g, int line, const char *call,
                                  cublasStatus_t st)
{
    char what[320], types[40];
    snprintf(what, sizeof what,
             "%s, for a %s GEMM m=%d n=%d k=%d op(A)=%s op(B)=%s lda=%d ldb=%d ldd=%d batch=%d",
             call, types_of(g, types, sizeof types), g->m, g->n, g->k,
             g->transa ? "T" : "N", g->transb ? "T" : "N", g->lda, g->ldb, g->ldd, batch_of(g));
    ts_cuda_fail(__FILE__, line, what, cublasGetStatusString(st));
}

#define LT_CHECK(g, call)                                                                   \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) gemm_fail((g), __LINE__, #call, s_);               \
    } while (0)

static cublasLtMatrixLayout_t make_layout(const ts_gemm *g, cudaDataType_t type, int rows,
                                          int cols, int ld, int64_t stride)
{
    cublasLtMatrixLayout_t l = nullptr;
    LT_CHECK(g, cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
    int batch = batch_of(g);
    if (batch > 1) {
        LT_CHECK(g, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &batch, sizeof batch));
        LT_CHECK(g, cublasLtMatrixLayoutSetAttribute(
                        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return l;
}

static void destroy_lt(plan *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    p->op = nullptr, p->a = p->b = p->d = nullptr;
}

/* The descriptors for g, the bias fused when fuse_bias, and the heuristic's first
 * choice; false (nothing kept) when it has none. */
static bool try_lt(const ts_gemm *g, const plan_key &key, bool fuse_bias, plan *p)
{
    lt_state *st = state();
    cudaDataType_t ab = cuda_type(g->ab);
    p->fused_bias = fuse_bias;
    LT_CHECK(g, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(g, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(g, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fuse_bias) {
        /* The bias has D's type (fp32: ts_cuda_gemm asserts it), cuBLASLt's default. Its
         * pointer is set here for the heuristic (which reads its alignment) and again on
         * every call. */
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_CHECK(g, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi));
        LT_CHECK(g, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &g->bias, sizeof g->bias));
    }
    p->a = g->transa ? make_layout(g, ab, g->k, g->m, g->lda, key[K_SA])
                     : make_layout(g, ab, g->m, g->k, g->lda, key[K_SA]);
    p->b = g->transb ? make_layout(g, ab, g->n, g->k, g->ldb, key[K_SB])
                     : make_layout(g, ab, g->k, g->n, g->ldb, key[K_SB]);
    p->d = make_layout(g, cuda_type(g->d), g->m, g->n, g->ldd, key[K_SD]);

    cublasLtMatmulPreference_t pref = nullptr;
    LT_CHECK(g, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WORKSPACE_BYTES;
    LT_CHECK(g, cublasLtMatmulPreferenceSetAttribute(
                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const struct { cublasLtMatmulPreferenceAttributes_t attr; int k; } aligns[] = {
        { CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, K_ALA },
        { CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, K_ALB },
        { CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, K_ALD }, /* C is D */
        { CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, K_ALD },
    };
    for (const auto &al : aligns) {
        uint32_t v = (uint32_t)key[al.k];
        LT_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, al.attr, &v, sizeof v));
    }
    cublasLtMatmulHeuristicResult_t res = {};
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->handle, p->op, p->a, p->b, p->d,
                                                       p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    /* NOT_SUPPORTED is the heuristic's "no algorithm"; anything else is an error. */
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED)
        gemm_fail(g, __LINE__, "cublasLtMatmulAlgoGetHeuristic", hs);
    if (hs != CUBLAS_STATUS_SUCCESS || found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
        destroy_lt(p);
        return false;
    }
    p->algo = res.algo;
    p->lt = true;
    return true;
}

static plan make_plan(const ts_gemm *g, const plan_key &key)
{
    plan p = {};
    /* cuBLASLt's bias epilogue wants a 16-byte-aligned bias, and the heuristic has no
     * preference to say otherwise: a less aligned one (a bias inside a buffer at an odd
     * float) gets the plain product and the separate bias kernel, silently (it is the
     * caller's layout, not a missing algorithm). */
    const bool bias_fusable = g->bias != nullptr && key[K_ALBIAS] >= 16;
    if (try_lt(g, key, bias_fusable, &p)) return p;
    char mode[40];
    types_of(g, mode, sizeof mode);
    if (bias_fusable && try_lt(g, key, false, &p)) {
        fprintf(stderr,
                "tessera: note: cuBLASLt fuses no bias for the %s GEMM m=%d n=%d k=%d: the bias "
                "is a separate kernel for this shape\n",
                mode, g->m, g->n, g->k);
        return p;
    }
    fprintf(stderr,
            "tessera: note: cuBLASLt has no algorithm for the %s GEMM m=%d n=%d k=%d "
            "(lda=%d ldb=%d ldd=%d, alignments %lld/%lld/%lld bytes): cublasGemmEx is used "
            "for this shape\n",
            mode, g->m, g->n, g->k, g->lda, g->ldb, g->ldd, (long long)key[K_ALA],
            (long long)key[K_ALB], (long long)key[K_ALD]);
    p.lt = false;
    p.fused_bias = false;
    return p;
}

/* The classic entry point: the same product through the cuBLAS handle (bound to the
 * compute stream, default math mode: no TF32). */
static void gemm_ex(const ts_gemm *g)
{
    cudaDataType_t ab = cuda_type(g->ab), dt = cuda_type(g->d);
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float one = 1.0f;
    if (batch_of(g) > 1)
        LT_CHECK(g, cublasGemmStridedBatchedEx(ts_cuda_cublas(), ta, tb, g->m, g->n, g->k, &one,
                                               g->A, ab, g->lda, g->strideA, g->B, ab, g->ldb,
                                               g->strideB, &g->beta, g->D, dt, g->ldd,
                                               g->strideD, g->batch, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT));
    else
        LT_CHECK(g, cublasGemmEx(ts_cuda_cublas(), ta, tb, g->m, g->n, g->k, &one, g->A, ab,
                                 g->lda, g->B, ab, g->ldb, &g->beta, g->D, dt, g->ldd,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void ts_cuda_gemm(const ts_gemm *g)
{
    TS_ASSERT(g && g->m >= 1 && g->n >= 1 && g->k >= 1 && g->A && g->B && g->D);
    /* The modes gemm_lt.h lists: a bf16 D from bf16 operands, and its bias elsewhere. */
    TS_ASSERT(g->d == TS_DTYPE_F32 || g->ab == TS_DTYPE_BF16);
    TS_ASSERT(!g->bias || g->d == TS_DTYPE_F32);
    TS_ASSERT(g->lda >= (g->transa ? g->k : g->m) && g->ldb >= (g->transb ? g->n : g->k) &&
              g->ldd >= g->m);
    lt_state *st = state();
    plan_key key = key_of(g);
    std::lock_guard<std::mutex> lock(st->mu);
    auto it = st->plans.find(key);
    if (it == st->plans.end()) it = st->plans.emplace(key, make_plan(g, key)).first;
    const plan &p = it->second;
    if (p.lt) {
        if (p.fused_bias)
            LT_CHECK(g, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &g->bias, sizeof g->bias));
        const float one = 1.0f;
        LT_CHECK(g, cublasLtMatmul(st->handle, p.op, &one, g->A, p.a, g->B, p.b, &g->beta, g->D,
                                   p.d, g->D, p.d, &p.algo, st->workspace, WORKSPACE_BYTES,
                                   ts_cuda_stream()));
    } else {
        gemm_ex(g);
    }
    if (g->bias && !p.fused_bias) add_bias(g, batch_of(g));
}
