/* Binding ranks to cores (and GPUs) with hwloc, and sizing the CPU thread pool.
 *
 * The policy (see ts_topo_bind in topology.h): keep a binding the launcher made; else
 * split the node's cores into disjoint contiguous blocks, one per local rank, in hwloc's
 * logical order (which walks package by package, NUMA node by NUMA node, so a block
 * stays inside one when it can). On a node with GPUs, local rank i's block is cut from
 * the cores near GPU i mod n_gpus (CUDA's devices in CUDA's order when CUDA sees any,
 * else the GPUs hwloc finds).
 *
 * Then, with CUDA devices, which one each rank drives: whatever made the binding (us or
 * the launcher), the node's ranks gather their CPU sets and ts_gpu_assign gives each
 * rank the device nearest its cores, evenly (gpu_assign.c). A device's nearby CPUs are
 * its hwloc PCI object's nearest non-I/O ancestor's, found by the bus id CUDA reports,
 * or sysfs's local_cpulist when hwloc did not keep the device. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hwloc.h>

#include "comm/comm.h"
#include "core/env.h"
#include "core/log.h"
#include "core/sysmem.h"
#include "kernels/kernels.h"
#include "topology/topology.h"

#define MAX_GPUS 64

typedef struct {
    hwloc_obj_t obj;     /* NULL when only `near` is known */
    hwloc_bitmap_t near; /* the CPUs near it when known apart from obj (owned), or NULL */
    char name[64];
} gpu_dev;

/* The CUDA devices this process sees, in CUDA's order, for the node-wide choice: bus
 * ids, names and the CPUs near each as a list ("" when unknown; malloc'd). */
typedef struct {
    int n; /* 0: none (or a build without CUDA) */
    char busid[MAX_GPUS][TS_GPU_PCI_MAX];
    char name[MAX_GPUS][64];
    char *near[MAX_GPUS];
} cuda_devs;

/* --------------------------------------------------------------- GPUs -- */

static bool starts_with(const char *s, const char *prefix)
{
    return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* OS devices named by one GPU software stack ("cuda0", "nvml0", ...), in hwloc order. */
static int osdevs_named(hwloc_topology_t topo, const char *prefix, gpu_dev *out)
{
    int n = 0;
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o && n < MAX_GPUS;
         o = hwloc_get_next_osdev(topo, o)) {
        hwloc_obj_osdev_type_t type = o->attr->osdev.type;
        if ((type != HWLOC_OBJ_OSDEV_GPU && type != HWLOC_OBJ_OSDEV_COPROC) ||
            !starts_with(o->name, prefix))
            continue;
        const char *model = hwloc_obj_get_info_by_name(o, "GPUModel");
        out[n].obj = o;
        if (model)
            snprintf(out[n].name, sizeof out[n].name, "%s (%s)", o->name, model);
        else
            snprintf(out[n].name, sizeof out[n].name, "%s", o->name);
        n++;
    }
    return n;
}

/* Without CUDA/NVML/ROCm plugins (Debian's hwloc has none) a GPU is still a PCI device:
 * NVIDIA or AMD display controllers, 3D controllers, processing accelerators. */
static int gpu_pcidevs(hwloc_topology_t topo, gpu_dev *out)
{
    int n = 0;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o && n < MAX_GPUS;
         o = hwloc_get_next_pcidev(topo, o)) {
        const struct hwloc_pcidev_attr_s *pci = &o->attr->pcidev;
        bool gpu_vendor = pci->vendor_id == 0x10de || pci->vendor_id == 0x1002;
        bool display = (pci->class_id >> 8) == 0x03;
        if (!(pci->class_id == 0x0302 || pci->class_id == 0x1200 || (display && gpu_vendor)))
            continue;
        out[n].obj = o;
        snprintf(out[n].name, sizeof out[n].name, "pci %04x:%02x:%02x.%x", pci->domain,
                 pci->bus, pci->dev, pci->func);
        n++;
    }
    return n;
}

