/* Reading and checking a cluster description (cluster.h). */
#include "plan/cluster.h"

#include <errno.h>
#include <libconfig.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fsutil.h"

/* Keys each group may hold: any other key is an error (a misspelt key must not be
 * silently replaced by nothing). */
static const char *const k_cluster_keys[] = {"name",       "source",     "devices_per_node",
                                             "device",     "intra_node", "inter_node",
                                             "overlap_comm", "host_collectives", "moe",
                                             NULL};
static const char *const k_device_keys[] = {"name", "memory_gb", "memory_bandwidth_gbs",
                                            "peak_tflops", "compute_dtype", "gemm_efficiency",
                                            "elementwise_ns", NULL};

const char *const ts_elem_names[TS_N_ELEM] = {"gelu", "layernorm"};
static const char *const k_peak_keys[] = {"fp32", "bf16", NULL};
static const char *const k_link_keys[] = {"bandwidth_gbs", "latency_us", NULL};
static const char *const k_moe_keys[] = {"a2a_efficiency", "grouped_gemm_efficiency", NULL};

static ts_status unknown_keys(const char *path, const config_setting_t *g, const char *where,
                              const char *const *known)
{
    for (int k = 0; k < config_setting_length(g); k++) {
        const char *name = config_setting_name(config_setting_get_elem(g, (unsigned)k));
        bool ok = false;
        for (int j = 0; known[j] && !ok; j++) ok = name && !strcmp(name, known[j]);
        if (ok) continue;
        char list[256];
        size_t at = 0;
        for (int j = 0; known[j] && at < sizeof list; j++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", j ? ", " : "", known[j]);
        return ts_fail("cluster file %s: %s.%s is not a key of the cluster format (keys there: "
                       "%s)",
                       path, where, name ? name : "?", list);
    }
    return TS_OK;
}

static ts_status group(const char *path, const config_setting_t *parent, const char *where,
                       const char *key, const char *what, config_setting_t **out)
{
    config_setting_t *g = config_setting_get_member(parent, key);
    if (!g) return ts_fail("cluster file %s: %s.%s is missing (%s)", path, where, key, what);
    if (!config_setting_is_group(g))
        return ts_fail("cluster file %s: %s.%s must be a group { ... } (%s)", path, where, key,
                       what);
    *out = g;
    return TS_OK;
}

static bool number_of(const config_setting_t *s, double *v)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: *v = (double)config_setting_get_int64(s); return true;
    case CONFIG_TYPE_FLOAT: *v = config_setting_get_float(s); return true;
    default: return false;
    }
}

/* The range a cluster figure may take: wide enough for any real machine (a slow link
 * of 1 KB/s to a petabyte per second, a nanosecond to ten seconds per message), narrow
 * enough that the planner's arithmetic stays finite (1e-300 GB/s or 1e300 us made
 * costs of infinity, which the partitioner could not cut). */
typedef struct {
    const char *key;
    double lo, hi;
} figure_range;
static const figure_range k_ranges[] = {
    {"bandwidth_gbs", 1e-6, 1e7},        {"latency_us", 1e-3, 1e7},
    {"devices_per_node", 1, 1 << 20},    {"memory_gb", 1e-6, 1e9},
    {"memory_bandwidth_gbs", 1e-6, 1e9}, {"fp32", 1e-9, 1e9},
    {"bf16", 1e-9, 1e9},
};

/* A required positive, finite number within its key's range (k_ranges); `hint` says
 * what it is and gives an example. */
static ts_status positive(const char *path, const config_setting_t *g, const char *where,
                          const char *key, const char *hint, double *out)
{
    config_setting_t *s = config_setting_get_member(g, key);
    if (!s) return ts_fail("cluster file %s: %s.%s is missing (%s)", path, where, key, hint);
    double v;
    if (!number_of(s, &v))
        return ts_fail("cluster file %s: %s.%s must be a number (%s)", path, where, key, hint);
    if (!isfinite(v) || v <= 0)
        return ts_fail("cluster file %s: %s.%s = %g is impossible: it must be positive and "
                       "finite (%s)",
                       path, where, key, v, hint);
    for (size_t i = 0; i < sizeof k_ranges / sizeof k_ranges[0]; i++)
        if (!strcmp(k_ranges[i].key, key) && (v < k_ranges[i].lo || v > k_ranges[i].hi))
            return ts_fail("cluster file %s: %s.%s = %g is out of range: it must be from %g to "
                           "%g (%s)",
                           path, where, key, v, k_ranges[i].lo, k_ranges[i].hi, hint);
    *out = v;
    return TS_OK;
}

