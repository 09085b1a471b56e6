/* The communicators ts_topo_init makes (src/topology/topology.c), run under mpirun by
 * test_topology_mpi.sh: on every rank each group's size, this rank's place in it and
 * its members (their world ranks, in group order) are what the pure grid arithmetic
 * (ts_grid_group, ts_grid_replica_group, ts_grid_embedding_group) says: tp, cp, dp and
 * pp ranked by their coordinate, the replica group (same pp and tp) ranked dp * cp + cp,
 * with cp = 1 exactly the dp group, the embedding group {first, last stage}, and the
 * expert grid's ep, etp and edp groups (ts_expert_grid_group) for the given EP and ETP.
 *
 * Usage: mpi_topology PP DP CP TP ORDER [EP ETP]   (world = PP*DP*CP*TP ranks; EP and
 * ETP 1 when not given)
 *        mpi_topology PP DP CP TP ORDER EP ETP [PP DP CP TP ORDER EP ETP ...]
 * several grids of the same world size, one after the other in one launch: each is made,
 * checked and freed as alone (test_topology_mpi.sh checks four 8-rank grids in one
 * mpirun: each launch of 8 ranks on CI's 2 cores cost about as much as its checks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "config/config.h"
#include "test_util.h"
#include "topology/expert_grid.h"
#include "topology/topology.h"

/* The group `c` (named `what`) has exactly `members` in that order and this rank at
 * index `index`. */
static void check_comm(const ts_comm *c, const char *what, const int *members, int n,
                       int index, int rank)
{
    CHECKF(c->size == n, "rank %d: %s group has %d ranks, the grid says %d", rank, what,
           c->size, n);
    CHECKF(c->rank == index, "rank %d: rank %d in its %s group, the grid says %d", rank,
           c->rank, what, index);
    CHECKF(c->name && strcmp(c->name, what) == 0, "rank %d: %s group named \"%s\"", rank, what,
           c->name ? c->name : "(null)");
    if (c->size != n) return;
    int *got = malloc(sizeof(int) * (size_t)n);
    ts_comm_world_ranks(c, got);
    for (int i = 0; i < n; i++)
        CHECKF(got[i] == members[i], "rank %d: %s group member %d is world rank %d, the grid "
               "says %d", rank, what, i, got[i], members[i]);
    free(got);
}

/* One grid: `arg` holds PP DP CP TP ORDER and, when nargs == 7, EP ETP. Makes the topology
 * on `world`, checks every group and frees it. Returns 1 when ts_topo_init refused the
 * grid (said on rank 0), else 0 (the checks count in ts_test_failed / ts_test_passed). */
