/* tessera topo: where every rank of the grid sits (host, coordinates, cores, threads,
 * binding, GPU) and which groups it forms. Builds the same ts_topology the trainer does,
 * so what it prints is what a training run with the same launch would get. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "kernels/kernels.h"
#include "topology/expert_grid.h"
#include "topology/topology.h"

static const char *k_help =
    "usage: tessera topo [CONFIG] [--set KEY=VALUE ...]\n"
    "\n"
    "Print the rank -> (pp, dp, tp) map of the grid, (pp, dp, cp, tp) when parallel.cp >\n"
    "1, the host and node of every rank, the cores it is bound to, its thread count, who\n"
    "made the binding and its GPU, then the tensor-, data- and pipeline-parallel groups\n"
    "(with cp > 1 also the context-parallel groups and the replica groups: the ranks that\n"
    "hold the same weights) and the embedding groups; for an MoE model (model.moe_experts\n"
    "> 0) also the expert grid's groups: expert-parallel (ep: the ranks splitting the\n"
    "experts), expert-tensor (etp) and expert-data (edp: the ranks holding the same\n"
    "experts, over which their gradients reduce). Run it under mpirun or srun exactly\n"
    "like `tessera train` to check a launch before training.\n"
    "\n"
    "  CONFIG            a libconfig file; its parallel.pp/dp/cp/tp/order and\n"
    "                    train.threads are used and the whole config is validated as\n"
    "                    train would.\n"
    "                    Without CONFIG the grid is pp=1, dp=<ranks launched>, tp=1.\n"
    "  --set KEY=VALUE   override a config key, e.g. --set parallel.tp=2\n"
    "                    --set parallel.order=dp-tp-pp --set parallel.cp=2\n"
    "\n"
    "Binding: a binding the launcher made (srun --cpu-bind, mpirun --bind-to core) is kept\n"
    "and shown as \"slurm\" or \"mpirun\"; otherwise tessera gives each rank of a node its\n"
    "own contiguous block of cores (\"tessera\"). Threads per rank = its cores, unless\n"
    "train.threads > 0. Cores are hwloc logical core indices.\n"
    "\n"
    "GPU: the CUDA device the rank drives with train.device = \"cuda\" (index, PCI bus id,\n"
    "name): the one nearest its cores, the node's devices shared out evenly. \"no CUDA\n"
    "devices\" when the rank sees none (or the build has no CUDA backend).\n"
    "\n"
    "Environment:\n"
    "  TS_NO_BIND=1      do not bind (binding \"none\")\n"
    "  TS_FAKE_NODES=K   pretend every K consecutive ranks are a separate node\n"
    "                    (\"fakenode0\", ...), to try multi-node layouts on one machine\n"
    "\n"
    "Warnings (a tensor-parallel group spanning nodes, more ranks than cores) go to stderr.\n"
    "Exit code 0 on success, non-zero on every rank on an error (a failed write to\n"
    "standard output included).\n";

/* One rank's line of the table, gathered to rank 0 as bytes (same binary everywhere). */
typedef struct {
    int rank, node, local_rank, local_size;
    ts_coords coords;
    int threads, gpu, n_cores;
    int hw_packages, hw_numa, hw_cores, hw_pus, hw_gpus;
    char host[TS_HOST_MAX];
    char cores[TS_CORES_STR_MAX];
    char binding[16];
    char gpu_name[64];
    char gpu_pci[TS_GPU_PCI_MAX];
    int gpu_cuda, cuda_devices;
} rank_row;

static rank_row make_row(const ts_topology *t)
{
    rank_row r;
    memset(&r, 0, sizeof r);
    r.rank = t->rank;
    r.node = t->node;
    r.local_rank = t->local_rank;
    r.local_size = t->local_size;
    r.coords = t->coords;
    r.threads = t->threads;
    r.gpu = t->gpu;
    r.n_cores = t->n_cores;
    r.hw_packages = t->hw_packages;
    r.hw_numa = t->hw_numa;
    r.hw_cores = t->hw_cores;
    r.hw_pus = t->hw_pus;
    r.hw_gpus = t->hw_gpus;
    snprintf(r.host, sizeof r.host, "%s", t->host);
    snprintf(r.cores, sizeof r.cores, "%s", t->cores);
    snprintf(r.binding, sizeof r.binding, "%s", t->binding);
    snprintf(r.gpu_name, sizeof r.gpu_name, "%s", t->gpu_name);
    snprintf(r.gpu_pci, sizeof r.gpu_pci, "%s", t->gpu_pci);
    r.gpu_cuda = t->gpu_cuda;
    r.cuda_devices = t->cuda_devices;
    return r;
}

static int max_int(int a, int b) { return a > b ? a : b; }