/* CUDA_VISIBLE_DEVICES=2,3 renumbers the devices a process sees as 0, 1. Apply it to a
 * list found without the CUDA runtime when it is a list of indices (UUIDs and MIG names
 * cannot be matched to hwloc objects: the list is kept whole). */
static int apply_visible_devices(gpu_dev *gpus, int n)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    if (!env) return n;
    gpu_dev picked[MAX_GPUS];
    int k = 0;
    const char *s = env;
    while (*s) {
        char *end;
        long idx = strtol(s, &end, 10);
        if (end == s || (*end != ',' && *end != '\0')) return n; /* not an index list */
        if (idx < 0 || idx >= n) break; /* CUDA stops at the first invalid index */
        if (k < MAX_GPUS) picked[k++] = gpus[idx];
        s = *end == ',' ? end + 1 : end;
    }
    if (k > 0) memcpy(gpus, picked, sizeof(gpu_dev) * (size_t)k);
    return k;
}

/* The node's GPUs as a CUDA program would number them: CUDA devices if hwloc's CUDA
 * plugin is there, else NVML / ROCm SMI / OpenCL devices, else GPU-like PCI devices. */
static int find_gpus(hwloc_topology_t topo, gpu_dev *gpus)
{
    int n = osdevs_named(topo, "cuda", gpus);
    if (n > 0) return n; /* the CUDA runtime applied CUDA_VISIBLE_DEVICES already */
    static const char *const prefixes[] = { "nvml", "rsmi", "opencl" };
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && n == 0; i++)
        n = osdevs_named(topo, prefixes[i], gpus);
    if (n == 0) n = gpu_pcidevs(topo, gpus);
    return apply_visible_devices(gpus, n);
}

#ifdef TS_HAVE_CUDA
/* sysfs's CPUs near PCI device `busid` (Linux), or NULL. */
static hwloc_bitmap_t sysfs_locality(const char *busid)
{
    char path[128], list[4096];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", busid);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    bool ok = fgets(list, sizeof list, f) != NULL;
    fclose(f);
    if (!ok) return NULL;
    list[strcspn(list, "\n")] = '\0';
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!*list || hwloc_bitmap_list_sscanf(set, list) != 0 || hwloc_bitmap_iszero(set)) {
        hwloc_bitmap_free(set);
        return NULL;
    }
    return set;
}

/* The CUDA devices, as gpus[] for the binding and as *out for the choice of device.
 * Returns how many (0 when CUDA sees none). */
static int find_cuda_gpus(hwloc_topology_t topo, gpu_dev *gpus, cuda_devs *out)
{
    int n = ts_cuda_device_count();
    if (n > MAX_GPUS) n = MAX_GPUS;
    out->n = n;
    for (int i = 0; i < n; i++) {
        gpu_dev *g = &gpus[i];
        memset(g, 0, sizeof *g);
        ts_cuda_device_name(i, out->name[i], sizeof out->name[i]);
        snprintf(g->name, sizeof g->name, "cuda%d (%s)", i, out->name[i]);
        unsigned dom = 0, bus = 0, dev = 0, fn = 0;
        char busid[TS_PCI_BUSID_MAX];
        if (ts_cuda_device_pci(i, busid) &&
            sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
            snprintf(out->busid[i], sizeof out->busid[i], "%s", busid);
            g->obj = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
            if (!g->obj) g->near = sysfs_locality(busid);
        } else {
            snprintf(out->busid[i], sizeof out->busid[i], "?");
        }
        hwloc_obj_t anc = g->obj ? hwloc_get_non_io_ancestor_obj(topo, g->obj) : NULL;
        char *list = NULL;
        if (anc && anc->cpuset)
            hwloc_bitmap_list_asprintf(&list, anc->cpuset);
        else if (g->near)
            hwloc_bitmap_list_asprintf(&list, g->near);
        out->near[i] = list ? list : strdup("");
        TS_ASSERT(out->near[i]);
    }
    return n;
}
#endif

/* The CPUs near a device: those of its closest non-I/O ancestor (or the ones known
 * apart from hwloc's objects), within `allowed`; all of `allowed` when unknown. */