static ts_status string(const char *path, const config_setting_t *g, const char *where,
                        const char *key, const char *hint, char *out, size_t size)
{
    config_setting_t *s = config_setting_get_member(g, key);
    if (!s) return ts_fail("cluster file %s: %s.%s is missing (%s)", path, where, key, hint);
    const char *v = config_setting_get_string(s);
    if (!v) return ts_fail("cluster file %s: %s.%s must be a string (%s)", path, where, key, hint);
    if (!*v) return ts_fail("cluster file %s: %s.%s is empty (%s)", path, where, key, hint);
    snprintf(out, size, "%s", v);
    return TS_OK;
}

static ts_status link_of(const char *path, const config_setting_t *cl, const char *key,
                         const char *what, ts_link *l)
{
    config_setting_t *g = NULL;
    char where[64];
    snprintf(where, sizeof where, "cluster.%s", key);
    double bw, lat;
    if (group(path, cl, "cluster", key, what, &g) != TS_OK ||
        unknown_keys(path, g, where, k_link_keys) != TS_OK ||
        positive(path, g, where, "bandwidth_gbs", "GB/s one device sends in one direction, e.g. 50.0",
                 &bw) != TS_OK ||
        positive(path, g, where, "latency_us", "microseconds per message, e.g. 10.0", &lat) != TS_OK)
        return TS_ERR;
    l->bandwidth = bw * 1e9;
    l->latency = lat * 1e-6;
    return TS_OK;
}

static ts_status efficiency_table(const char *path, const config_setting_t *dev, ts_cluster *c)
{
    const char *w = "cluster.device.gemm_efficiency";
    config_setting_t *t = config_setting_get_member(dev, "gemm_efficiency");
    if (!t)
        return ts_fail("cluster file %s: %s is missing (a list of (n, efficiency) pairs, e.g. "
                       "( (512, 0.45), (4096, 0.80) ))",
                       path, w);
    if (!config_setting_is_aggregate(t) || config_setting_length(t) < 1)
        return ts_fail("cluster file %s: %s must be a non-empty list of (n, efficiency) pairs, "
                       "e.g. ( (512, 0.45), (4096, 0.80) )",
                       path, w);
    int n = config_setting_length(t);
    if (n > TS_CLUSTER_MAX_EFF)
        return ts_fail("cluster file %s: %s has %d points; at most %d are supported", path, w, n,
                       TS_CLUSTER_MAX_EFF);
    for (int k = 0; k < n; k++) {
        config_setting_t *p = config_setting_get_elem(t, (unsigned)k);
        double size, eff;
        if (!config_setting_is_aggregate(p) || config_setting_length(p) != 2 ||
            !number_of(config_setting_get_elem(p, 0), &size) ||
            !number_of(config_setting_get_elem(p, 1), &eff))
            return ts_fail("cluster file %s: %s entry %d must be a pair (n, efficiency) of "
                           "numbers, e.g. (1024, 0.65)",
                           path, w, k);
        if (!isfinite(size) || size < 1 || size > 1e12)
            return ts_fail("cluster file %s: %s entry %d has n = %g; it must be from 1 to 1e12",
                           path, w, k, size);
        if (!isfinite(eff) || eff < 1e-6 || eff > 1)
            return ts_fail("cluster file %s: %s entry %d has efficiency %g; it must be in [1e-6, "
                           "1] (achieved / peak FLOP/s)",
                           path, w, k, eff);
        if (k > 0 && size <= c->eff_n[k - 1])
            return ts_fail("cluster file %s: %s is not sorted by n: entry %d has n = %g after "
                           "%g (list the points in increasing n)",
                           path, w, k, size, c->eff_n[k - 1]);
        c->eff_n[k] = size;
        c->eff[k] = eff;
    }
    c->n_eff = n;
    return TS_OK;
}

