/* The expert grid folded over the dense one (src/topology/expert_grid.c), pure rank
 * arithmetic: for every grid of up to 16 ranks in every four-name order and every legal
 * (ep, etp), the stage index is a bijection onto each stage, every expert group has its
 * size, stays in one stage, holds the rank at its own coordinate and varies only its
 * axis; under Megatron's order the groups are Megatron's strides; the worked example of
 * docs/ARCHITECTURE.md; an ep * etp that does not divide tp * cp * dp is refused naming
 * the keys. No MPI. */
#include <string.h>

#include "test_util.h"
#include "topology/expert_grid.h"

static char k_orders[24][12];

static void make_orders(void)
{
    const int n = ts_test_grid_orders(k_orders);
    CHECK(n == 24 && strcmp(k_orders[0], "tp-cp-dp-pp") == 0);
}

static int coord_on(ts_expert_coords c, ts_expert_axis a)
{
    return a == TS_EXPERT_ETP ? c.etp : a == TS_EXPERT_EP ? c.ep : c.edp;
}

/* Every property of one expert grid over one dense grid. */
static void check_expert_grid(const ts_grid *g, const ts_expert_grid *x, const char *what)
{
    const int stage = g->world / g->size[TS_AXIS_PP];
    CHECKF(x->etp * x->ep * x->edp == stage, "%s: etp*ep*edp != stage size", what);
    int seen[64];
    for (int pp = 0; pp < g->size[TS_AXIS_PP]; pp++) {
        memset(seen, 0, sizeof seen);
        for (int d = 0; d < stage; d++) {
            const int r = ts_grid_stage_rank(g, pp, d);
            CHECKF(ts_grid_coords(g, r).pp == pp && ts_grid_stage_index(g, r) == d,
                   "%s: stage %d index %d -> rank %d does not come back", what, pp, d, r);
            seen[r]++;
        }
        int in_stage = 0;
        for (int r = 0; r < g->world; r++) in_stage += seen[r] == 1;
        CHECKF(in_stage == stage, "%s: stage %d's indices are not a bijection", what, pp);
    }
    for (int r = 0; r < g->world; r++) {
        const ts_expert_coords c = ts_expert_grid_coords(x, g, r);
        for (int a = 0; a < 3; a++) {
            int members[64];
            const int n = ts_expert_grid_group(x, g, r, (ts_expert_axis)a, members);
            const int want = a == TS_EXPERT_ETP ? x->etp : a == TS_EXPERT_EP ? x->ep : x->edp;
            CHECKF(n == want, "%s: rank %d's %s group has %d members, not %d", what, r,
                   ts_expert_axis_name((ts_expert_axis)a), n, want);
            CHECKF(members[coord_on(c, (ts_expert_axis)a)] == r,
                   "%s: rank %d not at its own %s coordinate", what, r,
                   ts_expert_axis_name((ts_expert_axis)a));
            for (int k = 0; k < n; k++) {
                const ts_expert_coords m = ts_expert_grid_coords(x, g, members[k]);
                CHECKF(ts_grid_coords(g, members[k]).pp == ts_grid_coords(g, r).pp,
                       "%s: rank %d's %s group leaves its stage", what, r,
                       ts_expert_axis_name((ts_expert_axis)a));
                CHECKF(coord_on(m, (ts_expert_axis)a) == k,
                       "%s: member %d of rank %d's %s group has coordinate %d", what, k, r,
                       ts_expert_axis_name((ts_expert_axis)a), coord_on(m, (ts_expert_axis)a));
                for (int b = 0; b < 3; b++)
                    if (b != a)
                        CHECKF(coord_on(m, (ts_expert_axis)b) == coord_on(c, (ts_expert_axis)b),
                               "%s: rank %d's %s group varies %s too", what, r,
                               ts_expert_axis_name((ts_expert_axis)a),
                               ts_expert_axis_name((ts_expert_axis)b));
            }
        }
    }
}

/* Every grid of up to 16 ranks, every order, every (ep, etp) whose product divides the
 * stage: the properties above; under "tp-cp-dp-pp" also Megatron's strides. */
