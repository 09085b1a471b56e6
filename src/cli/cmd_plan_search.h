/* `tessera plan CONFIG --cluster FILE [--gpus N --search]`: predictions on a described
 * cluster (src/plan/). cmd_plan.c hands every command line with --cluster here. */
#ifndef TS_CMD_PLAN_SEARCH_H
#define TS_CMD_PLAN_SEARCH_H

#include <stdbool.h>

extern const char ts_plan_cluster_help[];

/* Whether argv[2..] holds --cluster (then ts_cmd_plan_cluster handles the command). */
bool ts_plan_has_cluster(int argc, char **argv);

/* Run it; returns the exit code (0, 1 error, 2 usage). Output is not yet flushed. */
int ts_cmd_plan_cluster(int argc, char **argv);

#endif