static void print_nodes(const ts_topology *t, const rank_row *rows)
{
    int n = t->world_size, wh = 4;
    for (int i = 0; i < n; i++) wh = max_int(wh, (int)strlen(rows[i].host));
    printf("\n%-4s  %-*s  %-12s  %8s  %4s  %5s  %4s  %4s\n", "node", wh, "host", "ranks",
           "packages", "numa", "cores", "pus", "gpus");
    int *ranks = ts_malloc(sizeof(int) * (size_t)n);
    char list[64];
    for (int node = 0; node < t->n_nodes; node++) {
        int k = 0, first = -1;
        for (int i = 0; i < n; i++)
            if (rows[i].node == node) {
                if (first < 0) first = i;
                ranks[k++] = i;
            }
        const rank_row *r = &rows[first];
        printf("%-4d  %-*s  %-12s  %8d  %4d  %5d  %4d  %4d\n", node, wh, r->host,
               ts_format_int_list(ranks, k, list, sizeof list), r->hw_packages, r->hw_numa,
               r->hw_cores, r->hw_pus, r->hw_gpus);
    }
    free(ranks);
}

/* The coordinates column: (pp,dp,tp), as without context parallelism, when cp = 1;
 * (pp,dp,cp,tp) otherwise. */
static void format_coords(ts_coords c, bool with_cp, char *buf, size_t cap)
{
    if (with_cp)
        snprintf(buf, cap, "(%d,%d,%d,%d)", c.pp, c.dp, c.cp, c.tp);
    else
        snprintf(buf, cap, "(%d,%d,%d)", c.pp, c.dp, c.tp);
}

static void print_ranks(const ts_topology *t, const rank_row *rows)
{
    const bool with_cp = t->grid.size[TS_AXIS_CP] > 1;
    const char *coords_title = with_cp ? "(pp,dp,cp,tp)" : "(pp,dp,tp)";
    int n = t->world_size, wh = 4, wc = 5, wx = (int)strlen(coords_title);
    char coords[48];
    for (int i = 0; i < n; i++) {
        wh = max_int(wh, (int)strlen(rows[i].host));
        wc = max_int(wc, (int)strlen(rows[i].cores));
        format_coords(rows[i].coords, with_cp, coords, sizeof coords);
        wx = max_int(wx, (int)strlen(coords));
    }
    printf("\n%-4s  %-*s  %-4s  %-5s  %-*s  %-*s  %7s  %-9s  %s\n", "rank", wh, "host", "node",
           "local", wx, coords_title, wc, "cores", "threads", "binding", "gpu");
    for (int i = 0; i < n; i++) {
        const rank_row *r = &rows[i];
        char gpu[160];
        format_coords(r->coords, with_cp, coords, sizeof coords);
        if (r->gpu_cuda)
            snprintf(gpu, sizeof gpu, "%d %s %s", r->gpu, r->gpu_pci, r->gpu_name);
        else if (r->cuda_devices < 0)
            snprintf(gpu, sizeof gpu, "no CUDA devices (built without CUDA)");
        else
            snprintf(gpu, sizeof gpu, "no CUDA devices");
        printf("%-4d  %-*s  %-4d  %-5d  %-*s  %-*s  %7d  %-9s  %s\n", r->rank, wh, r->host,
               r->node, r->local_rank, wx, coords, wc, r->cores, r->threads, r->binding, gpu);
    }
}

/* Every group along `axis` once (from its first member), as {a,b,...}. */
static void print_groups(const ts_grid *g, ts_axis axis, const char *what)
{
    int size = g->size[axis];
    int *members = ts_malloc(sizeof(int) * (size_t)size);
    char list[256];
    printf("  %-16s (%s=%d):", what, ts_axis_name(axis), size);
    for (int r = 0; r < g->world; r++) {
        ts_grid_group(g, r, axis, members);
        if (members[0] == r) printf(" {%s}", ts_format_int_list(members, size, list, sizeof list));
    }
    printf("\n");
    free(members);
}

/* Every replica group (same pp and tp: the ranks holding the same weights) once, as
 * {a,b,...} in the group's order (dp * cp + cp). */
static void print_replica_groups(const ts_grid *g)
{
    int dp = g->size[TS_AXIS_DP], cp = g->size[TS_AXIS_CP];
    int *members = ts_malloc(sizeof(int) * (size_t)(dp * cp));
    char list[256];
    printf("  %-16s (dp*cp=%d):", "replica", dp * cp);
    for (int r = 0; r < g->world; r++) {
        int n = ts_grid_replica_group(g, r, members);
        if (members[0] == r) printf(" {%s}", ts_format_int_list(members, n, list, sizeof list));
    }
    printf("\n");
    free(members);
}

