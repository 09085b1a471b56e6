/* The pure rank arithmetic of the grid (src/topology/grid.c), for every grid of up to
 * 16 ranks in every one of the 24 four-name orders and the 6 three-name ones (which put
 * cp right after tp). No MPI. */
#include <string.h>

#include "test_util.h"
#include "topology/topology.h"

#define N_ORDERS3 6
#define N_ORDERS4 24

static const char *const k_orders3[N_ORDERS3] = { "tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                                  "dp-pp-tp", "pp-tp-dp", "pp-dp-tp" };
/* The same orders with cp written out where a three-name order puts it. */
static const char *const k_orders3_as4[N_ORDERS3] = { "tp-cp-dp-pp", "tp-cp-pp-dp",
                                                      "dp-tp-cp-pp", "dp-pp-tp-cp",
                                                      "pp-tp-cp-dp", "pp-dp-tp-cp" };

/* Every permutation of tp, cp, dp, pp, "tp-cp-dp-pp" (Megatron's) first. */
static char k_orders4[N_ORDERS4][12];

static void make_orders4(void)
{
    const int n = ts_test_grid_orders(k_orders4);
    CHECK(n == N_ORDERS4 && strcmp(k_orders4[0], "tp-cp-dp-pp") == 0);
}

/* Does r lie in the group along `axis` of a rank at b (all other coordinates equal)? */
static int same_except(ts_coords a, ts_coords b, ts_axis axis)
{
    for (int x = 0; x < TS_N_AXES; x++)
        if (x != (int)axis && ts_coords_get(a, (ts_axis)x) != ts_coords_get(b, (ts_axis)x))
            return 0;
    return 1;
}

/* rank -> coords -> rank is the identity and every coordinate quadruple is hit once. */
static void test_grid_bijection(const ts_grid *g, const char *what)
{
    int seen[16];
    memset(seen, 0, sizeof seen);
    int pp = g->size[TS_AXIS_PP], dp = g->size[TS_AXIS_DP], cp = g->size[TS_AXIS_CP],
        tp = g->size[TS_AXIS_TP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int ok = c.pp >= 0 && c.pp < pp && c.dp >= 0 && c.dp < dp && c.cp >= 0 && c.cp < cp &&
                 c.tp >= 0 && c.tp < tp;
        CHECKF(ok, "%s rank %d -> (%d,%d,%d,%d) out of range", what, r, c.pp, c.dp, c.cp, c.tp);
        if (!ok) continue;
        CHECKF(ts_grid_rank(g, c) == r, "%s rank %d round trip", what, r);
        seen[((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp]++;
    }
    for (int i = 0; i < g->world; i++)
        CHECKF(seen[i] == 1, "%s coords %d hit %d times", what, i, seen[i]);
}

/* The fastest axis moves by one rank, each next one by the product of those before. */
static void test_grid_strides(const ts_grid *g, const char *order, const char *what)
{
    ts_axis ax[TS_N_AXES];
    CHECK(ts_grid_parse_order(order, ax) == TS_OK);
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int expect = 0;
        for (int i = TS_N_AXES - 1; i >= 0; i--)
            expect = expect * g->size[ax[i]] + ts_coords_get(c, ax[i]);
        CHECKF(expect == r, "%s rank %d expected %d from the order formula", what, r, expect);
    }
}

/* Megatron's tp-cp-dp-pp (and so tp-dp-pp): global = tp + TP*(cp + CP*(dp + DP*pp)). */
static void test_grid_megatron_formula(const ts_grid *g, const char *what)
{
    int tp = g->size[TS_AXIS_TP], cp = g->size[TS_AXIS_CP], dp = g->size[TS_AXIS_DP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        CHECKF(c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp)) == r, "%s rank %d megatron", what,
               r);
    }
}

static void test_grid_groups(const ts_grid *g, const char *what)
{
    int members[16];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        for (int a = 0; a < TS_N_AXES; a++) {
            ts_axis axis = (ts_axis)a;
            int n = ts_grid_group(g, r, axis, members);
            CHECKF(n == g->size[axis], "%s rank %d %s group size %d", what, r,
                   ts_axis_name(axis), n);
            int found_self = 0;
            for (int k = 0; k < n; k++) {
                ts_coords m = ts_grid_coords(g, members[k]);
                CHECKF(same_except(m, c, axis), "%s rank %d %s member %d differs elsewhere",
                       what, r, ts_axis_name(axis), members[k]);
                CHECKF(ts_coords_get(m, axis) == k, "%s rank %d %s member %d at index %d", what,
                       r, ts_axis_name(axis), members[k], k);
                found_self += members[k] == r;
            }
            CHECKF(found_self == 1, "%s rank %d not once in its %s group", what, r,
                   ts_axis_name(axis));
            /* The group is exactly the ranks that agree on the other three coordinates. */
            int count = 0;
            for (int q = 0; q < g->world; q++) count += same_except(ts_grid_coords(g, q), c, axis);
            CHECKF(count == n, "%s rank %d %s group misses members", what, r, ts_axis_name(axis));
        }
    }
}

