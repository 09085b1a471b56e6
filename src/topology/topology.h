/* The grid of ranks and where each rank runs (docs/ARCHITECTURE.md "The grid").
 *
 * Three layers, each usable without the next:
 *   ts_grid      pure rank arithmetic: world = pp * dp * cp * tp, laid out in an order such
 *                as "tp-cp-dp-pp" (tp varies fastest: Megatron's
 *                global = tp + TP*(cp + CP*(dp + DP*pp))); no MPI, unit-testable.
 *   ts_topology  the groups of one rank (ts_groups: world, tp, cp, dp, replica, pp,
 *                embed, kv, the expert grid's ep, etp and edp, node) and the node layout. ts_topo_init is the only place
 *                that makes groups (ts_comm_split); everyone else holds pointers to them.
 *   ts_topo_bind the hwloc binding of the rank to cores, the GPU it drives (the CUDA
 *                device nearest its cores, when CUDA sees devices) and the thread count
 *                of the CPU kernels.
 *
 * Environment (for tests and experiments):
 *   TS_FAKE_NODES=K   consecutive world ranks in groups of K pretend to be separate nodes
 *                     named "fakenode0", "fakenode1", ...
 *   TS_NO_BIND=1      ts_topo_bind binds nothing (binding "none"). */
#ifndef TS_TOPOLOGY_H
#define TS_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"

/* ------------------------------------------------------------------ grid -- */

typedef enum { TS_AXIS_TP = 0, TS_AXIS_DP = 1, TS_AXIS_PP = 2, TS_AXIS_CP = 3 } ts_axis;
#define TS_N_AXES 4

typedef struct {
    int pp, dp, tp;
    int cp; /* context parallelism: which part of each sequence the rank holds */
} ts_coords;

typedef struct {
    int size[TS_N_AXES];   /* indexed by ts_axis */
    ts_axis order[TS_N_AXES]; /* order[0] is the fastest-varying axis */
    int stride[TS_N_AXES]; /* global-rank distance between neighbours along each axis */
    int world;             /* pp * dp * cp * tp */
} ts_grid;

/* "tp", "dp", "pp" or "cp". */
const char *ts_axis_name(ts_axis a);

/* Parse an order string, fastest first: the four names tp, cp, dp, pp once each joined
 * by '-' ("tp-cp-dp-pp", Megatron's; "cp-tp-dp-pp", ...), or the three names tp, dp, pp
 * once each ("tp-dp-pp", "dp-tp-pp", ...), which places cp immediately after tp
 * ("tp-dp-pp" is "tp-cp-dp-pp", "dp-tp-pp" is "dp-tp-cp-pp"). Fills order[0..3]; TS_ERR
 * with a message if the string is neither. */
ts_status ts_grid_parse_order(const char *s, ts_axis order[TS_N_AXES]);

/* A grid of pp x dp x cp x tp ranks (each >= 1) laid out in `order`. */
ts_status ts_grid_init4(ts_grid *g, int pp, int dp, int cp, int tp, const char *order);

/* Coordinates of global rank `rank` (0 <= rank < world), and back. */
ts_coords ts_grid_coords(const ts_grid *g, int rank);
int ts_grid_rank(const ts_grid *g, ts_coords c);
int ts_coords_get(ts_coords c, ts_axis a);

/* The group along `axis` that contains `rank`: the global ranks that share the other
 * three coordinates, written to members[] ordered by their coordinate on `axis` (so a
 * rank's index in it is its coordinate). Returns the group size, g->size[axis]; members
 * must hold that many. */
int ts_grid_group(const ts_grid *g, int rank, ts_axis axis, int *members);

/* The replica group of `rank`: the global ranks that hold the same weights (same pp and
 * tp coordinates, any dp and cp), written to members[] so that the member with
 * coordinates (dp, cp) is at index dp * CP + cp. Returns its size, dp * cp; members must
 * hold that many. With cp = 1 it is the dp group. */
int ts_grid_replica_group(const ts_grid *g, int rank, int *members);
/* `rank`'s index in its replica group: coords.dp * CP + coords.cp. */
int ts_grid_replica_index(const ts_grid *g, int rank);

/* The previous / next stage of `rank` in its pipeline group (global ranks), -1 at the
 * first / last stage (no wrap). */
int ts_grid_pp_prev(const ts_grid *g, int rank);
int ts_grid_pp_next(const ts_grid *g, int rank);

/* The embedding group of `rank`'s pipeline group: {first stage, last stage} (same dp,
 * cp and tp coordinates), just {first stage} when pp == 1. Returns its size (1 or 2). The
 * rank itself need not be a member. */
int ts_grid_embedding_group(const ts_grid *g, int rank, int members[2]);
bool ts_grid_in_embedding_group(const ts_grid *g, int rank);