/* The expert grid's groups along `axis` (topology/expert_grid.h), each once. */
static void print_expert_groups(const ts_topology *t, ts_expert_axis axis, const char *what)
{
    const ts_expert_grid eg = { .etp = t->expert[0], .ep = t->expert[1], .edp = t->expert[2] };
    int *members = ts_malloc(sizeof(int) * (size_t)t->grid.world);
    char list[256];
    int n = 0;
    for (int r = 0; r < t->grid.world; r++) {
        n = ts_expert_grid_group(&eg, &t->grid, r, axis, members);
        if (r == 0) printf("  %-16s (%s=%d):", what, ts_expert_axis_name(axis), n);
        if (members[0] == r) printf(" {%s}", ts_format_int_list(members, n, list, sizeof list));
    }
    printf("\n");
    free(members);
}

static void print_report(const ts_topology *t, const ts_config *cfg, const rank_row *rows)
{
    const ts_grid *g = &t->grid;
    const bool with_cp = g->size[TS_AXIS_CP] > 1;
    char cp_size[24] = "";
    if (with_cp) snprintf(cp_size, sizeof cp_size, " cp=%d", g->size[TS_AXIS_CP]);
    printf("tessera topo: %d rank%s on %d node%s%s, grid pp=%d dp=%d%s tp=%d, order %s\n",
           t->world_size, t->world_size == 1 ? "" : "s", t->n_nodes, t->n_nodes == 1 ? "" : "s",
           t->fake_nodes ? " (TS_FAKE_NODES)" : "", g->size[TS_AXIS_PP], g->size[TS_AXIS_DP],
           cp_size, g->size[TS_AXIS_TP], cfg->parallel.order);
    print_nodes(t, rows);
    print_ranks(t, rows);

    printf("\ngroups (global ranks, ordered by the group's coordinate):\n");
    print_groups(g, TS_AXIS_TP, "tensor-parallel");
    if (with_cp) print_groups(g, TS_AXIS_CP, "context-parallel");
    print_groups(g, TS_AXIS_DP, "data-parallel");
    if (with_cp) print_replica_groups(g);
    print_groups(g, TS_AXIS_PP, "pipeline");
    printf("  %-16s (first, last stage):", "embedding");
    int members[2];
    char list[64];
    for (int r = 0; r < g->world; r++) {
        int k = ts_grid_embedding_group(g, r, members);
        if (members[0] == r) printf(" {%s}", ts_format_int_list(members, k, list, sizeof list));
    }
    printf("\n");
    /* An MoE model's expert grid, folded over the same ranks (ARCHITECTURE "The grid"). */
    if (cfg->model.moe_experts > 0 || cfg->parallel.ep * cfg->parallel.etp > 1) {
        print_expert_groups(t, TS_EXPERT_EP, "expert-parallel");
        print_expert_groups(t, TS_EXPERT_ETP, "expert-tensor");
        print_expert_groups(t, TS_EXPERT_EDP, "expert-data");
    }
}

static int run(int argc, char **argv, int rank, int world_size)
{
    /* Without CONFIG the grid is pp=1 x dp=world x tp=1, with a batch that fits it; the
     * user's --set options come after, so they win. */
    char dp_set[64], batch_set[64];
    snprintf(dp_set, sizeof dp_set, "parallel.dp=%d", world_size);
    snprintf(batch_set, sizeof batch_set, "train.global_batch=%d", world_size);
    const char *defaults[3] = { dp_set, "parallel.micro_batch=1", batch_set };
    ts_config cfg;
    int code = ts_cli_load_config(argc, argv, world_size, defaults, 3, false, k_help, &cfg);
    if (code != 0) return code;
    ts_topology t;
    ts_comm world;
    ts_comm_world(&world);
    if (ts_topo_init(&t, &cfg, &world) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&t);
        return 1;
    }
    if (ts_topo_bind(&t, &cfg) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&t);
        return 1;
    }
    ts_cpu_set_threads(t.threads); /* as tessera train runs them */

    rank_row mine = make_row(&t);
    rank_row *rows = rank == 0 ? ts_malloc(sizeof(rank_row) * (size_t)world_size) : NULL;
    ts_gather_bytes(&world, &mine, sizeof mine, rows, 0);
    /* Only rank 0 prints, so only it can see stdout fail; its verdict is every rank's
     * exit code. */
    if (rank == 0) {
        /* The report stays in the buffer until ts_stdout_check flushes it, so a failed
         * write is seen there with its errno (an intermediate flush's errno is lost). */
        static char out_buf[1 << 16];
        setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
        print_report(&t, &cfg, rows);
        if (ts_stdout_check() != TS_OK) {
            ts_log_error("%s", ts_error_message());
            code = 1;
        }
    }
    ts_host_broadcast(&world, &code, sizeof code, 0);
    free(rows);
    ts_topo_free(&t);
    return code;
}

int ts_cmd_topo(int argc, char **argv)
{
    return ts_cli_mpi_main(argc, argv, k_help, run);
}