/* The replica group: the ranks with rank's pp and tp, member (dp, cp) at dp * CP + cp;
 * with cp = 1 exactly the dp group. */
static void test_grid_replicas(const ts_grid *g, const char *what)
{
    int members[16], dp_members[16];
    int dp = g->size[TS_AXIS_DP], cp = g->size[TS_AXIS_CP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int n = ts_grid_replica_group(g, r, members);
        CHECKF(n == dp * cp, "%s rank %d replica group size %d", what, r, n);
        CHECKF(ts_grid_replica_index(g, r) == c.dp * cp + c.cp, "%s rank %d replica index",
               what, r);
        int found_self = 0;
        for (int k = 0; k < n; k++) {
            ts_coords m = ts_grid_coords(g, members[k]);
            CHECKF(m.pp == c.pp && m.tp == c.tp, "%s rank %d replica member %d: other weights",
                   what, r, members[k]);
            CHECKF(m.dp * cp + m.cp == k, "%s rank %d replica member %d at index %d", what, r,
                   members[k], k);
            CHECKF(ts_grid_replica_index(g, members[k]) == k, "%s rank %d replica index of %d",
                   what, r, members[k]);
            found_self += members[k] == r;
        }
        CHECKF(found_self == 1, "%s rank %d not once in its replica group", what, r);
        if (cp == 1) {
            ts_grid_group(g, r, TS_AXIS_DP, dp_members);
            CHECKF(memcmp(members, dp_members, sizeof(int) * (size_t)dp) == 0,
                   "%s rank %d replica group is not the dp group with cp = 1", what, r);
        }
    }
}

static void test_grid_pipeline_neighbours(const ts_grid *g, const char *what)
{
    int pp = g->size[TS_AXIS_PP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int prev = ts_grid_pp_prev(g, r), next = ts_grid_pp_next(g, r);
        if (c.pp == 0) {
            CHECKF(prev == -1, "%s rank %d first stage has prev %d", what, r, prev);
        } else {
            ts_coords e = c;
            e.pp--;
            CHECKF(prev == ts_grid_rank(g, e), "%s rank %d prev %d", what, r, prev);
        }
        if (c.pp == pp - 1) {
            CHECKF(next == -1, "%s rank %d last stage has next %d", what, r, next);
        } else {
            ts_coords e = c;
            e.pp++;
            CHECKF(next == ts_grid_rank(g, e), "%s rank %d next %d", what, r, next);
        }
    }
}

/* {first stage, last stage} with rank's dp, cp and tp. */
static void test_grid_embedding(const ts_grid *g, const char *what)
{
    int pp = g->size[TS_AXIS_PP], members[2];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int n = ts_grid_embedding_group(g, r, members);
        ts_coords first = c, last = c;
        first.pp = 0;
        last.pp = pp - 1;
        CHECKF(n == (pp == 1 ? 1 : 2), "%s rank %d embedding size %d", what, r, n);
        CHECKF(members[0] == ts_grid_rank(g, first), "%s rank %d embedding first", what, r);
        if (n == 2)
            CHECKF(members[1] == ts_grid_rank(g, last), "%s rank %d embedding last", what, r);
        int member = c.pp == 0 || c.pp == pp - 1;
        CHECKF(ts_grid_in_embedding_group(g, r) == member, "%s rank %d in embedding", what, r);
    }
}

static void check_grid(const ts_grid *g, const char *order, int megatron, const char *what)
{
    test_grid_bijection(g, what);
    test_grid_strides(g, order, what);
    if (megatron) test_grid_megatron_formula(g, what);
    test_grid_groups(g, what);
    test_grid_replicas(g, what);
    test_grid_pipeline_neighbours(g, what);
    test_grid_embedding(g, what);
}

