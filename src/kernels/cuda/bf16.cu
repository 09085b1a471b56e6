/* The bf16 table's matmuls ("cuda-bf16", table.cu): the products of matmul.cu with
 * bf16 operands and fp32 accumulation (gemm_lt.h, TS_GEMM_BF16), fp32 everywhere in
 * memory. Parameters, gradients and activations stay fp32 (the fp32 master weights are
 * the parameters themselves); only a GEMM's inputs are rounded to bf16:
 * - activations and output gradients (inp, dout) are cast per call into a device
 *   scratch reused by every call (two slots: a backward needs both at once);
 * - weights are cast once and kept: a cache keyed by the fp32 weight's pointer and
 *   element count holds its bf16 copy, refreshed at the first matmul after the weight
 *   may have changed.
 * dweight += dout^T inp accumulates in fp32 (beta = 1) from bf16 operands; dbias sums the
 * fp32 dout (matmul.cu's deterministic column sum).
 *
 * When is a cached copy stale? This table's write slots say so:
 * - adamw_update and adamw_update_spans (any optimizer step) bump a version counter:
 *   every copy made before it is stale (an optimizer pass rewrites all parameters, so
 *   one counter is enough);
 * - memcpy_h2d, memcpy_d2d and memset_zero mark the copies overlapping their
 *   destination range stale (a checkpoint load, a ZeRO-1 gather of updated pieces);
 * - dev_free drops the copies of weights inside the freed buffer (its extent is known
 *   from this table's dev_alloc; a buffer from elsewhere drops every copy), so a later
 *   buffer at the same address never meets an old copy.
 * The rule for callers, then: a parameter is written only through this table's slots,
 * or (a collective writing it in place) after an optimizer call of this table in the
 * same step. All of it runs on the one compute stream, so a refresh is ordered after the
 * write that made it necessary. */
#include <mutex>
#include <stdint.h>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/linear_gemm.h"

namespace {

struct weight_copy {
    const float *src; /* the fp32 weight */
    size_t n;         /* its elements */
    __nv_bfloat16 *bf;
    uint64_t version; /* the optimizer version it was cast at; STALE after a write */
};

constexpr uint64_t STALE = UINT64_MAX;

struct bf16_state {
    std::mutex mu; /* everything below, and a matmul's use of the scratch */
    uint64_t version = 0;
    std::vector<weight_copy> weights;
    std::unordered_map<uintptr_t, size_t> allocs; /* this table's buffers: base -> bytes */
    __nv_bfloat16 *scratch[2] = { nullptr, nullptr };
    size_t scratch_elems[2] = { 0, 0 };
};

} // namespace

static bf16_state &state(void)
{
    static bf16_state *s = new bf16_state; /* lives as long as the process */
    return *s;
}

static bool overlaps(const weight_copy &w, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)w.src, b = (uintptr_t)p;
    return a < b + bytes && b < a + w.n * sizeof(float);
}

/* The bf16 copy of weight[0..n), cast now if it is new or stale. Under st.mu. */
static const __nv_bfloat16 *weight_bf16(bf16_state &st, const float *weight, size_t n)
{
    for (weight_copy &w : st.weights)
        if (w.src == weight && w.n == n) {
            if (w.version != st.version) {
                ts_cuda_cast_bf16(w.bf, weight, n);
                w.version = st.version;
            }
            return w.bf;
        }
    weight_copy w = { weight, n, nullptr, st.version };
    /* Stream-ordered (see scratch_bf16): the first step makes the copies while other
     * streams' NCCL kernels may be waiting on peers. */
    TS_CUDA_CHECK(cudaMallocAsync(&w.bf, n * sizeof(__nv_bfloat16), ts_cuda_stream()));
    ts_cuda_cast_bf16(w.bf, weight, n);
    st.weights.push_back(w);
    return w.bf;
}

/* x[0..n) in bf16, in scratch slot `slot`. Under st.mu. */
static const __nv_bfloat16 *scratch_bf16(bf16_state &st, int slot, const float *x, size_t n)
{
    if (st.scratch_elems[slot] < n) {
        /* Grown in stream order on the compute stream (queued GEMMs may still read the
         * old buffer): cudaFree and cudaMalloc may synchronise the whole device, which
         * deadlocks when another stream's NCCL kernel waits for a peer that waits for
         * this rank's host (a pipeline receive). Every device Tessera builds for
         * (sm_80, sm_90) has stream-ordered allocation. */
        if (st.scratch[slot]) TS_CUDA_CHECK(cudaFreeAsync(st.scratch[slot], ts_cuda_stream()));
        st.scratch[slot] = nullptr;
        TS_CUDA_CHECK(cudaMallocAsync(&st.scratch[slot], n * sizeof(__nv_bfloat16),
                                      ts_cuda_stream()));
        st.scratch_elems[slot] = n;
    }
    ts_cuda_cast_bf16(st.scratch[slot], x, n);
    return st.scratch[slot];
}

