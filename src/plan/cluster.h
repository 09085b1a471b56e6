/* A cluster description (a libconfig file, configs/clusters/NAME.cfg): what the planner
 * knows about the machines a run would use. Every key is required except the two below;
 * numbers must be positive and finite; GEMM efficiencies in (0, 1], the table sorted by
 * problem size. Units in the struct are SI: bytes, bytes/s, FLOP/s, seconds.
 *
 * Optional keys, for devices the default model misdescribes (CPUs); without them a GPU
 * file's predictions are what they were:
 *   device.elementwise_ns = { gelu = [FWD, BWD]; ... };
 *       elementwise kernels that are compute-bound on this device: nanoseconds per
 *       element of the forward and the backward kernel, measured (scripts/
 *       measure_cluster.sh, bench/bench_elementwise.c). The planner charges a pass
 *       max(its memory time, elements x this); a kernel not listed stays a memory pass
 *       (right where exp and tanh are cheap next to memory traffic, as on GPUs). Kernels
 *       and what an element is: gelu (one activation of the MLP's N x 4C/tp hidden
 *       layer), layernorm (one of the N x C values normalised). Attention's softmax and
 *       the cross-entropy are not separate kernels on every backend (fused into
 *       attention and into the loss's backward on the CPU), so they have no key.
 *   overlap_comm = false;   (cluster level; default true)
 *       communication does not overlap compute: the library progresses it on the cores
 *       that compute (MPI on a CPU). The dp reduction is then charged after each rank's
 *       last backward, fully exposed, and pipeline messages to the sending rank.
 *   moe = { a2a_efficiency = X; grouped_gemm_efficiency = Y; };   (cluster level)
 *       Mixture-of-Experts figures, each in (0, 1], 1 when left out (model_cost.h
 *       "Experts"): the share of the links' bandwidth the experts' all-to-all reaches
 *       (NCCL's all-to-all reaches less than a ring's bus bandwidth: many small
 *       messages), and the expert GEMMs' efficiency against gemm_efficiency at each
 *       expert's own shape (a grouped GEMM's one launch for every local expert, against
 *       the curve's separate GEMMs). A dense model's prediction never reads them. */
#ifndef TS_PLAN_CLUSTER_H
#define TS_PLAN_CLUSTER_H

#include <stdbool.h>

#include "core/error.h"

#define TS_CLUSTER_MAX_EFF 64

typedef struct {
    double bandwidth; /* bytes/s, one device's link, one direction */
    double latency;   /* seconds per message */
} ts_link;

/* device.elementwise_ns's kernels (TS_ELEM_* index ts_cluster.elem_time). */
enum { TS_ELEM_GELU, TS_ELEM_LAYERNORM, TS_N_ELEM };
extern const char *const ts_elem_names[TS_N_ELEM];

typedef struct {
    char name[256];
    char device_name[256];
    int devices_per_node;
    double memory;            /* bytes one device may use */
    double memory_bandwidth;  /* bytes/s */
    double peak_fp32;         /* dense FLOP/s */
    double peak_bf16;         /* dense FLOP/s; 0 when the file gives none */
    bool bf16;                /* GEMMs in bf16: compute_dtype = "bf16", or train.precision
                                 = "bf16" (ts_cluster_use_precision); false = fp32 */
    int n_eff;                /* points in the efficiency table */
    double eff_n[TS_CLUSTER_MAX_EFF], eff[TS_CLUSTER_MAX_EFF];
    ts_link intra, inter;
    double elem_time[TS_N_ELEM][2]; /* seconds per element, forward and backward; 0 =
                                       not given: a memory pass */
    bool comm_on_compute;         /* overlap_comm = false: communication runs on the
                                     compute cores (zero-initialised: it overlaps) */
    bool host_collectives;        /* host_collectives = true: the collectives run through
                                     MPI on host memory (CPU ranks), whose gradient
                                     reductions keep copies (memory.h host_reductions) */
    double a2a_efficiency;        /* moe.a2a_efficiency (1 when not given) */
    double grouped_gemm_efficiency; /* moe.grouped_gemm_efficiency (1 when not given) */
} ts_cluster;

/* Read and check `path`. Errors name the file and the key, e.g.
 * "cluster file x.cfg: cluster.device.memory_gb is missing (GB of memory one device may
 * use, e.g. 80.0)". */
ts_status ts_cluster_load(const char *path, ts_cluster *c);

/* The run's precision (train.precision) on this cluster: "bf16" makes its GEMMs bf16
 * (c->bf16: the bf16 peak, activations and messages in bf16) on a file whose
 * compute_dtype is "fp32" (a CPU's, whose runs may be either), an error naming `path`
 * when the file gives no bf16 peak. "fp32" changes nothing: a compute_dtype = "bf16"
 * file (the GPU files) describes bf16 runs whatever the config's CPU default says. The
 * GEMM efficiency table is the file's one, for either dtype. */
ts_status ts_cluster_use_precision(ts_cluster *c, const char *path, const char *precision);

/* Dense peak FLOP/s of the GEMM dtype (c->bf16). */
double ts_cluster_peak(const ts_cluster *c);

/* GEMM efficiency for an n x n x n problem: log-linear in n between the table's points,
 * clamped outside it. A GEMM of shape (m, n, k) uses n = cbrt(m * n * k). */
double ts_cluster_efficiency(const ts_cluster *c, double n);

#endif