/* Every pp x dp x cp x tp grid of up to 16 ranks, every order of either form. */
static void test_grid_all_shapes(void)
{
    int grids = 0;
    for (int pp = 1; pp <= 16; pp++)
        for (int dp = 1; pp * dp <= 16; dp++)
            for (int cp = 1; pp * dp * cp <= 16; cp++)
                for (int tp = 1; pp * dp * cp * tp <= 16; tp++)
                    for (int o = 0; o < N_ORDERS4 + N_ORDERS3; o++) {
                        const char *order =
                            o < N_ORDERS4 ? k_orders4[o] : k_orders3[o - N_ORDERS4];
                        char what[80];
                        snprintf(what, sizeof what, "pp=%d dp=%d cp=%d tp=%d %s", pp, dp, cp,
                                 tp, order);
                        ts_grid g;
                        CHECKF(ts_grid_init4(&g, pp, dp, cp, tp, order) == TS_OK, "%s: %s",
                               what, ts_error_message());
                        CHECK(g.world == pp * dp * cp * tp);
                        check_grid(&g, order, o == 0 || o == N_ORDERS4, what);
                        grids++;
                    }
    printf("checked %d grids\n", grids);
}

/* A three-name order is the four-name one with cp right after tp: same parse, same grid
 * for every shape (cp > 1 included). */
static void test_grid_three_name_orders(void)
{
    for (int o = 0; o < N_ORDERS3; o++) {
        ts_axis a3[TS_N_AXES], a4[TS_N_AXES];
        CHECK(ts_grid_parse_order(k_orders3[o], a3) == TS_OK);
        CHECK(ts_grid_parse_order(k_orders3_as4[o], a4) == TS_OK);
        CHECKF(memcmp(a3, a4, sizeof a3) == 0, "\"%s\" is not \"%s\"", k_orders3[o],
               k_orders3_as4[o]);
        int t = 0;
        while (t < TS_N_AXES && a3[t] != TS_AXIS_TP) t++;
        CHECKF(t + 1 < TS_N_AXES && a3[t + 1] == TS_AXIS_CP, "\"%s\": cp not after tp",
               k_orders3[o]);
        static const int shapes[][4] = { { 2, 2, 2, 2 }, { 1, 3, 2, 2 }, { 2, 1, 4, 2 },
                                         { 3, 2, 2, 1 } };
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int *z = shapes[s];
            ts_grid g3, g4;
            CHECK(ts_grid_init4(&g3, z[0], z[1], z[2], z[3], k_orders3[o]) == TS_OK);
            CHECK(ts_grid_init4(&g4, z[0], z[1], z[2], z[3], k_orders3_as4[o]) == TS_OK);
            CHECKF(memcmp(&g3, &g4, sizeof g3) == 0, "\"%s\" grid %d differs from \"%s\"",
                   k_orders3[o], (int)s, k_orders3_as4[o]);
        }
    }
}

/* cp = 1 is the three-axis grid of before cp: rank = a + A*(b + B*c) for the order
 * "a-b-c" over tp, dp, pp; a four-name order with cp anywhere gives the same ranks as
 * its three-name order. */
static void test_grid_cp1_unchanged(void)
{
    for (int pp = 1; pp <= 4; pp++)
        for (int dp = 1; dp <= 4; dp++)
            for (int tp = 1; tp <= 4; tp++)
                for (int o = 0; o < N_ORDERS3; o++) {
                    const char *s = k_orders3[o];
                    ts_grid g;
                    CHECK(ts_grid_init4(&g, pp, dp, 1, tp, s) == TS_OK);
                    CHECK(g.world == pp * dp * tp && g.size[TS_AXIS_CP] == 1);
                    int size[3], axis[3];
                    for (int i = 0; i < 3; i++) {
                        const char *name = s + 3 * i;
                        axis[i] = name[0] == 't' ? TS_AXIS_TP
                                  : name[0] == 'd' ? TS_AXIS_DP
                                                   : TS_AXIS_PP;
                        size[i] = axis[i] == TS_AXIS_TP ? tp : axis[i] == TS_AXIS_DP ? dp : pp;
                    }
                    /* cp written in at every place of the three names. */
                    ts_grid gc[4];
                    for (int k = 0; k < 4; k++) {
                        char s4[12];
                        int len = 0;
                        for (int i = 0; i <= 3; i++) {
                            const char *name = i == k ? "cp" : s + 3 * (i - (i > k));
                            len += snprintf(s4 + len, sizeof s4 - (size_t)len, "%s%.2s",
                                            i ? "-" : "", name);
                        }
                        CHECKF(ts_grid_init4(&gc[k], pp, dp, 1, tp, s4) == TS_OK, "%s", s4);
                    }
                    for (int r = 0; r < g.world; r++) {
                        ts_coords c = ts_grid_coords(&g, r);
                        int want = ts_coords_get(c, (ts_axis)axis[0]) +
                                   size[0] * (ts_coords_get(c, (ts_axis)axis[1]) +
                                              size[1] * ts_coords_get(c, (ts_axis)axis[2]));
                        CHECKF(c.cp == 0 && want == r, "%s pp=%d dp=%d tp=%d rank %d", s, pp,
                               dp, tp, r);
                        for (int k = 0; k < 4; k++)
                            CHECKF(ts_grid_rank(&gc[k], c) == r, "%s cp at %d rank %d", s, k,
                                   r);
                    }
                }
}

