/* Rank arithmetic of the pp x dp x cp x tp grid. No MPI: everything here is a pure
 * function of the grid, so every rank (and the tests) compute the same answer.
 *
 * With the order "a-b-c-d" (a fastest), rank = ca + A*(cb + B*(cc + C*cd)): the stride
 * of the fastest axis is 1, of the next A, then A*B, of the slowest A*B*C. A group along
 * an axis is then an arithmetic progression: the rank with that coordinate zeroed, plus
 * k * stride. A three-name order leaves cp out; it goes right after tp, and with cp = 1
 * its size-1 axis changes no stride, so such a grid is the three-axis grid it was. */
#include <stdio.h>
#include <string.h>

#include "topology/topology.h"

static const char *const k_axis_names[TS_N_AXES] = { "tp", "dp", "pp", "cp" };

const char *ts_axis_name(ts_axis a)
{
    TS_ASSERT(a >= 0 && a < TS_N_AXES);
    return k_axis_names[a];
}

/* Read n two-letter axis names joined by '-' (the whole string), each once and none of
 * them cp unless n == TS_N_AXES. */
static bool parse_names(const char *s, int n, ts_axis *out)
{
    if (strlen(s) != (size_t)(3 * n - 1)) return false;
    bool seen[TS_N_AXES] = { false };
    for (int i = 0; i < n; i++) {
        if (i > 0 && s[3 * i - 1] != '-') return false;
        int found = -1;
        for (int a = 0; a < TS_N_AXES; a++)
            if (strncmp(s + 3 * i, k_axis_names[a], 2) == 0) found = a;
        if (found < 0 || seen[found] || (found == TS_AXIS_CP && n < TS_N_AXES)) return false;
        seen[found] = true;
        out[i] = (ts_axis)found;
    }
    return true;
}

ts_status ts_grid_parse_order(const char *s, ts_axis order[TS_N_AXES])
{
    ts_axis names[TS_N_AXES];
    if (s && parse_names(s, TS_N_AXES, names)) {
        memcpy(order, names, sizeof names);
        return TS_OK;
    }
    if (s && parse_names(s, TS_N_AXES - 1, names)) {
        /* "a-b-c" without cp: cp varies right after tp ("tp-dp-pp" = "tp-cp-dp-pp"). */
        int k = 0;
        for (int i = 0; i < TS_N_AXES - 1; i++) {
            order[k++] = names[i];
            if (names[i] == TS_AXIS_TP) order[k++] = TS_AXIS_CP;
        }
        return TS_OK;
    }
    return ts_fail("rank order \"%s\" is not valid; give tp, cp, dp and pp once each joined "
                   "by '-', fastest-varying first (e.g. \"tp-cp-dp-pp\"), or tp, dp and pp "
                   "once each (cp then varies right after tp: \"tp-dp-pp\" is "
                   "\"tp-cp-dp-pp\")",
                   s ? s : "(null)");
}

ts_status ts_grid_init4(ts_grid *g, int pp, int dp, int cp, int tp, const char *order)
{
    memset(g, 0, sizeof *g);
    if (pp < 1 || dp < 1 || cp < 1 || tp < 1)
        return ts_fail("grid pp=%d dp=%d cp=%d tp=%d: every size must be >= 1", pp, dp, cp,
                       tp);
    /* Multiplied one at a time, so no product of four ints overflows. */
    long long world = 1;
    const int sizes[] = { pp, dp, cp, tp };
    for (int i = 0; i < 4 && world <= 0x7fffffffLL; i++) world *= sizes[i];
    if (world > 0x7fffffffLL)
        return ts_fail("grid pp*dp*cp*tp = %d*%d*%d*%d ranks is too large", pp, dp, cp, tp);
    if (ts_grid_parse_order(order, g->order) != TS_OK) return TS_ERR;
    g->size[TS_AXIS_PP] = pp;
    g->size[TS_AXIS_DP] = dp;
    g->size[TS_AXIS_CP] = cp;
    g->size[TS_AXIS_TP] = tp;
    g->world = (int)world;
    int stride = 1;
    for (int i = 0; i < TS_N_AXES; i++) {
        g->stride[g->order[i]] = stride;
        stride *= g->size[g->order[i]];
    }
    return TS_OK;
}