/* device.elementwise_ns (optional): { KERNEL = [forward_ns, backward_ns]; ... }. */
static ts_status elementwise(const char *path, const config_setting_t *dev, ts_cluster *c)
{
    const char *w = "cluster.device.elementwise_ns";
    config_setting_t *g = config_setting_get_member(dev, "elementwise_ns");
    if (!g) return TS_OK;
    if (!config_setting_is_group(g))
        return ts_fail("cluster file %s: %s must be a group of kernels, e.g. { gelu = [0.8, "
                       "1.1]; } (nanoseconds per element, forward and backward)",
                       path, w);
    const char *known[TS_N_ELEM + 1];
    for (int k = 0; k < TS_N_ELEM; k++) known[k] = ts_elem_names[k];
    known[TS_N_ELEM] = NULL;
    if (unknown_keys(path, g, w, known) != TS_OK) return TS_ERR;
    for (int k = 0; k < TS_N_ELEM; k++) {
        config_setting_t *s = config_setting_get_member(g, ts_elem_names[k]);
        if (!s) continue;
        double v[2];
        if (!config_setting_is_aggregate(s) || config_setting_length(s) != 2 ||
            !number_of(config_setting_get_elem(s, 0), &v[0]) ||
            !number_of(config_setting_get_elem(s, 1), &v[1]))
            return ts_fail("cluster file %s: %s.%s must be [forward, backward], two numbers "
                           "(nanoseconds per element), e.g. [0.8, 1.1]",
                           path, w, ts_elem_names[k]);
        for (int d = 0; d < 2; d++) {
            if (!isfinite(v[d]) || v[d] < 1e-6 || v[d] > 1e9)
                return ts_fail("cluster file %s: %s.%s has %s = %g ns; it must be positive, "
                               "from 1e-6 to 1e9 (leave the kernel out to cost it as a memory "
                               "pass)",
                               path, w, ts_elem_names[k], d ? "backward" : "forward", v[d]);
            c->elem_time[k][d] = v[d] * 1e-9;
        }
    }
    return TS_OK;
}

/* overlap_comm (optional, default true). */
static ts_status overlap(const char *path, const config_setting_t *cl, ts_cluster *c)
{
    config_setting_t *s = config_setting_get_member(cl, "overlap_comm");
    if (!s) return TS_OK;
    if (config_setting_type(s) != CONFIG_TYPE_BOOL)
        return ts_fail("cluster file %s: cluster.overlap_comm must be true or false (false: "
                       "communication runs on the compute cores and hides behind nothing)",
                       path);
    c->comm_on_compute = !config_setting_get_bool(s);
    return TS_OK;
}

/* moe (optional): { a2a_efficiency = X; grouped_gemm_efficiency = Y; }, each in (0, 1],
 * each 1 when left out (cluster.h). */
static ts_status moe_figures(const char *path, const config_setting_t *cl, ts_cluster *c)
{
    c->a2a_efficiency = 1.0;
    c->grouped_gemm_efficiency = 1.0;
    config_setting_t *g = config_setting_get_member(cl, "moe");
    if (!g) return TS_OK;
    if (!config_setting_is_group(g))
        return ts_fail("cluster file %s: cluster.moe must be a group { a2a_efficiency = X; "
                       "grouped_gemm_efficiency = Y; }",
                       path);
    if (unknown_keys(path, g, "cluster.moe", k_moe_keys) != TS_OK) return TS_ERR;
    const char *hints[2] = {
        "the share of the links' bandwidth the experts' all-to-all reaches, in (0, 1]",
        "the expert GEMMs' efficiency against the file's gemm_efficiency curve at each "
        "expert's own shape, in (0, 1]"};
    double *out[2] = {&c->a2a_efficiency, &c->grouped_gemm_efficiency};
    for (int k = 0; k < 2; k++) {
        if (!config_setting_get_member(g, k_moe_keys[k])) continue;
        double v;
        if (positive(path, g, "cluster.moe", k_moe_keys[k], hints[k], &v) != TS_OK) return TS_ERR;
        if (v > 1.0)
            return ts_fail("cluster file %s: cluster.moe.%s = %g is more than 1 (%s)", path,
                           k_moe_keys[k], v, hints[k]);
        *out[k] = v;
    }
    return TS_OK;
}

