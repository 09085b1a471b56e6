/* The pieces the two forms of `tessera plan` share (plan_cli.h). */
#include "cli/plan_cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/log.h"

int ts_plan_usage(const char *fmt, const char *what)
{
    fputs("tessera: error: ", stderr);
    fprintf(stderr, fmt, what);
    fputs(" (see tessera plan --help)\n", stderr);
    return -1;
}

int ts_plan_parse_number(const char *s, const ts_plan_number_opt *o, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < o->lo || v > o->hi ||
        (o->whole && v != floor(v))) {
        fprintf(stderr,
                "tessera: error: %s '%.40s%s' is not a %s from %.15g to %.15g (%s) (see tessera "
                "plan --help)\n",
                o->flag, s, strlen(s) > 40 ? "..." : "", o->whole ? "whole number" : "number",
                o->lo, o->hi, o->unit);
        return -1;
    }
    *out = v;
    return 0;
}

int ts_plan_parse_argv(int argc, char **argv, ts_plan_opt_fn opt, void *args,
                       const char **config, const char **sets, int max_sets, int *n_sets)
{
    char **rest = ts_malloc(sizeof(char *) * (size_t)(argc + 1));
    int n_rest = 0, rc = 0;
    rest[n_rest++] = argv[0];
    rest[n_rest++] = argv[1];
    for (int i = 2; i < argc && rc == 0; i++) {
        int missing = 0;
        if (!opt(args, argc, argv, &i, &missing, &rc) && !missing)
            rest[n_rest++] = argv[i]; /* CONFIG, --set, or an option the command ignores */
        if (missing) rc = ts_plan_usage("%s needs a value", argv[i]);
    }
    if (rc == 0 && ts_cli_parse_config_args(n_rest, rest, 2, config, sets, max_sets, n_sets,
                                            1) != 0)
        rc = -1;
    free(rest);
    return rc;
}

int ts_plan_print_json(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    if (!text) {
        ts_log_error("plan: could not build the JSON output");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}