int ts_coords_get(ts_coords c, ts_axis a)
{
    switch (a) {
    case TS_AXIS_TP: return c.tp;
    case TS_AXIS_DP: return c.dp;
    case TS_AXIS_PP: return c.pp;
    case TS_AXIS_CP: return c.cp;
    }
    TS_ASSERT(!"bad axis");
    return -1;
}

static int coord(const ts_grid *g, int rank, ts_axis a)
{
    return rank / g->stride[a] % g->size[a];
}

ts_coords ts_grid_coords(const ts_grid *g, int rank)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    ts_coords c = { .pp = coord(g, rank, TS_AXIS_PP),
                    .dp = coord(g, rank, TS_AXIS_DP),
                    .tp = coord(g, rank, TS_AXIS_TP),
                    .cp = coord(g, rank, TS_AXIS_CP) };
    return c;
}

int ts_grid_rank(const ts_grid *g, ts_coords c)
{
    int rank = 0;
    for (int a = 0; a < TS_N_AXES; a++) {
        int x = ts_coords_get(c, (ts_axis)a);
        TS_ASSERT(x >= 0 && x < g->size[a]);
        rank += x * g->stride[a];
    }
    return rank;
}

/* The member of rank's group along `a` with coordinate 0 on `a`. */
static int group_base(const ts_grid *g, int rank, ts_axis a)
{
    return rank - coord(g, rank, a) * g->stride[a];
}

int ts_grid_group(const ts_grid *g, int rank, ts_axis axis, int *members)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    int base = group_base(g, rank, axis);
    for (int k = 0; k < g->size[axis]; k++) members[k] = base + k * g->stride[axis];
    return g->size[axis];
}

int ts_grid_replica_group(const ts_grid *g, int rank, int *members)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    int base = group_base(g, group_base(g, rank, TS_AXIS_DP), TS_AXIS_CP);
    int dp = g->size[TS_AXIS_DP], cp = g->size[TS_AXIS_CP];
    for (int d = 0; d < dp; d++)
        for (int c = 0; c < cp; c++)
            members[d * cp + c] = base + d * g->stride[TS_AXIS_DP] + c * g->stride[TS_AXIS_CP];
    return dp * cp;
}

int ts_grid_replica_index(const ts_grid *g, int rank)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    return coord(g, rank, TS_AXIS_DP) * g->size[TS_AXIS_CP] + coord(g, rank, TS_AXIS_CP);
}

int ts_grid_pp_prev(const ts_grid *g, int rank)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    return coord(g, rank, TS_AXIS_PP) > 0 ? rank - g->stride[TS_AXIS_PP] : -1;
}

int ts_grid_pp_next(const ts_grid *g, int rank)
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    return coord(g, rank, TS_AXIS_PP) < g->size[TS_AXIS_PP] - 1 ? rank + g->stride[TS_AXIS_PP]
                                                                 : -1;
}

int ts_grid_embedding_group(const ts_grid *g, int rank, int members[2])
{
    TS_ASSERT(rank >= 0 && rank < g->world);
    int pp = g->size[TS_AXIS_PP];
    members[0] = group_base(g, rank, TS_AXIS_PP);
    if (pp == 1) return 1;
    members[1] = members[0] + (pp - 1) * g->stride[TS_AXIS_PP];
    return 2;
}

bool ts_grid_in_embedding_group(const ts_grid *g, int rank)
{
    int c = ts_grid_coords(g, rank).pp;
    return c == 0 || c == g->size[TS_AXIS_PP] - 1;
}

char *ts_format_int_list(const int *v, int n, char *buf, size_t cap)
{
    TS_ASSERT(cap >= 4);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        char item[32];
        if (j > i)
            snprintf(item, sizeof item, "%s%d-%d", i ? "," : "", v[i], v[j]);
        else
            snprintf(item, sizeof item, "%s%d", i ? "," : "", v[i]);
        size_t k = strlen(item);
        if (len + k + 1 > cap || (j + 1 < n && len + k + 4 > cap)) {
            /* No room for this item (and, if more follow, the "..."): end the list. */
            if (len + 4 > cap) len = cap - 4;
            memcpy(buf + len, "...", 4);
            return buf;
        }
        memcpy(buf + len, item, k + 1);
        len += k;
        i = j + 1;
    }
    return buf;
}