/* host_collectives (optional, default false). */
static ts_status host_collectives(const char *path, const config_setting_t *cl, ts_cluster *c)
{
    config_setting_t *s = config_setting_get_member(cl, "host_collectives");
    if (!s) return TS_OK;
    if (config_setting_type(s) != CONFIG_TYPE_BOOL)
        return ts_fail("cluster file %s: cluster.host_collectives must be true or false (true: "
                       "the ranks' collectives run through MPI on host memory, as on CPU "
                       "ranks, and its reductions keep temporary copies)",
                       path);
    c->host_collectives = config_setting_get_bool(s);
    return TS_OK;
}

static ts_status parse(const char *path, const config_t *lc, ts_cluster *c)
{
    config_setting_t *root = config_root_setting(lc), *cl = NULL, *dev = NULL, *peak = NULL;
    if (group(path, root, "(top level)", "cluster",
              "the file must hold cluster = { ... }, see configs/clusters/", &cl) != TS_OK)
        return TS_ERR;
    for (int k = 0; k < config_setting_length(root); k++) {
        const char *name = config_setting_name(config_setting_get_elem(root, (unsigned)k));
        if (name && strcmp(name, "cluster"))
            return ts_fail("cluster file %s: %s is not a key of the cluster format (the file "
                           "holds one group, cluster = { ... })",
                           path, name);
    }
    char source[1024];
    double dpn, mem, bw, fp32;
    if (unknown_keys(path, cl, "cluster", k_cluster_keys) != TS_OK ||
        string(path, cl, "cluster", "name", "what the cluster is, e.g. \"DGX H100\"", c->name,
               sizeof c->name) != TS_OK ||
        string(path, cl, "cluster", "source",
               "where every figure comes from: datasheets or the command that measured it",
               source, sizeof source) != TS_OK ||
        positive(path, cl, "cluster", "devices_per_node", "devices in one node, e.g. 8", &dpn) !=
            TS_OK)
        return TS_ERR;
    if (dpn != floor(dpn) || dpn > 1 << 20)
        return ts_fail("cluster file %s: cluster.devices_per_node = %g must be a whole number "
                       "from 1 to %d",
                       path, dpn, 1 << 20);
    c->devices_per_node = (int)dpn;
    if (group(path, cl, "cluster", "device", "what one device (rank) has", &dev) != TS_OK ||
        unknown_keys(path, dev, "cluster.device", k_device_keys) != TS_OK ||
        string(path, dev, "cluster.device", "name", "the device, e.g. \"H100 SXM5 80GB\"",
               c->device_name, sizeof c->device_name) != TS_OK ||
        positive(path, dev, "cluster.device", "memory_gb",
                 "GB (1e9 bytes) of memory one device may use, e.g. 80.0", &mem) != TS_OK ||
        positive(path, dev, "cluster.device", "memory_bandwidth_gbs",
                 "device memory bandwidth in GB/s, e.g. 3350.0", &bw) != TS_OK ||
        group(path, dev, "cluster.device", "peak_tflops",
              "dense peak TFLOP/s per dtype, e.g. { fp32 = 67.0; bf16 = 989.0; }", &peak) != TS_OK ||
        unknown_keys(path, peak, "cluster.device.peak_tflops", k_peak_keys) != TS_OK ||
        positive(path, peak, "cluster.device.peak_tflops", "fp32", "dense fp32 TFLOP/s, e.g. 67.0",
                 &fp32) != TS_OK)
        return TS_ERR;
    c->memory = mem * 1e9;
    c->memory_bandwidth = bw * 1e9;
    c->peak_fp32 = fp32 * 1e12;
    c->peak_bf16 = 0.0;
    if (config_setting_get_member(peak, "bf16")) {
        double bf;
        if (positive(path, peak, "cluster.device.peak_tflops", "bf16",
                     "dense bf16 TFLOP/s, e.g. 989.0; leave the key out on a device without "
                     "bf16",
                     &bf) != TS_OK)
            return TS_ERR;
        c->peak_bf16 = bf * 1e12;
    }
    char dtype[16];
    if (string(path, dev, "cluster.device", "compute_dtype",
               "the dtype GEMMs run in: \"bf16\" or \"fp32\"", dtype, sizeof dtype) != TS_OK)
        return TS_ERR;
    if (strcmp(dtype, "bf16") && strcmp(dtype, "fp32"))
        return ts_fail("cluster file %s: cluster.device.compute_dtype = \"%s\" is not \"bf16\" "
                       "or \"fp32\"",
                       path, dtype);
    c->bf16 = !strcmp(dtype, "bf16");
    if (c->bf16 && c->peak_bf16 <= 0)
        return ts_fail("cluster file %s: cluster.device.compute_dtype = \"bf16\" needs "
                       "cluster.device.peak_tflops.bf16 (or set compute_dtype = \"fp32\")",
                       path);
    if (efficiency_table(path, dev, c) != TS_OK || elementwise(path, dev, c) != TS_OK ||
        overlap(path, cl, c) != TS_OK || host_collectives(path, cl, c) != TS_OK ||
        moe_figures(path, cl, c) != TS_OK ||
        link_of(path, cl, "intra_node", "one device's link inside a node", &c->intra) != TS_OK ||
        link_of(path, cl, "inter_node", "one device's share of the network", &c->inter) != TS_OK)
        return TS_ERR;
    return TS_OK;
}