static void test_all_shapes(void)
{
    int grids = 0;
    for (int pp = 1; pp <= 4; pp++)
        for (int dp = 1; dp <= 4; dp++)
            for (int cp = 1; cp <= 2; cp++)
                for (int tp = 1; tp <= 4; tp++) {
                    if (pp * dp * cp * tp > 16) continue;
                    const int stage = dp * cp * tp;
                    for (int o = 0; o < 24; o++) {
                        ts_grid g;
                        CHECK(ts_grid_init4(&g, pp, dp, cp, tp, k_orders[o]) == TS_OK);
                        for (int ep = 1; ep <= stage; ep++)
                            for (int etp = 1; ep * etp <= stage; etp++) {
                                if (stage % (ep * etp)) continue;
                                ts_expert_grid x;
                                char what[96];
                                snprintf(what, sizeof what, "pp%d dp%d cp%d tp%d %s ep%d etp%d",
                                         pp, dp, cp, tp, k_orders[o], ep, etp);
                                CHECKF(ts_expert_grid_init(&x, &g, ep, etp) == TS_OK, "%s: %s",
                                       what, ts_error_message());
                                check_expert_grid(&g, &x, what);
                                grids++;
                                if (o != 0) continue;
                                /* Megatron: global = pp*S + d, etp consecutive, ep stride
                                 * ETP, edp stride ETP*EP. */
                                for (int r = 0; r < g.world; r++) {
                                    int m[64];
                                    const int d = r % stage;
                                    ts_expert_grid_group(&x, &g, r, TS_EXPERT_EP, m);
                                    CHECKF(m[0] == r - (d / etp % ep) * etp,
                                           "%s: rank %d's ep group starts at %d", what, r,
                                           m[0]);
                                    if (ep > 1) CHECK(m[1] - m[0] == etp);
                                    ts_expert_grid_group(&x, &g, r, TS_EXPERT_EDP, m);
                                    if (x.edp > 1) CHECK(m[1] - m[0] == etp * ep);
                                }
                            }
                    }
                }
    CHECKF(grids > 1000, "only %d expert grids checked", grids);
}

/* docs/ARCHITECTURE.md's worked example: 16 ranks, pp 2 x dp 4 x tp 2, ep 4, etp 1. */
static void test_worked_example(void)
{
    ts_grid g;
    ts_expert_grid x;
    CHECK(ts_grid_init4(&g, 2, 4, 1, 2, "tp-cp-dp-pp") == TS_OK);
    CHECK(ts_expert_grid_init(&x, &g, 4, 1) == TS_OK);
    CHECK(x.etp == 1 && x.ep == 4 && x.edp == 2);
    int m[8];
    CHECK(ts_expert_grid_group(&x, &g, 5, TS_EXPERT_EP, m) == 4);
    CHECK(m[0] == 4 && m[1] == 5 && m[2] == 6 && m[3] == 7); /* borrows tp 0-1 x dp 2-3 */
    CHECK(ts_expert_grid_group(&x, &g, 5, TS_EXPERT_EDP, m) == 2);
    CHECK(m[0] == 1 && m[1] == 5);
    CHECK(ts_expert_grid_group(&x, &g, 13, TS_EXPERT_EP, m) == 4);
    CHECK(m[0] == 12 && m[3] == 15); /* the second stage's */
    /* etp 2 on the same grid: the tp pairs are the etp groups, ep strides by 2. */
    CHECK(ts_expert_grid_init(&x, &g, 2, 2) == TS_OK);
    CHECK(ts_expert_grid_group(&x, &g, 3, TS_EXPERT_ETP, m) == 2 && m[0] == 2 && m[1] == 3);
    CHECK(ts_expert_grid_group(&x, &g, 3, TS_EXPERT_EP, m) == 2 && m[0] == 1 && m[1] == 3);
    CHECK(ts_expert_grid_group(&x, &g, 3, TS_EXPERT_EDP, m) == 2 && m[0] == 3 && m[1] == 7);
}

static void test_refused(void)
{
    ts_grid g;
    ts_expert_grid x;
    CHECK(ts_grid_init4(&g, 2, 3, 1, 2, "tp-cp-dp-pp") == TS_OK);
    const int bad[][2] = { { 4, 1 }, { 5, 1 }, { 2, 2 }, { 12, 1 }, { 0, 1 }, { 1, 0 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_error_clear();
        CHECKF(ts_expert_grid_init(&x, &g, bad[i][0], bad[i][1]) == TS_ERR,
               "ep %d etp %d accepted on a stage of 6", bad[i][0], bad[i][1]);
        CHECKF(strstr(ts_error_message(), "parallel.ep") != NULL &&
                   strstr(ts_error_message(), "parallel.etp") != NULL,
               "ep %d etp %d: %s", bad[i][0], bad[i][1], ts_error_message());
    }
    CHECK(ts_expert_grid_init(&x, &g, 6, 1) == TS_OK && x.edp == 1);
    CHECK(ts_expert_grid_init(&x, &g, 3, 2) == TS_OK && x.edp == 1);
}

int main(void)
{
    make_orders();
    test_all_shapes();
    test_worked_example();
    test_refused();
    return ts_test_report();
}