/* Write sorted integers as a compact list, runs as ranges: {0,1,2,3,6} -> "0-3,6".
 * Truncates with "..." if `cap` is too small. Returns buf. */
char *ts_format_int_list(const int *v, int n, char *buf, size_t cap);

/* -------------------------------------------------------------- topology -- */

#define TS_HOST_MAX 256     /* >= the host names our MPIs report */
#define TS_CORES_STR_MAX 256
#define TS_GPU_PCI_MAX 20   /* a PCI bus id "0000:3b:00.0" and its terminator */

/* The groups of one rank, each named once here: adding a group is a row of this list
 * and its maker in topology.c (make_<name>, run in list order, collectively over world).
 * Columns: the field name, and whether the group moves the compute backend's memory
 * (TS_GROUP_DEVICE: the trainer moves it to the device's data plane, e.g. NCCL) or only
 * host records and values (TS_GROUP_HOST: stays on MPI). */
#define TS_GROUP_LIST(X)                                                                    \
    X(world, TS_GROUP_HOST)     /* every rank: a copy of the caller's (not owned) */       \
    X(tp, TS_GROUP_DEVICE)      /* same pp, dp, cp; rank in it = coords.tp */               \
    X(cp, TS_GROUP_DEVICE)      /* same pp, dp, tp; rank in it = coords.cp; size cp */      \
    X(dp, TS_GROUP_HOST)        /* same pp, cp, tp; rank in it = coords.dp; parallel.dp */  \
    X(replica, TS_GROUP_DEVICE) /* the ranks holding the same weights, see below */         \
    X(pp, TS_GROUP_DEVICE)      /* rank in it = coords.pp */                                \
    X(embed, TS_GROUP_DEVICE)   /* {first, last} stage; size 0 outside it; first is 0 */   \
    X(kv, TS_GROUP_DEVICE)      /* the tp ranks holding the same key/value heads */         \
    X(ep, TS_GROUP_DEVICE)      /* the expert grid's (expert_grid.h): experts split over */ \
    X(etp, TS_GROUP_DEVICE)     /* it; one expert tensor-split over it; the ranks holding */ \
    X(edp, TS_GROUP_DEVICE)     /* the same experts (their gradients reduce over it) */      \
    X(node, TS_GROUP_HOST)      /* the ranks sharing this node's memory */

typedef enum { TS_GROUP_HOST, TS_GROUP_DEVICE } ts_group_memory;

/* One ts_comm per row of TS_GROUP_LIST, owned by the topology (ts_topo_free releases
 * them and any data-plane backend attached to them). Everyone else holds a pointer to
 * the topology's ts_groups or to one of its groups, never a copy, so a backend, a
 * busy_ms counter or an on_span hook set on a group is seen by every holder.
 *  - replica: the ranks holding the same weights (same pp and tp, any dp and cp): the
 *    gradient reduction and ZeRO sharding run over it. Rank in it = coords.dp * cp +
 *    coords.cp, size dp * cp; with cp = 1 the members and order of `dp` (named "dp" in
 *    messages then, "dp*cp" otherwise). `dp` is parallel.dp's axis alone.
 *  - kv: llama with tp > n_kv_head: tp / n_kv_head consecutive tp ranks; otherwise this
 *    rank alone. */
typedef struct {
#define TS_GROUP_FIELD(name, memory) ts_comm name;
    TS_GROUP_LIST(TS_GROUP_FIELD)
#undef TS_GROUP_FIELD
} ts_groups;

enum {
#define TS_GROUP_COUNT(name, memory) +1
    TS_N_GROUPS = 0 TS_GROUP_LIST(TS_GROUP_COUNT)
#undef TS_GROUP_COUNT
};

/* Group i of TS_GROUP_LIST (0 <= i < TS_N_GROUPS), and what it moves. */
ts_comm *ts_groups_at(ts_groups *g, int i);
ts_group_memory ts_group_memory_of(int i);