static int check_grid(ts_comm *world, char **arg, int nargs)
{
    ts_config cfg;
    ts_config_defaults(&cfg);
    cfg.parallel.pp = atoi(arg[0]);
    cfg.parallel.dp = atoi(arg[1]);
    cfg.parallel.cp = atoi(arg[2]);
    cfg.parallel.tp = atoi(arg[3]);
    snprintf(cfg.parallel.order, sizeof cfg.parallel.order, "%s", arg[4]);
    if (nargs == 7) {
        cfg.parallel.ep = atoi(arg[5]);
        cfg.parallel.etp = atoi(arg[6]);
    }

    ts_topology t;
    if (ts_topo_init(&t, &cfg, world) != TS_OK) {
        if (world->rank == 0) fprintf(stderr, "ts_topo_init: %s\n", ts_error_message());
        ts_topo_free(&t);
        return 1;
    }
    const ts_grid *g = &t.grid;
    const int r = t.rank;
    CHECK(g->world == world->size);
    ts_coords c = ts_grid_coords(g, r);
    CHECK(t.coords.pp == c.pp && t.coords.dp == c.dp && t.coords.cp == c.cp &&
          t.coords.tp == c.tp);

    int *members = malloc(sizeof(int) * (size_t)g->world);
    const struct {
        const ts_comm *comm;
        ts_axis axis;
    } axes[] = { { &t.groups.tp, TS_AXIS_TP },
                 { &t.groups.cp, TS_AXIS_CP },
                 { &t.groups.dp, TS_AXIS_DP },
                 { &t.groups.pp, TS_AXIS_PP } };
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++) {
        int n = ts_grid_group(g, r, axes[i].axis, members);
        check_comm(axes[i].comm, ts_axis_name(axes[i].axis), members, n,
                   ts_coords_get(c, axes[i].axis), r);
    }

    int n = ts_grid_replica_group(g, r, members);
    CHECK(n == g->size[TS_AXIS_DP] * g->size[TS_AXIS_CP]);
    check_comm(&t.groups.replica, g->size[TS_AXIS_CP] == 1 ? "dp" : "dp*cp", members, n,
               c.dp * g->size[TS_AXIS_CP] + c.cp, r);
    if (g->size[TS_AXIS_CP] == 1) {
        /* Without context parallelism the replicas are the data-parallel group. */
        int *dp = malloc(sizeof(int) * (size_t)g->size[TS_AXIS_DP]);
        int *rep = malloc(sizeof(int) * (size_t)t.groups.replica.size);
        ts_comm_world_ranks(&t.groups.dp, dp);
        ts_comm_world_ranks(&t.groups.replica, rep);
        CHECK(t.groups.replica.size == t.groups.dp.size &&
              t.groups.replica.rank == t.groups.dp.rank);
        CHECK(memcmp(dp, rep, sizeof(int) * (size_t)t.groups.dp.size) == 0);
        free(rep);
        free(dp);
    }

    int emb[2];
    int n_emb = ts_grid_embedding_group(g, r, emb);
    if (ts_grid_in_embedding_group(g, r))
        check_comm(&t.groups.embed, "embed", emb, n_emb, c.pp == 0 ? 0 : 1, r);
    else
        CHECKF(t.groups.embed.size == 0, "rank %d: in an embedding group of %d", r,
               t.groups.embed.size);
    CHECK(t.pp_prev == ts_grid_pp_prev(g, r) && t.pp_next == ts_grid_pp_next(g, r));

    ts_expert_grid eg;
    CHECK(ts_expert_grid_init(&eg, g, cfg.parallel.ep, cfg.parallel.etp) == TS_OK);
    CHECK(t.expert[0] == eg.etp && t.expert[1] == eg.ep && t.expert[2] == eg.edp);
    const ts_expert_coords ec = ts_expert_grid_coords(&eg, g, r);
    const struct {
        const ts_comm *comm;
        ts_expert_axis axis;
        int coord;
    } experts[] = { { &t.groups.ep, TS_EXPERT_EP, ec.ep },
                    { &t.groups.etp, TS_EXPERT_ETP, ec.etp },
                    { &t.groups.edp, TS_EXPERT_EDP, ec.edp } };
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++) {
        int ne = ts_expert_grid_group(&eg, g, r, experts[i].axis, members);
        check_comm(experts[i].comm, ts_expert_axis_name(experts[i].axis), members, ne,
                   experts[i].coord, r);
    }
    free(members);
    if (t.rank == 0)
        printf("pp=%d dp=%d cp=%d tp=%d %s ep=%d etp=%d: checked\n", g->size[TS_AXIS_PP],
               g->size[TS_AXIS_DP], g->size[TS_AXIS_CP], g->size[TS_AXIS_TP], cfg.parallel.order,
               cfg.parallel.ep, cfg.parallel.etp);
    ts_topo_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    ts_comm_init(&argc, &argv);
    ts_comm world;
    ts_comm_world(&world);
    /* One grid of 5 or 7 words, or several of 7 each. */
    const int per = argc == 6 ? 5 : 7;
    if (argc < 6 || (argc != 6 && (argc - 1) % 7 != 0)) {
        if (world.rank == 0)
            fprintf(stderr, "usage: mpi_topology PP DP CP TP ORDER [EP ETP] [PP DP CP TP ORDER EP ETP ...]\n");
        ts_comm_finalize();
        return 2;
    }
    /* A refused grid is refused on every rank (the same config on the same world): all
     * stop there together. */
    int refused = 0;
    for (int i = 1; i < argc && !refused; i += per) refused = check_grid(&world, argv + i, per);

    int failed = ts_test_failed || refused;
    ts_host_allreduce_max_i32(&world, &failed, 1);
    /* ts_test_report fails rank 0 when no check ran; every other rank likewise. */
    int code = world.rank == 0 ? ts_test_report() : (ts_test_failed != 0 || ts_test_passed == 0);
    ts_comm_finalize();
    return failed ? 1 : code;
}
