/* What `tessera plan` (cmd_plan.c) and `tessera plan --cluster` (cmd_plan_search.c)
 * share: one argument loop, one numeric-option check and one usage message, so both
 * forms of the command take and refuse arguments the same way, and one --json printer. */
#ifndef TS_CLI_PLAN_CLI_H
#define TS_CLI_PLAN_CLI_H

#include <stdbool.h>

#include <jansson.h>

#include "plan/predict.h"

/* "tessera: error: " fmt (with `what`) " (see tessera plan --help)" on stderr; returns
 * -1, the parsers' usage-error code. */
int ts_plan_usage(const char *fmt, const char *what);

/* A numeric option and its range (inclusive), stated in the message when a value is not
 * a number or outside it; `whole` refuses fractions. */
typedef struct {
    const char *flag;
    double lo, hi;
    const char *unit;
    bool whole;
} ts_plan_number_opt;

/* *out = s as a number within o's range; else prints a usage error naming the flag, the
 * value and the range, and returns -1. */
int ts_plan_parse_number(const char *s, const ts_plan_number_opt *o, double *out);

/* A command's own options: whether argv[*i] is one of them (read with ts_cli_opt_value,
 * which advances *i past a separate value, or sets *missing when the value is absent:
 * then return false). On a bad value, or an option the command refuses, it sets *rc to
 * -1 after printing the usage error, and returns true. */
typedef bool (*ts_plan_opt_fn)(void *args, int argc, char **argv, int *i, int *missing,
                               int *rc);

/* argv[2..]: each argument offered to `opt`; what it does not take (CONFIG, --set
 * KEY=VALUE) goes to ts_cli_parse_config_args, into *config and sets[0..*n_sets) (at
 * most max_sets, pointers into argv). An option without its value is a usage error.
 * Returns 0, or -1 after printing the usage error. */
int ts_plan_parse_argv(int argc, char **argv, ts_plan_opt_fn opt, void *args,
                       const char **config, const char **sets, int max_sets, int *n_sets);

/* Print o (taken: freed here) on stdout as one line of JSON, keys in insertion order,
 * reals to 10 significant digits. NULL (a failed json_pack) or a failed dump is logged;
 * returns the exit code, 0 or 1. */
int ts_plan_print_json(json_t *o);

/* ZeRO-2/3's traffic of pipeline rank q per step (plan_zero.c): {"pp_rank", "gathers",
 * "reductions", "gather_bytes", "reduce_bytes", "allgather_bytes", "dp_bytes", "chunks":
 * [...]}; and its text, a line per pipeline rank (nothing below ZeRO-2 or on one rank). */
json_t *ts_plan_cli_zero_json(ts_plan_ctx *x, const ts_plan_grid *g, int q);
void ts_plan_cli_print_zero(ts_plan_ctx *x, const ts_plan_grid *g);

#endif
