/* The expert grid etp x ep x edp x pp, folded over the dense grid's ranks (expert_grid.c
 * says how and why). Pure rank arithmetic: no MPI, unit-testable. */
#ifndef TS_TOPOLOGY_EXPERT_GRID_H
#define TS_TOPOLOGY_EXPERT_GRID_H

#include "topology/topology.h"

typedef struct {
    int etp, ep, edp; /* etp * ep * edp = tp * cp * dp, the ranks of one pipeline stage */
} ts_expert_grid;

typedef struct {
    int etp, ep, edp;
} ts_expert_coords;

typedef enum { TS_EXPERT_ETP, TS_EXPERT_EP, TS_EXPERT_EDP } ts_expert_axis;

/* The expert grid of `g` with parallel.ep and parallel.etp: TS_ERR with a message naming
 * the keys unless ep * etp divides tp * cp * dp. */
ts_status ts_expert_grid_init(ts_expert_grid *x, const ts_grid *g, int ep, int etp);
/* `rank`'s index among its stage's ranks (0 .. tp*cp*dp - 1): its tp, cp and dp
 * coordinates in the grid's order with pp left out; and back, given the stage. */
int ts_grid_stage_index(const ts_grid *g, int rank);
int ts_grid_stage_rank(const ts_grid *g, int pp, int index);
/* `rank`'s expert coordinates. */
ts_expert_coords ts_expert_grid_coords(const ts_expert_grid *x, const ts_grid *g, int rank);
/* The group along `axis` containing `rank`: the global ranks of its stage that share its
 * other two expert coordinates, written to members[] ordered by their coordinate on
 * `axis` (a rank's index in it is that coordinate). Returns the group's size. */
int ts_expert_grid_group(const ts_expert_grid *x, const ts_grid *g, int rank,
                         ts_expert_axis axis, int *members);
/* "etp", "ep" or "edp". */
const char *ts_expert_axis_name(ts_expert_axis axis);

#endif