static hwloc_bitmap_t gpu_locality(hwloc_topology_t topo, const gpu_dev *gpu,
                                   hwloc_const_bitmap_t allowed)
{
    hwloc_obj_t anc = gpu->obj ? hwloc_get_non_io_ancestor_obj(topo, gpu->obj) : NULL;
    hwloc_const_bitmap_t near = gpu->near ? gpu->near : anc ? anc->cpuset : NULL;
    hwloc_bitmap_t set = hwloc_bitmap_dup(near ? near : allowed);
    hwloc_bitmap_and(set, set, allowed);
    if (hwloc_bitmap_iszero(set)) hwloc_bitmap_copy(set, allowed);
    return set;
}

/* --------------------------------------------------------------- cores -- */

/* The unit we hand out: cores, or PUs on the rare machine where hwloc reports no cores. */
static hwloc_obj_type_t core_type(hwloc_topology_t topo)
{
    return hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

/* Cores entirely inside `set`, in logical order; returns the count (out may be NULL). */
static int cores_inside(hwloc_topology_t topo, hwloc_const_bitmap_t set, hwloc_obj_t *out)
{
    int n = 0;
    hwloc_obj_type_t type = core_type(topo);
    for (hwloc_obj_t o = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, type, NULL); o;
         o = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, type, o)) {
        if (out) out[n] = o;
        n++;
    }
    return n;
}

/* Who made an existing binding, judged from the launcher's environment. */
static const char *binding_launcher(void)
{
    if (getenv("SLURM_CPU_BIND") || getenv("SLURM_CPU_BIND_TYPE")) return "slurm";
    if (getenv("OMPI_MCA_orte_bound_at_launch") || getenv("OMPI_MCA_orte_hnp_uri"))
        return "mpirun";
    if (getenv("SLURM_JOB_ID")) return "slurm";
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("OMPI_COMM_WORLD_RANK")) return "mpirun";
    return "inherited"; /* taskset, numactl, a container's cpuset, ... */
}

typedef struct {
    hwloc_bitmap_t set; /* the CPUs this rank will run on */
    bool oversubscribed; /* more local ranks than cores to give them */
} plan;

/* Tessera's own choice for local rank `i`: a contiguous block of the cores near its
 * GPU (or of the node), shared with the other local ranks that are near the same cores. */
static plan plan_binding(hwloc_topology_t topo, const ts_topology *t, const gpu_dev *gpus,
                         int n_gpus)
{
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    hwloc_bitmap_t near = n_gpus > 0 ? gpu_locality(topo, &gpus[t->local_rank % n_gpus], allowed)
                                     : hwloc_bitmap_dup(allowed);
    /* My index among the local ranks whose cores come from the same `near` set. */
    int index = 0, peers = 0;
    for (int j = 0; j < t->local_size; j++) {
        bool same = true;
        if (n_gpus > 0) {
            hwloc_bitmap_t other = gpu_locality(topo, &gpus[j % n_gpus], allowed);
            same = hwloc_bitmap_isequal(other, near);
            hwloc_bitmap_free(other);
        }
        if (!same) continue;
        if (j < t->local_rank) index++;
        peers++;
    }

    plan p = { hwloc_bitmap_alloc(), false };
    int n = cores_inside(topo, near, NULL);
    if (n == 0) { /* no whole core near: fall back to the node */
        hwloc_bitmap_copy(near, allowed);
        n = cores_inside(topo, near, NULL);
    }
    hwloc_obj_t *cores = ts_malloc(sizeof(hwloc_obj_t) * (size_t)(n > 0 ? n : 1));
    cores_inside(topo, near, cores);
    if (n == 0) {
        hwloc_bitmap_copy(p.set, allowed);
    } else if (peers <= n) {
        long lo = (long)index * n / peers, hi = (long)(index + 1) * n / peers;
        for (long c = lo; c < hi; c++) hwloc_bitmap_or(p.set, p.set, cores[c]->cpuset);
    } else {
        hwloc_bitmap_or(p.set, p.set, cores[index % n]->cpuset);
        p.oversubscribed = true;
    }
    free(cores);
    hwloc_bitmap_free(near);
    return p;
}