ts_status ts_cluster_load(const char *path, ts_cluster *c)
{
    memset(c, 0, sizeof *c);
    config_t lc;
    config_init(&lc);
    ts_status st = TS_OK;
    /* Opened so it cannot block; only a regular file of sane size is parsed. */
    FILE *f = ts_fopen_input(path);
    if (!f) {
        st = ts_fail("cluster file %s cannot be read: %s (see configs/clusters/)", path,
                     strerror(errno));
    } else if (ts_check_input(fileno(f), path, "cluster file", "a cluster description such "
                              "as configs/clusters/dgx-h100.cfg",
                              16ull << 20) != TS_OK) {
        st = TS_ERR;
    } else if (!config_read(&lc, f)) {
        if (config_error_type(&lc) == CONFIG_ERR_FILE_IO) /* an @include it names */
            st = ts_fail("cluster file %s: a file it includes cannot be read", path);
        else
            st = ts_fail("cluster file %s:%d: %s", config_error_file(&lc) ? config_error_file(&lc) : path,
                         config_error_line(&lc), config_error_text(&lc));
    } else {
        st = parse(path, &lc, c);
    }
    if (f) fclose(f);
    config_destroy(&lc);
    return st;
}

ts_status ts_cluster_use_precision(ts_cluster *c, const char *path, const char *precision)
{
    if (strcmp(precision, "bf16") != 0 || c->bf16) return TS_OK;
    if (c->peak_bf16 <= 0)
        return ts_fail("train.precision = \"bf16\", but cluster file %s gives no bf16 peak: "
                       "add cluster.device.peak_tflops.bf16 (one device's dense bf16 TFLOP/s), "
                       "or plan with train.precision = \"fp32\"",
                       path);
    c->bf16 = true;
    return TS_OK;
}

double ts_cluster_peak(const ts_cluster *c) { return c->bf16 ? c->peak_bf16 : c->peak_fp32; }

double ts_cluster_efficiency(const ts_cluster *c, double n)
{
    if (n <= c->eff_n[0]) return c->eff[0];
    if (n >= c->eff_n[c->n_eff - 1]) return c->eff[c->n_eff - 1];
    int k = 1;
    while (c->eff_n[k] < n) k++;
    double x = (log(n) - log(c->eff_n[k - 1])) / (log(c->eff_n[k]) - log(c->eff_n[k - 1]));
    return c->eff[k - 1] + x * (c->eff[k] - c->eff[k - 1]);
}

