/* The groups of the grid (ts_groups) and the node layout. This is the only file that
 * makes groups (ts_comm_split): every other module holds pointers to a ts_topology's. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/env.h"
#include "core/log.h"
#include "topology/expert_grid.h"
#include "topology/topology.h"

/* TS_FAKE_NODES=K: ranks per pretend node; 0 when unset. */
static ts_status fake_nodes_env(int *k)
{
    *k = 0;
    const char *s = ts_env(TS_ENV_FAKE_NODES);
    if (!s) return TS_OK;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 1 || v > INT_MAX)
        return ts_fail("TS_FAKE_NODES = '%s' must be a positive integer (ranks per pretend "
                       "node); unset it to use the real node layout",
                       s);
    *k = (int)v;
    return TS_OK;
}

/* ------------------------------------------------ the groups' makers -- */

/* What a maker needs: the topology so far (grid, rank, coords, the groups made before
 * it in TS_GROUP_LIST order), the config and the caller's world. */
typedef struct {
    ts_topology *t;
    const ts_config *cfg;
    const ts_comm *world;
    int fake_k; /* TS_FAKE_NODES, 0 when unset */
} make_ctx;

/* Split world into the group along `axis` containing this rank, ranked by the axis
 * coordinate. The color is the group's first member, unique per group. */
static void split_axis(const make_ctx *x, ts_axis axis, ts_comm *out)
{
    ts_topology *t = x->t;
    int *members = ts_malloc(sizeof(int) * (size_t)t->grid.size[axis]);
    ts_grid_group(&t->grid, t->rank, axis, members);
    ts_comm_split(&t->groups.world, members[0], ts_coords_get(t->coords, axis),
                  ts_axis_name(axis), out);
    free(members);
}

static void make_world(const make_ctx *x, ts_comm *out)
{
    *out = *x->world;
    out->owned = false;
}

static void make_tp(const make_ctx *x, ts_comm *out) { split_axis(x, TS_AXIS_TP, out); }
static void make_cp(const make_ctx *x, ts_comm *out) { split_axis(x, TS_AXIS_CP, out); }
static void make_dp(const make_ctx *x, ts_comm *out) { split_axis(x, TS_AXIS_DP, out); }
static void make_pp(const make_ctx *x, ts_comm *out) { split_axis(x, TS_AXIS_PP, out); }

/* The replica group (same pp and tp, any dp and cp), ranked dp * cp + cp. The color is
 * its first member, unique per group. With cp = 1: dp's members in dp's order, and its
 * name in messages "dp" (what a user without context parallelism knows it as); "dp*cp"
 * otherwise. */
static void make_replica(const make_ctx *x, ts_comm *out)
{
    ts_topology *t = x->t;
    int n = t->grid.size[TS_AXIS_DP] * t->grid.size[TS_AXIS_CP];
    int *members = ts_malloc(sizeof(int) * (size_t)n);
    ts_grid_replica_group(&t->grid, t->rank, members);
    ts_comm_split(&t->groups.world, members[0], ts_grid_replica_index(&t->grid, t->rank),
                  t->grid.size[TS_AXIS_CP] == 1 ? "dp" : "dp*cp", out);
    free(members);
}

/* Collective over world: ranks outside every embedding group pass color -1 and are in
 * none. Color: the group's first stage (one group per dp, cp and tp coordinate); key:
 * the pipeline coordinate. */
static void make_embed(const make_ctx *x, ts_comm *out)
{
    ts_topology *t = x->t;
    bool in_embed = ts_grid_in_embedding_group(&t->grid, t->rank);
    ts_comm_split(&t->groups.world, in_embed ? t->embed_members[0] : -1, t->coords.pp, "embed",
                  out);
}

/* Within the tp group: color = which key/value head part the rank holds. */
static void make_kv(const make_ctx *x, ts_comm *out)
{
    ts_topology *t = x->t;
    const int tp = x->cfg->parallel.tp, kv_heads = ts_model_kv_heads(&x->cfg->model);
    const int kv_replicas = tp > kv_heads ? tp / kv_heads : 1;
    ts_comm_split(&t->groups.tp, t->coords.tp / kv_replicas, t->coords.tp, "kv", out);
}

/* The expert grid's groups (expert_grid.c): split world by the group's first member,
 * ranked by the coordinate on its axis. */
static void split_expert(const make_ctx *x, ts_expert_axis axis, ts_comm *out)
{
    ts_topology *t = x->t;
    const ts_expert_grid eg = { .etp = t->expert[0], .ep = t->expert[1], .edp = t->expert[2] };
    int *members = ts_malloc(sizeof(int) * (size_t)t->grid.world);
    ts_expert_grid_group(&eg, &t->grid, t->rank, axis, members);
    const ts_expert_coords c = ts_expert_grid_coords(&eg, &t->grid, t->rank);
    const int key = axis == TS_EXPERT_ETP ? c.etp : axis == TS_EXPERT_EP ? c.ep : c.edp;
    ts_comm_split(&t->groups.world, members[0], key, ts_expert_axis_name(axis), out);
    free(members);
}

