/* The start every MPI subcommand shares: read the command line and the config on every
 * rank and agree on the outcome before anything can hang. A rank may see a different
 * file system (the config missing on its node), environment or command line than the
 * others; if it failed alone and left, the others would wait in their first collective
 * forever. So each rank validates what it sees, the ranks agree (the lowest failing
 * rank's message wins, naming its rank and host), and then compare the resolved
 * configs, so ranks that would run different configs fail with the first difference. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/log.h"

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* The first key whose value differs between this rank's resolved config and rank 0's. */
static ts_status describe_difference(const char *mine, const char *theirs)
{
    json_t *a = json_loads(mine, 0, NULL), *b = json_loads(theirs, 0, NULL);
    const char *sec_name, *key;
    json_t *sec, *va;
    char where[128] = "?", here[256] = "?", there[256] = "?";
    bool found = false;
    json_object_foreach(a, sec_name, sec)
    {
        json_object_foreach(sec, key, va)
        {
            json_t *vb = json_object_get(json_object_get(b, sec_name), key);
            if (found || (vb && json_equal(va, vb))) continue;
            found = true;
            snprintf(where, sizeof where, "%s.%s", sec_name, key);
            char *ta = json_dumps(va, JSON_ENCODE_ANY | JSON_COMPACT);
            char *tb = vb ? json_dumps(vb, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            snprintf(here, sizeof here, "%s", ta ? ta : "?");
            snprintf(there, sizeof there, "%s", tb ? tb : "(absent)");
            free(ta);
            free(tb);
        }
    }
    json_decref(a);
    json_decref(b);
    return ts_fail("this rank resolved a different config from rank 0's: %s = %s here but %s "
                   "on rank 0; give every rank the same config file and --set options",
                   where, here, there);
}

static ts_status compare_configs(const ts_config *cfg, const ts_comm *world)
{
    char *json = ts_config_to_json(cfg);
    uint64_t h = fnv1a(json), lo = h, hi = h;
    ts_host_allreduce_min_u64(world, &lo, 1);
    ts_host_allreduce_max_u64(world, &hi, 1);
    ts_status st = TS_OK;
    if (lo != hi) { /* rare: send rank 0's text and name the first difference */
        unsigned long long len = world->rank == 0 ? strlen(json) + 1 : 0;
        ts_host_broadcast(world, &len, sizeof len, 0);
        char *root = ts_malloc(len);
        if (world->rank == 0) memcpy(root, json, len);
        ts_host_broadcast(world, root, len, 0);
        if (strcmp(json, root) != 0) st = describe_difference(json, root);
        free(root);
    }
    free(json);
    return ts_comm_agree(world, st);
}

int ts_cli_load_config(int argc, char **argv, int world_size, const char *const *defaults,
                       int n_defaults, bool need_config, const char *help, ts_config *cfg)
{
    enum { MAX_SETS = 256 };
    const char *path = NULL, *sets[MAX_SETS];
    int n_sets = 0, code = 0;
    ts_status st = TS_OK;
    TS_ASSERT(n_defaults >= 0 && n_defaults < MAX_SETS);
    if (ts_cli_parse_config_args(argc, argv, 2, &path, sets + n_defaults, MAX_SETS - n_defaults,
                                 &n_sets, 0) != 0) {
        st = TS_ERR;
        code = 2;
    } else if (!path && need_config) {
        st = ts_fail("%s needs a CONFIG file", argv[1]);
        code = 2;
    } else {
        /* Without CONFIG the defaults come first and the user's --set options after. */
        const char *const *overrides = sets + n_defaults;
        if (!path && n_defaults > 0) {
            for (int i = 0; i < n_defaults; i++) sets[i] = defaults[i];
            overrides = sets;
            n_sets += n_defaults;
        }
        if (ts_config_load(cfg, path, overrides, n_sets, world_size) != TS_OK) {
            st = TS_ERR;
            code = 1;
        }
    }

    ts_comm world;
    ts_comm_world(&world);
    ts_host_allreduce_max_i32(&world, &code, 1);
    if (ts_comm_agree(&world, st) != TS_OK) {
        if (world.rank == 0)
            fprintf(stderr, "tessera: error: %s\n%s%s", ts_error_message(), code == 2 ? "\n" : "",
                    code == 2 ? help : "");
        return code ? code : 1;
    }
    if (compare_configs(cfg, &world) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    return 0;
}
