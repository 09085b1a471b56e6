/* A cluster description (a libconfig file, configs/clusters/NAME.cfg): what the planner
 * knows about the machines a run would use. Every key is required; numbers must be
 * positive and finite; GEMM efficiencies in (0, 1], the table sorted by problem size.
 * Units in the struct are SI: bytes, bytes/s, FLOP/s, seconds. */
#ifndef TS_PLAN_CLUSTER_H
#define TS_PLAN_CLUSTER_H

#include <stdbool.h>

#include "core/error.h"

#define TS_CLUSTER_MAX_EFF 64

typedef struct {
    double bandwidth; /* bytes/s, one device's link, one direction */
    double latency;   /* seconds per message */
} ts_link;

typedef struct {
    char name[256];
    char device_name[256];
    int devices_per_node;
    double memory;            /* bytes one device may use */
    double memory_bandwidth;  /* bytes/s */
    double peak_fp32;         /* dense FLOP/s */
    double peak_bf16;         /* dense FLOP/s; 0 when the file gives none */
    bool bf16;                /* compute_dtype: true = "bf16", false = "fp32" */
    int n_eff;                /* points in the efficiency table */
    double eff_n[TS_CLUSTER_MAX_EFF], eff[TS_CLUSTER_MAX_EFF];
    ts_link intra, inter;
} ts_cluster;

/* Read and check `path`. Errors name the file and the key, e.g.
 * "cluster file x.cfg: cluster.device.memory_gb is missing (GB of memory one device may
 * use, e.g. 80.0)". */
ts_status ts_cluster_load(const char *path, ts_cluster *c);

/* Dense peak FLOP/s of the cluster's compute_dtype. */
double ts_cluster_peak(const ts_cluster *c);

/* GEMM efficiency for an n x n x n problem: log-linear in n between the table's points,
 * clamped outside it. A GEMM of shape (m, n, k) uses n = cbrt(m * n * k). */
double ts_cluster_efficiency(const ts_cluster *c, double n);

/* A copy with both links' bandwidths multiplied by `factor` (the monotonicity tests). */
void ts_cluster_scale_links(ts_cluster *c, double factor);

#endif