static void make_ep(const make_ctx *x, ts_comm *out) { split_expert(x, TS_EXPERT_EP, out); }
static void make_etp(const make_ctx *x, ts_comm *out) { split_expert(x, TS_EXPERT_ETP, out); }
static void make_edp(const make_ctx *x, ts_comm *out) { split_expert(x, TS_EXPERT_EDP, out); }

/* MPI's shared-memory split, or the pretend layout of TS_FAKE_NODES. */
static void make_node(const make_ctx *x, ts_comm *out)
{
    ts_topology *t = x->t;
    if (x->fake_k > 0)
        ts_comm_split(&t->groups.world, t->rank / x->fake_k, t->rank, "node", out);
    else
        ts_comm_split_node(&t->groups.world, t->rank, "node", out);
}

typedef void (*make_fn)(const make_ctx *x, ts_comm *out);
static const make_fn group_makers[TS_N_GROUPS] = {
#define TS_GROUP_MAKER(name, memory) make_##name,
    TS_GROUP_LIST(TS_GROUP_MAKER)
#undef TS_GROUP_MAKER
};
static const size_t group_offsets[TS_N_GROUPS] = {
#define TS_GROUP_OFFSET(name, memory) offsetof(ts_groups, name),
    TS_GROUP_LIST(TS_GROUP_OFFSET)
#undef TS_GROUP_OFFSET
};
static const ts_group_memory group_memory[TS_N_GROUPS] = {
#define TS_GROUP_MEMORY(name, memory) memory,
    TS_GROUP_LIST(TS_GROUP_MEMORY)
#undef TS_GROUP_MEMORY
};

_Static_assert(sizeof(ts_groups) == TS_N_GROUPS * sizeof(ts_comm),
               "ts_groups holds exactly the groups of TS_GROUP_LIST");

ts_comm *ts_groups_at(ts_groups *g, int i)
{
    TS_ASSERT(i >= 0 && i < TS_N_GROUPS);
    return (ts_comm *)((char *)g + group_offsets[i]);
}

ts_group_memory ts_group_memory_of(int i)
{
    TS_ASSERT(i >= 0 && i < TS_N_GROUPS);
    return group_memory[i];
}

/* ----------------------------------------------------------- the nodes -- */

/* Which ranks share a node (groups.node, made before): numbers the nodes by their
 * lowest world rank and learns every rank's node and every node's host. */
static void discover_nodes(ts_topology *t, int fake_k)
{
    if (fake_k > 0)
        snprintf(t->host, sizeof t->host, "fakenode%d", t->rank / fake_k);
    else
        ts_comm_host_name(t->host, sizeof t->host);
    t->local_rank = t->groups.node.rank;
    t->local_size = t->groups.node.size;

    /* The node's leader is its lowest world rank (local rank 0: the key was the rank). */
    int leader = t->rank;
    ts_host_broadcast(&t->groups.node, &leader, sizeof leader, 0);
    int n = t->world_size;
    int *leaders = ts_malloc(sizeof(int) * (size_t)n);
    ts_allgather_bytes(&t->groups.world, &leader, sizeof leader, leaders);
    char(*hosts)[TS_HOST_MAX] = ts_malloc((size_t)n * TS_HOST_MAX);
    ts_allgather_bytes(&t->groups.world, t->host, TS_HOST_MAX, hosts);

    /* Leaders in rank order get node indices 0, 1, ...; others take their leader's. */
    int *index = ts_malloc(sizeof(int) * (size_t)n);
    t->n_nodes = 0;
    for (int r = 0; r < n; r++) index[r] = leaders[r] == r ? t->n_nodes++ : -1;
    t->node_of_rank = ts_malloc(sizeof(int) * (size_t)n);
    t->node_host = ts_malloc((size_t)t->n_nodes * TS_HOST_MAX);
    for (int r = 0; r < n; r++) {
        t->node_of_rank[r] = index[leaders[r]];
        if (leaders[r] == r) memcpy(t->node_host[index[r]], hosts[r], TS_HOST_MAX);
    }
    t->node = t->node_of_rank[t->rank];
    free(index);
    free(hosts);
    free(leaders);
}

/* Number of distinct nodes among `members`; their indices go to nodes[] in first-seen
 * order. */
static int distinct_nodes(const ts_topology *t, const int *members, int n, int *nodes)
{
    int count = 0;
    for (int i = 0; i < n; i++) {
        int node = t->node_of_rank[members[i]], seen = 0;
        for (int j = 0; j < count && !seen; j++) seen = nodes[j] == node;
        if (!seen) nodes[count++] = node;
    }
    return count;
}

/* A tensor-parallel group all-reduces every layer: it belongs inside one node. Every
 * rank learns whether its own group spans nodes; rank 0 warns once for the job. */