/* A worked example: pp=2 dp=2 tp=2 in tp-dp-pp, as in docs/ARCHITECTURE.md "The grid". */
static void test_grid_example_2x2x2(void)
{
    ts_grid g;
    CHECK(ts_grid_init4(&g, 2, 2, 1, 2, "tp-dp-pp") == TS_OK);
    ts_coords c = ts_grid_coords(&g, 5);
    CHECK(c.pp == 1 && c.dp == 0 && c.tp == 1 && c.cp == 0);
    int m[2];
    ts_grid_group(&g, 5, TS_AXIS_TP, m);
    CHECK(m[0] == 4 && m[1] == 5);
    ts_grid_group(&g, 5, TS_AXIS_DP, m);
    CHECK(m[0] == 5 && m[1] == 7);
    ts_grid_group(&g, 5, TS_AXIS_PP, m);
    CHECK(m[0] == 1 && m[1] == 5);
    CHECK(ts_grid_group(&g, 5, TS_AXIS_CP, m) == 1 && m[0] == 5);
    CHECK(ts_grid_replica_group(&g, 5, m) == 2 && m[0] == 5 && m[1] == 7);
    CHECK(ts_grid_pp_prev(&g, 5) == 1 && ts_grid_pp_next(&g, 5) == -1);
    CHECK(ts_grid_embedding_group(&g, 5, m) == 2 && m[0] == 1 && m[1] == 5);
}

/* With cp: pp=1 dp=2 cp=2 tp=2 in tp-dp-pp (= tp-cp-dp-pp), as in docs/ARCHITECTURE.md
 * and tests/test_topology_mpi.sh: rank = tp + 2*(cp + 2*dp). */
static void test_grid_example_cp(void)
{
    ts_grid g;
    CHECK(ts_grid_init4(&g, 1, 2, 2, 2, "tp-dp-pp") == TS_OK);
    CHECK(g.world == 8);
    ts_coords c = ts_grid_coords(&g, 6);
    CHECK(c.pp == 0 && c.dp == 1 && c.cp == 1 && c.tp == 0);
    int m[4];
    CHECK(ts_grid_group(&g, 6, TS_AXIS_TP, m) == 2 && m[0] == 6 && m[1] == 7);
    CHECK(ts_grid_group(&g, 6, TS_AXIS_CP, m) == 2 && m[0] == 4 && m[1] == 6);
    CHECK(ts_grid_group(&g, 6, TS_AXIS_DP, m) == 2 && m[0] == 2 && m[1] == 6);
    CHECK(ts_grid_group(&g, 6, TS_AXIS_PP, m) == 1 && m[0] == 6);
    CHECK(ts_grid_replica_group(&g, 6, m) == 4 && m[0] == 0 && m[1] == 2 && m[2] == 4 &&
          m[3] == 6);
    CHECK(ts_grid_replica_index(&g, 6) == 3);
    CHECK(ts_grid_replica_group(&g, 3, m) == 4 && m[0] == 1 && m[1] == 3 && m[2] == 5 &&
          m[3] == 7);
    CHECK(ts_grid_replica_index(&g, 3) == 1);

    /* cp slower than dp: the replica group (dp-major) is not in rank order. */
    CHECK(ts_grid_init4(&g, 2, 2, 2, 1, "tp-dp-cp-pp") == TS_OK);
    c = ts_grid_coords(&g, 5); /* 5 = dp + 2*(cp + 2*pp): dp 1, cp 0, pp 1 */
    CHECK(c.pp == 1 && c.dp == 1 && c.cp == 0 && c.tp == 0);
    CHECK(ts_grid_group(&g, 5, TS_AXIS_CP, m) == 2 && m[0] == 5 && m[1] == 7);
    CHECK(ts_grid_replica_group(&g, 5, m) == 4 && m[0] == 4 && m[1] == 6 && m[2] == 5 &&
          m[3] == 7);
    CHECK(ts_grid_embedding_group(&g, 5, m) == 2 && m[0] == 1 && m[1] == 5);
}