/* The cores (logical indices) `set` touches, as a list string; returns their count.
 * flags[i] = 1 for each touched core i (of n_all). */
static int describe_cores(hwloc_topology_t topo, hwloc_const_bitmap_t set, int *flags,
                          int n_all, char *buf, size_t cap)
{
    hwloc_obj_type_t type = core_type(topo);
    int *idx = ts_malloc(sizeof(int) * (size_t)(n_all > 0 ? n_all : 1));
    int n = 0;
    for (int i = 0; i < n_all; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, (unsigned)i);
        flags[i] = o && o->cpuset && hwloc_bitmap_intersects(o->cpuset, set);
        if (flags[i]) idx[n++] = i;
    }
    if (n == 0)
        snprintf(buf, cap, "none");
    else
        ts_format_int_list(idx, n, buf, cap);
    free(idx);
    return n;
}

/* This rank's fair share of the cores it runs on: a core shared by k local ranks
 * counts 1/k. At least one thread. */
static int fair_threads(const ts_topology *t, const int *flags, int n_all)
{
    int *count = ts_malloc(sizeof(int) * (size_t)(n_all > 0 ? n_all : 1));
    if (n_all > 0) memcpy(count, flags, sizeof(int) * (size_t)n_all);
    ts_host_allreduce_sum_i32(&t->groups.node, count, (size_t)n_all);
    double share = 0;
    for (int i = 0; i < n_all; i++)
        if (flags[i] && count[i] > 0) share += 1.0 / count[i];
    free(count);
    int threads = (int)(share + 1e-6);
    return threads < 1 ? 1 : threads;
}

/* Rank 0 warns once if any node has more ranks than cores to give them. */
static void warn_oversubscription(const ts_topology *t, bool oversubscribed, int node_cores)
{
    int first = oversubscribed ? t->node : INT_MAX;
    ts_host_allreduce_min_i32(&t->groups.world, &first, 1);
    if (first == INT_MAX) return;
    int there[2] = { 0, 0 };
    if (t->node == first) {
        there[0] = t->local_size;
        there[1] = node_cores;
    }
    ts_host_allreduce_max_i32(&t->groups.world, there, 2);
    ts_log_warn("ranks outnumber cores: %d ranks run on the %d cores of node %d (%s), so "
                "they share cores and run 1 thread each; launch at most %d ranks per node "
                "for a core each",
                there[0], there[1], first, t->node_host[first], there[1]);
}

/* What hwloc tells and does for this rank: fills the node summary, the GPU (provisional
 * until assign_gpu), the binding and its cores; flags[i] = 1 for each core (of *n_all)
 * the rank runs on (malloc'd); *cpus the CPUs it runs on as a list (malloc'd); *cuda the
 * CUDA devices. Returns false if hwloc cannot discover the node. Not collective. */
static bool bind_here(ts_topology *t, int **flags, int *n_all, bool *oversubscribed,
                      char **cpus, cuda_devs *cuda)
{
    static bool bound_by_us = false; /* a second call must not mistake ours for mpirun's */
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return false;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
        hwloc_topology_destroy(topo);
        return false;
    }
    t->hw_packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    t->hw_numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    t->hw_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    t->hw_pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    gpu_dev gpus[MAX_GPUS] = {0}; /* the hwloc fallbacks fill only obj and name */
    int n_gpus = 0;
#ifdef TS_HAVE_CUDA
    n_gpus = find_cuda_gpus(topo, gpus, cuda);
#else
    (void)cuda;