static void check_tp_locality(ts_topology *t)
{
    const ts_grid *g = &t->grid;
    int tp = g->size[TS_AXIS_TP];
    int *members = ts_malloc(sizeof(int) * (size_t)tp);
    int *nodes = ts_malloc(sizeof(int) * (size_t)tp);
    ts_grid_group(g, t->rank, TS_AXIS_TP, members);
    t->tp_nodes = distinct_nodes(t, members, tp, nodes);

    if (t->rank == 0) {
        int first = -1, n_bad = 0, n_groups = 0;
        for (int r = 0; r < g->world; r++) {
            ts_grid_group(g, r, TS_AXIS_TP, members);
            if (members[0] != r) continue; /* each group once, from its first member */
            n_groups++;
            if (distinct_nodes(t, members, tp, nodes) > 1 && n_bad++ == 0) first = r;
        }
        if (n_bad > 0) {
            ts_grid_group(g, first, TS_AXIS_TP, members);
            int n_nodes = distinct_nodes(t, members, tp, nodes);
            char ranks[128], names[256] = "";
            size_t len = 0;
            for (int i = 0; i < n_nodes && len + 1 < sizeof names; i++) {
                int w = snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                 t->node_host[nodes[i]]);
                if (w < 0) break;
                len += (size_t)w;
            }
            char more[96] = "";
            if (n_bad > 1)
                snprintf(more, sizeof more, " (%d of the %d tensor-parallel groups span nodes)",
                         n_bad, n_groups);
            ts_log_warn("tensor-parallel group {ranks %s} spans %d nodes (%s): tp all-reduces "
                        "will cross the network; use parallel.order = \"tp-dp-pp\" and tp <= "
                        "ranks per node%s",
                        ts_format_int_list(members, tp, ranks, sizeof ranks), n_nodes, names,
                        more);
        }
    }
    free(nodes);
    free(members);
}

ts_status ts_topo_init(ts_topology *t, const ts_config *cfg, const ts_comm *world)
{
    memset(t, 0, sizeof *t); /* every group not a member (size 0) until made */
    t->gpu = -1;
    snprintf(t->binding, sizeof t->binding, "none");
    snprintf(t->gpu_name, sizeof t->gpu_name, "none");
    t->rank = world->rank;
    t->world_size = world->size;

    /* Every check before the first split, agreed: a rank that alone sees a problem
     * (its environment differs) fails every rank instead of leaving them in a split. */
    const ts_parallel_config *p = &cfg->parallel;
    int fake_k = 0;
    ts_status st = ts_grid_init4(&t->grid, p->pp, p->dp, p->cp, p->tp, p->order);
    if (st == TS_OK && t->grid.world != t->world_size) /* all four axes, cp = 1 too */
        st = ts_fail("the grid pp*dp*cp*tp = %d*%d*%d*%d = %d does not match the %d ranks "
                     "launched; launch with mpirun -np %d or change parallel.pp/dp/cp/tp",
                     p->pp, p->dp, p->cp, p->tp, t->grid.world, t->world_size,
                     t->grid.world);
    ts_expert_grid eg = { 1, 1, 1 };
    if (st == TS_OK) st = ts_expert_grid_init(&eg, &t->grid, p->ep, p->etp);
    if (st == TS_OK) st = fake_nodes_env(&fake_k);
    if (ts_comm_agree(world, st) != TS_OK) return TS_ERR;
    /* Every rank must pretend the same layout: set on some ranks only (an environment
     * that did not reach them all), the node splits would disagree and hang. */
    int lo = fake_k, hi = fake_k;
    ts_host_allreduce_min_i32(world, &lo, 1);
    ts_host_allreduce_max_i32(world, &hi, 1);
    if (lo != hi)
        return ts_comm_agree(world,
                             ts_fail("TS_FAKE_NODES differs between ranks (from %d to %d; 0 = "
                                     "unset): set it for every rank (mpirun -x TS_FAKE_NODES) "
                                     "or for none",
                                     lo, hi));
    t->fake_nodes = fake_k > 0;
    t->expert[0] = eg.etp;
    t->expert[1] = eg.ep;
    t->expert[2] = eg.edp;

    t->coords = ts_grid_coords(&t->grid, t->rank);
    t->pp_prev = ts_grid_pp_prev(&t->grid, t->rank);
    t->pp_next = ts_grid_pp_next(&t->grid, t->rank);
    t->n_embed = ts_grid_embedding_group(&t->grid, t->rank, t->embed_members);
    /* The groups, in TS_GROUP_LIST order on every rank (each split is collective). */
    const make_ctx x = {t, cfg, world, fake_k};
    for (int i = 0; i < TS_N_GROUPS; i++) group_makers[i](&x, ts_groups_at(&t->groups, i));

    discover_nodes(t, fake_k);
    check_tp_locality(t);
    return TS_OK;
}

void ts_topo_free(ts_topology *t)
{
    /* ts_comm_free detaches a data-plane backend moved onto a group (the trainer's) and
     * releases the groups made by splits; world is the caller's (not owned). */
    for (int i = 0; i < TS_N_GROUPS; i++) ts_comm_free(ts_groups_at(&t->groups, i));
    free(t->node_of_rank);
    free(t->node_host);
    t->node_of_rank = NULL;
    t->node_host = NULL;
}