static void test_grid_bad_orders(void)
{
    static const char *const bad[] = {
        "",            "tp-dp",        "tp-dp-pp-",   "tp-tp-pp",    "pp-dp-dp",
        "tp_dp_pp",    "TP-DP-PP",     "tp-dp-xx",    "tp-dp-p",     "tpdppp",
        "dp-tp-pp ",   "tp--dp-pp",    "tp-cp-dp",    "tp-cp-cp-pp", "cp-dp-pp",
        "tp-cp-dp-dp", "tp-cp-dp-pp-", "tp-cp-dp-p",  "tp-cp-dp-xx", "tp_cp_dp_pp",
        "tpcpdppp",    "TP-CP-DP-PP",  "tp-cp-dp-pp-tp", "tp-cp--dp-pp", "cp-cp-cp-cp"
    };
    ts_axis order[TS_N_AXES];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_error_clear();
        CHECKF(ts_grid_parse_order(bad[i], order) == TS_ERR, "order \"%s\" accepted", bad[i]);
        CHECKF(strstr(ts_error_message(), "tp, cp, dp and pp") != NULL &&
                   strstr(ts_error_message(), "\"tp-cp-dp-pp\"") != NULL,
               "order \"%s\": %s", bad[i], ts_error_message());
    }
    CHECK(ts_grid_parse_order(NULL, order) == TS_ERR);
    ts_grid g;
    CHECK(ts_grid_init4(&g, 2, 2, 1, 2, "tp-tp-pp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 2, 2, 2, 2, "tp-cp-dp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 0, 2, 1, 2, "tp-dp-pp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 2, -1, 1, 2, "tp-dp-pp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 2, 2, 0, 2, "tp-cp-dp-pp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 65536, 65536, 2, 1, "tp-cp-dp-pp") == TS_ERR);
    CHECK(ts_grid_init4(&g, 0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff, "tp-dp-pp") ==
          TS_ERR);
    for (int o = 0; o < N_ORDERS3; o++) CHECK(ts_grid_parse_order(k_orders3[o], order) == TS_OK);
    for (int o = 0; o < N_ORDERS4; o++) CHECK(ts_grid_parse_order(k_orders4[o], order) == TS_OK);
    CHECK(ts_grid_parse_order("dp-pp-tp", order) == TS_OK && order[0] == TS_AXIS_DP &&
          order[1] == TS_AXIS_PP && order[2] == TS_AXIS_TP && order[3] == TS_AXIS_CP);
    CHECK(ts_grid_parse_order("cp-pp-tp-dp", order) == TS_OK && order[0] == TS_AXIS_CP &&
          order[1] == TS_AXIS_PP && order[2] == TS_AXIS_TP && order[3] == TS_AXIS_DP);
    CHECK(strcmp(ts_axis_name(TS_AXIS_CP), "cp") == 0);
}

static void test_format_int_list(void)
{
    char buf[64];
    int a[] = { 0, 1, 2, 3 }, b[] = { 0, 2 }, c[] = { 0, 1, 2, 3, 6, 8, 9 }, d[] = { 5 };
    CHECK(!strcmp(ts_format_int_list(a, 4, buf, sizeof buf), "0-3"));
    CHECK(!strcmp(ts_format_int_list(b, 2, buf, sizeof buf), "0,2"));
    CHECK(!strcmp(ts_format_int_list(c, 7, buf, sizeof buf), "0-3,6,8-9"));
    CHECK(!strcmp(ts_format_int_list(d, 1, buf, sizeof buf), "5"));
    CHECK(!strcmp(ts_format_int_list(d, 0, buf, sizeof buf), ""));
    int many[40];
    for (int i = 0; i < 40; i++) many[i] = 3 * i;
    char small[16];
    ts_format_int_list(many, 40, small, sizeof small);
    CHECKF(strlen(small) < sizeof small && strstr(small, "...") != NULL, "truncated: %s", small);
}

int main(void)
{
    make_orders4();
    test_grid_all_shapes();
    test_grid_three_name_orders();
    test_grid_cp1_unchanged();
    test_grid_example_2x2x2();
    test_grid_example_cp();
    test_grid_bad_orders();
    test_format_int_list();
    return ts_test_report();
}