#endif
    if (n_gpus == 0) n_gpus = find_gpus(topo, gpus);
    t->hw_gpus = n_gpus;
    t->gpu = n_gpus > 0 ? t->local_rank % n_gpus : -1;
    snprintf(t->gpu_name, sizeof t->gpu_name, "%s", n_gpus > 0 ? gpus[t->gpu].name : "none");

    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    hwloc_bitmap_t current = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(topo, current, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_copy(current, allowed);
    const char *no_bind = ts_env(TS_ENV_NO_BIND);
    hwloc_bitmap_t set;

    if (!hwloc_bitmap_isincluded(allowed, current)) {
        /* Bound to part of the machine already: by the launcher (keep it), or by us. */
        set = hwloc_bitmap_dup(current);
        snprintf(t->binding, sizeof t->binding, "%s",
                 bound_by_us ? "tessera" : binding_launcher());
    } else if (no_bind && strcmp(no_bind, "0") != 0) {
        set = hwloc_bitmap_dup(current);
        snprintf(t->binding, sizeof t->binding, "none");
    } else {
        plan p = plan_binding(topo, t, gpus, n_gpus);
        set = p.set;
        *oversubscribed = p.oversubscribed;
        if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
            bound_by_us = !hwloc_bitmap_isincluded(allowed, set);
            snprintf(t->binding, sizeof t->binding, "tessera");
        } else {
            char *want = NULL;
            hwloc_bitmap_list_asprintf(&want, set);
            ts_log_any("tessera: warning: could not bind to CPUs %s (hwloc_set_cpubind "
                       "failed); running unbound",
                       want ? want : "?");
            free(want);
            hwloc_bitmap_copy(set, current);
            snprintf(t->binding, sizeof t->binding, "none");
        }
    }

    *n_all = hwloc_get_nbobjs_by_type(topo, core_type(topo));
    *flags = ts_calloc((size_t)(*n_all > 0 ? *n_all : 1), sizeof(int));
    t->n_cores = describe_cores(topo, set, *flags, *n_all, t->cores, sizeof t->cores);
    if (hwloc_bitmap_list_asprintf(cpus, set) < 0) *cpus = NULL;
    for (int i = 0; i < n_gpus; i++)
        if (gpus[i].near) hwloc_bitmap_free(gpus[i].near);
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(current);
    hwloc_topology_destroy(topo);
    return true;
}

/* train.threads must fit the node's CPUs, and every BLAS thread's buffer the address
 * space that RLIMIT_AS (ulimit -v) leaves. */
static ts_status check_threads(const ts_topology *t, const ts_config *cfg)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cfg->train.threads > 0 && cpus > 0 && cfg->train.threads > cpus)
        return ts_fail("train.threads = %d is more than the %ld CPUs of host %s; use at most "
                       "%ld, or 0 for the cores this rank owns",
                       cfg->train.threads, cpus, t->host, cpus);
    ts_sysmem lim;
    ts_sysmem_read(&lim);
    double need = t->threads * TS_BLAS_THREAD_BYTES, left = lim.address_space - lim.vm_now;
    char n[32], l[32], a[32];
    if (need > left)
        return ts_fail("%d BLAS threads need %s of address space (%.0f MiB each), but the "
                       "address-space limit (ulimit -v) leaves %s of its %s on host %s; set "
                       "train.threads lower or raise the limit",
                       t->threads, ts_format_bytes(need, n, sizeof n),
                       TS_BLAS_THREAD_BYTES / 1048576.0, ts_format_bytes(left, l, sizeof l),
                       ts_format_bytes(lim.address_space, a, sizeof a), t->host);
    return TS_OK;
}

/* Which CUDA device this rank drives (see the file comment). Collective over the node:
 * every rank takes part, with or without devices. The ranks that see the same devices
 * in the same order (CUDA_VISIBLE_DEVICES may differ per rank, e.g. one device each)
 * share them, in local-rank order; each rank's record is its CPU list and its devices'
 * bus ids, gathered at the node's longest record. */