void ts_cuda_bf16_matmul_forward(float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {
        ts_cuda_matmul_empty_forward(out, bias, N, OC);
        return;
    }
    bf16_state &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    const __nv_bfloat16 *w_bf = weight_bf16(st, weight, (size_t)OC * C);
    const __nv_bfloat16 *inp_bf = scratch_bf16(st, 0, inp, (size_t)N * C);
    ts_linear_forward_gemm(TS_GEMM_BF16, out, inp_bf, w_bf, bias, N, C, OC);
}

void ts_cuda_bf16_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, int N, int C, int OC)
{
    bool want_dinp = dinp && N > 0 && C > 0, want_dweight = dweight && N > 0 && C > 0 && OC > 0;
    if (want_dinp && OC <= 0)
        TS_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(float), ts_cuda_stream()));
    if (OC > 0 && (want_dinp || want_dweight)) {
        bf16_state &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        const __nv_bfloat16 *dout_bf = scratch_bf16(st, 1, dout, (size_t)N * OC);
        if (want_dinp)
            ts_linear_dinp_gemm(TS_GEMM_BF16, dinp, dout_bf,
                                weight_bf16(st, weight, (size_t)OC * C), N, C, OC);
        if (want_dweight) /* accumulates in fp32 */
            ts_linear_dweight_gemm(TS_GEMM_BF16, dweight, scratch_bf16(st, 0, inp, (size_t)N * C),
                                   dout_bf, N, C, OC);
    }
    ts_cuda_dbias_accumulate(dbias, dout, N, OC); /* from the fp32 dout */
}

/* ---- the write slots: the fp32 ones, then the cache told */

/* Every weight may change (an optimizer step): each copy is cast again on its next use. */
static void weights_changed(void)
{
    bf16_state &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    st.version++;
}

void ts_cuda_bf16_adamw_update(float *param, const float *grad, float grad_scale, float *m,
                               float *v, size_t n, float lr, float beta1, float beta2, float eps,
                               float weight_decay, int t)
{
    weights_changed();
    ts_cuda_adamw_update(param, grad, grad_scale, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
}

void ts_cuda_bf16_adamw_update_spans(float *param, const float *grad, float grad_scale,
                                     float *m, float *v, const ts_adamw_span *spans, int n_spans,
                                     float lr, float beta1, float beta2, float eps,
                                     float weight_decay, int t)
{
    weights_changed();
    ts_cuda_adamw_update_spans(param, grad, grad_scale, m, v, spans, n_spans, lr, beta1, beta2,
                               eps, weight_decay, t);
}

/* Mark the copies of weights overlapping [dst, dst + bytes) stale. */
static void written(const void *dst, size_t bytes)
{
    if (!bytes) return;
    bf16_state &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    for (weight_copy &w : st.weights)
        if (overlaps(w, dst, bytes)) w.version = STALE;
}

void ts_cuda_bf16_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
    ts_cuda_memcpy_h2d(dst, src, bytes);
    written(dst, bytes);
}

void ts_cuda_bf16_memcpy_d2d(void *dst, const void *src, size_t bytes)
{
    ts_cuda_memcpy_d2d(dst, src, bytes);
    written(dst, bytes);
}

void ts_cuda_bf16_memset_zero(void *dst, size_t bytes)
{
    ts_cuda_memset_zero(dst, bytes);
    written(dst, bytes);
}

void *ts_cuda_bf16_dev_alloc(size_t bytes)
{
    void *p = ts_cuda_dev_alloc(bytes);
    if (p) {
        bf16_state &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        st.allocs[(uintptr_t)p] = bytes;
    }
    return p;
}

void ts_cuda_bf16_dev_free(void *p)
{
    if (!p) return;
    bf16_state &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    auto a = st.allocs.find((uintptr_t)p);
    bool known = a != st.allocs.end();
    size_t bytes = known ? a->second : 0;
    if (known) st.allocs.erase(a);
    ts_cuda_dev_free(p); /* waits for the compute stream first: no GEMM reads a copy now */
    size_t kept = 0;
    for (weight_copy &w : st.weights) {
        if (!known || overlaps(w, p, bytes)) /* unknown extent: drop every copy */
            TS_CUDA_CHECK(cudaFreeAsync(w.bf, ts_cuda_stream()));
        else
            st.weights[kept++] = w;
    }
    st.weights.resize(kept);
}