typedef struct {
    /* Filled by ts_topo_init. */
    ts_grid grid;
    int expert[3];           /* the expert grid's etp, ep, edp (parallel.etp, parallel.ep,
                                and the rest of tp*cp*dp: topology/expert_grid.h) */
    ts_groups groups;        /* this rank's groups (see ts_groups) */
    int rank, world_size;    /* in groups.world */
    ts_coords coords;

    int pp_prev, pp_next;    /* world ranks, -1 at the ends (in groups.pp: pp -/+ 1) */
    int embed_members[2], n_embed; /* the embedding group of this rank's pipeline */

    int local_rank, local_size;
    int node, n_nodes;       /* nodes numbered by their lowest world rank */
    bool fake_nodes;         /* TS_FAKE_NODES was set */
    char host[TS_HOST_MAX];  /* this rank's host name */
    int *node_of_rank;       /* [world_size]: node index of every world rank */
    char (*node_host)[TS_HOST_MAX]; /* [n_nodes]: host name of each node */
    int tp_nodes;            /* nodes spanned by this rank's tp group (1 = good) */

    /* Filled by ts_topo_bind. */
    bool bound;              /* ts_topo_bind has run */
    char cores[TS_CORES_STR_MAX]; /* logical core indices this rank runs on, "0-3" */
    int n_cores;             /* how many cores that is */
    int threads;             /* CPU threads (OpenMP + BLAS) this rank uses */
    char binding[16];        /* "tessera" | "slurm" | "mpirun" | "inherited" | "none" */
    /* The GPU. With CUDA devices visible (gpu_cuda): the CUDA ordinal this rank drives,
     * chosen over the node by ts_gpu_assign (nearest the rank's cores, spread evenly;
     * pass it to ts_cuda_select_device), its PCI bus id and name ("NVIDIA H200").
     * Otherwise the GPU hwloc sees that the binding placed the cores near (local rank
     * mod GPUs, e.g. "cuda0 (NVIDIA H100)" or "pci 0000:3b:00.0"), or -1 and "none". */
    int gpu;
    bool gpu_cuda;
    char gpu_name[64];
    char gpu_pci[TS_GPU_PCI_MAX]; /* "" unless gpu_cuda */
    int cuda_devices;        /* CUDA devices this rank sees; -1: built without CUDA */
    /* The node's hardware as hwloc sees it. */
    int hw_packages, hw_numa, hw_cores, hw_pus, hw_gpus;
} ts_topology;

/* Build the grid from cfg->parallel (pp, dp, cp, tp, order) and create this rank's
 * communicators and node layout. Collective over `world`, whose size must equal
 * pp*dp*cp*tp (checked first, identically on every rank, before any collective).
 * Rank 0 warns (ts_log_warn) once when a tensor-parallel group spans nodes. On success
 * the caller owns *t and must call ts_topo_free before ts_comm_finalize. */
ts_status ts_topo_init(ts_topology *t, const ts_config *cfg, const ts_comm *world);

/* Bind this rank with hwloc and work out its CPU thread count (t->threads; the caller
 * starts them with ts_cpu_set_threads: the topology reports cores, it sets no kernel
 * state):
 *  - a binding narrower than the machine that the launcher already made (srun
 *    --cpu-bind, mpirun --bind-to core) is kept, and attributed to "slurm"/"mpirun";
 *  - otherwise local rank i of L gets cores [i*n/L, (i+1)*n/L) of the n cores (of the
 *    GPU's locality when the node has GPUs), in hwloc's logical order; if L > n, rank i
 *    gets core i mod n and rank 0 warns once that ranks outnumber cores;
 *  - TS_NO_BIND=1 binds nothing ("none"; a launcher's binding is still kept and named).
 * Threads = cfg->train.threads if > 0, else this rank's fair share of the cores it runs
 * on (cores shared with other local ranks count fractionally), at least 1.
 * Then the GPU (t->gpu, in a CUDA build that sees devices): the node's ranks gather
 * their bindings and the ranks that see the same CUDA devices share them out with
 * ts_gpu_assign, each GPU's nearby CPUs from hwloc's PCI device by bus id (or sysfs's
 * local_cpulist). It selects no device: the caller passes t->gpu to
 * ts_cuda_select_device.
 * Collective over t->groups.world (call on every rank after ts_topo_init). A failed hwloc
 * call is not fatal: the rank runs unbound and says so. */
ts_status ts_topo_bind(ts_topology *t, const ts_config *cfg);

/* The GPU each of a node's ranks drives, from CPU sets alone (pure; gpu_assign.c):
 * rank_cpus[r] is the CPUs local rank r is bound to and gpu_cpus[g] the CPUs near GPU g
 * (its NUMA node's), as CPU lists ("0-3,8"; NULL or "" for unknown). Each GPU gets
 * floor or ceil of n_ranks / n_gpus ranks; within that a rank goes to the GPU whose CPUs
 * cover the largest share of its own, ties to the less-loaded GPU, then in rank and GPU
 * order, so without locality local rank r gets GPU r mod n_gpus. gpu_of_rank[n_ranks]
 * receives the choice. TS_ERR (and nothing written) for a list that does not parse. */
ts_status ts_gpu_assign(const char *const *rank_cpus, int n_ranks, const char *const *gpu_cpus,
                        int n_gpus, int *gpu_of_rank);

/* Free the groups (detaching any data-plane backend moved onto them; not the caller's
 * world) and arrays. Safe on a zeroed struct. */
void ts_topo_free(ts_topology *t);

#endif