static ts_status assign_gpu(ts_topology *t, const char *cpus, const cuda_devs *cuda)
{
    size_t key_len = 1;
    for (int i = 0; i < cuda->n; i++) key_len += strlen(cuda->busid[i]) + 1;
    char *key = ts_calloc(key_len, 1);
    for (int i = 0; i < cuda->n; i++) {
        if (i) strcat(key, ",");
        strcat(key, cuda->busid[i]);
    }
    const char *mine = cpus ? cpus : "";
    int len = (int)(strlen(mine) + 1 + strlen(key) + 1);
    ts_host_allreduce_max_i32(&t->groups.node, &len, 1);
    char *rec = ts_calloc((size_t)len, 1);
    memcpy(rec, mine, strlen(mine));
    memcpy(rec + strlen(mine) + 1, key, strlen(key));
    const int L = t->groups.node.size;
    char *all = ts_malloc((size_t)len * (size_t)L);
    ts_allgather_bytes(&t->groups.node, rec, (size_t)len, all);

    ts_status st = TS_OK;
    if (cuda->n > 0) {
        const char **rank_cpus = ts_malloc(sizeof(char *) * (size_t)L);
        int n = 0, me = -1;
        for (int j = 0; j < L; j++) {
            const char *r = all + (size_t)j * len;
            if (strcmp(r + strlen(r) + 1, key)) continue; /* sees other devices */
            if (j == t->local_rank) me = n;
            rank_cpus[n++] = r;
        }
        TS_ASSERT(me >= 0);
        int *gpu = ts_malloc(sizeof(int) * (size_t)n);
        st = ts_gpu_assign(rank_cpus, n, (const char *const *)cuda->near, cuda->n, gpu);
        if (st == TS_OK) {
            t->gpu = gpu[me];
            t->gpu_cuda = true;
            snprintf(t->gpu_name, sizeof t->gpu_name, "%s", cuda->name[t->gpu]);
            snprintf(t->gpu_pci, sizeof t->gpu_pci, "%s", cuda->busid[t->gpu]);
        } else {
            ts_error_prefix("choosing the GPU of local rank %d on host %s: ", t->local_rank,
                            t->host);
        }
        free(gpu);
        free(rank_cpus);
    }
    free(all);
    free(rec);
    free(key);
    return st;
}

ts_status ts_topo_bind(ts_topology *t, const ts_config *cfg)
{
    int *flags = NULL, n_all = 0;
    bool oversubscribed = false;
    char *cpus = NULL;
    cuda_devs cuda;
    memset(&cuda, 0, sizeof cuda);
#ifdef TS_HAVE_CUDA
    t->cuda_devices = 0;
#else
    t->cuda_devices = -1;
#endif
    t->gpu_cuda = false;
    t->gpu_pci[0] = '\0';
    if (!bind_here(t, &flags, &n_all, &oversubscribed, &cpus, &cuda)) {
        ts_log_any("tessera: warning: hwloc cannot discover this node; running unbound "
                   "with 1 thread unless train.threads says otherwise");
        snprintf(t->binding, sizeof t->binding, "none");
        snprintf(t->cores, sizeof t->cores, "unknown");
    }

    /* The collectives below run on every rank, whatever hwloc said, with sizes agreed
     * over the node (a rank that saw no cores contributes zeros). */
    int n_node = n_all;
    ts_host_allreduce_max_i32(&t->groups.node, &n_node, 1);
    int *node_flags = ts_calloc((size_t)(n_node > 0 ? n_node : 1), sizeof(int));
    if (flags && n_all == n_node) memcpy(node_flags, flags, sizeof(int) * (size_t)n_all);
    int fair = fair_threads(t, node_flags, n_node);
    free(node_flags);
    free(flags);
    warn_oversubscription(t, oversubscribed, n_node);

#ifdef TS_HAVE_CUDA
    t->cuda_devices = cuda.n;
#endif
    ts_status gst = assign_gpu(t, cpus, &cuda);
    free(cpus);
    for (int i = 0; i < cuda.n; i++) free(cuda.near[i]);
    if (ts_comm_agree(&t->groups.world, gst) != TS_OK) return TS_ERR;

    t->threads = cfg->train.threads > 0 ? cfg->train.threads : fair;
    /* Checked before OpenBLAS starts the threads: under an address-space limit its
     * buffer allocation retries forever instead of failing. Agreed, so a rank whose
     * node is smaller fails the whole job at once. */
    if (ts_comm_agree(&t->groups.world, check_threads(t, cfg)) != TS_OK) return TS_ERR;
    t->bound = true;
    return TS_OK;
}
