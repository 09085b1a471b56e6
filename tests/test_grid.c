/* The pure rank arithmetic of the grid (src/topology/grid.c), for every grid of up to
 * 16 ranks in every one of the 6 orders. No MPI. */
#include <string.h>

#include "test_util.h"
#include "topology/topology.h"

static const char *const k_orders[6] = { "tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                         "dp-pp-tp", "pp-tp-dp", "pp-dp-tp" };

/* Does rank r lie in the group of `rank` along `axis` (all other coordinates equal)? */
static int same_except(ts_coords a, ts_coords b, ts_axis axis)
{
    for (int x = 0; x < TS_N_AXES; x++)
        if (x != (int)axis && ts_coords_get(a, (ts_axis)x) != ts_coords_get(b, (ts_axis)x))
            return 0;
    return 1;
}

/* rank -> coords -> rank is the identity and every coordinate triple is hit once. */
static void test_grid_bijection(const ts_grid *g, const char *what)
{
    int seen[16 * 16 * 16];
    memset(seen, 0, sizeof seen);
    int pp = g->size[TS_AXIS_PP], dp = g->size[TS_AXIS_DP], tp = g->size[TS_AXIS_TP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int ok = c.pp >= 0 && c.pp < pp && c.dp >= 0 && c.dp < dp && c.tp >= 0 && c.tp < tp;
        CHECKF(ok, "%s rank %d -> (%d,%d,%d) out of range", what, r, c.pp, c.dp, c.tp);
        if (!ok) continue;
        CHECKF(ts_grid_rank(g, c) == r, "%s rank %d round trip", what, r);
        seen[(c.pp * dp + c.dp) * tp + c.tp]++;
    }
    for (int i = 0; i < g->world; i++)
        CHECKF(seen[i] == 1, "%s coords %d hit %d times", what, i, seen[i]);
}

/* The fastest axis moves by one rank, the slowest by the product of the other two. */
static void test_grid_strides(const ts_grid *g, const char *order, const char *what)
{
    ts_axis ax[3];
    CHECK(ts_grid_parse_order(order, ax) == TS_OK);
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        int a0 = ts_coords_get(c, ax[0]), a1 = ts_coords_get(c, ax[1]),
            a2 = ts_coords_get(c, ax[2]);
        int expect = a0 + g->size[ax[0]] * (a1 + g->size[ax[1]] * a2);
        CHECKF(expect == r, "%s rank %d expected %d from the order formula", what, r, expect);
    }
}

/* Megatron's tp-dp-pp: global = tp + TP*(dp + DP*pp). */
static void test_grid_megatron_formula(const ts_grid *g, const char *what)
{
    int tp = g->size[TS_AXIS_TP], dp = g->size[TS_AXIS_DP];
    for (int r = 0; r < g->world; r++) {
        ts_coords c = ts_grid_coords(g, r);
        CHECKF(c.tp + tp * (c.dp + dp * c.pp) == r, "%s rank %d megatron", what, r);
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
            /* The group is exactly the ranks that agree on the other two coordinates. */
            int count = 0;
            for (int q = 0; q < g->world; q++) count += same_except(ts_grid_coords(g, q), c, axis);
            CHECKF(count == n, "%s rank %d %s group misses members", what, r, ts_axis_name(axis));
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

static void test_grid_all_shapes(void)
{
    int grids = 0;
    for (int pp = 1; pp <= 16; pp++)
        for (int dp = 1; pp * dp <= 16; dp++)
            for (int tp = 1; pp * dp * tp <= 16; tp++)
                for (int o = 0; o < 6; o++) {
                    char what[64];
                    snprintf(what, sizeof what, "pp=%d dp=%d tp=%d %s", pp, dp, tp, k_orders[o]);
                    ts_grid g;
                    CHECKF(ts_grid_init(&g, pp, dp, tp, k_orders[o]) == TS_OK, "%s: %s", what,
                           ts_error_message());
                    CHECK(g.world == pp * dp * tp);
                    test_grid_bijection(&g, what);
                    test_grid_strides(&g, k_orders[o], what);
                    if (o == 0) test_grid_megatron_formula(&g, what);
                    test_grid_groups(&g, what);
                    test_grid_pipeline_neighbours(&g, what);
                    test_grid_embedding(&g, what);
                    grids++;
                }
    printf("checked %d grids\n", grids);
}

/* A worked example: pp=2 dp=2 tp=2 in tp-dp-pp, as in docs/ARCHITECTURE.md "The grid". */
static void test_grid_example_2x2x2(void)
{
    ts_grid g;
    CHECK(ts_grid_init(&g, 2, 2, 2, "tp-dp-pp") == TS_OK);
    ts_coords c = ts_grid_coords(&g, 5);
    CHECK(c.pp == 1 && c.dp == 0 && c.tp == 1);
    int m[2];
    ts_grid_group(&g, 5, TS_AXIS_TP, m);
    CHECK(m[0] == 4 && m[1] == 5);
    ts_grid_group(&g, 5, TS_AXIS_DP, m);
    CHECK(m[0] == 5 && m[1] == 7);
    ts_grid_group(&g, 5, TS_AXIS_PP, m);
    CHECK(m[0] == 1 && m[1] == 5);
    CHECK(ts_grid_pp_prev(&g, 5) == 1 && ts_grid_pp_next(&g, 5) == -1);
    CHECK(ts_grid_embedding_group(&g, 5, m) == 2 && m[0] == 1 && m[1] == 5);
}

static void test_grid_bad_orders(void)
{
    static const char *const bad[] = { "",         "tp-dp",     "tp-dp-pp-", "tp-tp-pp",
                                       "pp-dp-dp", "tp_dp_pp",  "TP-DP-PP",  "tp-dp-xx",
                                       "tp-dp-p",  "tpdppp",    "dp-tp-pp ", "tp--dp-pp" };
    ts_axis order[3];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_error_clear();
        CHECKF(ts_grid_parse_order(bad[i], order) == TS_ERR, "order \"%s\" accepted", bad[i]);
        CHECKF(strstr(ts_error_message(), "tp, dp and pp") != NULL, "order \"%s\": %s", bad[i],
               ts_error_message());
    }
    CHECK(ts_grid_parse_order(NULL, order) == TS_ERR);
    ts_grid g;
    CHECK(ts_grid_init(&g, 2, 2, 2, "tp-tp-pp") == TS_ERR);
    CHECK(ts_grid_init(&g, 0, 2, 2, "tp-dp-pp") == TS_ERR);
    CHECK(ts_grid_init(&g, 2, -1, 2, "tp-dp-pp") == TS_ERR);
    for (int o = 0; o < 6; o++) CHECK(ts_grid_parse_order(k_orders[o], order) == TS_OK);
    CHECK(ts_grid_parse_order("dp-pp-tp", order) == TS_OK && order[0] == TS_AXIS_DP &&
          order[1] == TS_AXIS_PP && order[2] == TS_AXIS_TP);
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
    test_grid_all_shapes();
    test_grid_example_2x2x2();
    test_grid_bad_orders();
    test_format_int_list();
    return ts_test_report();
}
