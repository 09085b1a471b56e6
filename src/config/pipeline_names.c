/* The schedule and recompute name tables (config/pipeline_names.h) and the
 * virtual-stages rule of each built-in schedule, which the config check and
 * ts_schedule_build (pipeline/schedule.c, where each schedule is described) share. */
#include "config/pipeline_names.h"

#include <stdio.h>
#include <string.h>

const char *const ts_schedule_names[TS_N_SCHEDULES] = {
    [TS_SCHEDULE_GPIPE] = "gpipe",
    [TS_SCHEDULE_1F1B] = "1f1b",
    [TS_SCHEDULE_INTERLEAVED_1F1B] = "interleaved-1f1b",
    [TS_SCHEDULE_ZB_H1] = "zb-h1",
    [TS_SCHEDULE_LOOPED_BFS] = "looped-bfs",
    [TS_SCHEDULE_INTERLEAVED_ZB] = "interleaved-zb",
    [TS_SCHEDULE_ZB_H2] = "zb-h2",
    [TS_SCHEDULE_ZB_V] = "zb-v",
    [TS_SCHEDULE_DUALPIPE_V] = "dualpipe-v",
};
const char *const ts_recompute_names[TS_N_RECOMPUTES] = {
    [TS_RECOMPUTE_NONE] = "none",
    [TS_RECOMPUTE_EXCEPT_LAST] = "except_last",
    [TS_RECOMPUTE_FULL] = "full",
    [TS_RECOMPUTE_AUTO] = "auto",
    [TS_RECOMPUTE_SELECTIVE] = "selective",
};

static int name_index(const char *s, const char *const *list, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, list[i]) == 0) return i;
    return -1;
}

int ts_schedule_kind_from_name(const char *name)
{
    return name_index(name, ts_schedule_names, TS_N_SCHEDULES);
}

int ts_recompute_from_name(const char *name)
{
    return name_index(name, ts_recompute_names, TS_N_RECOMPUTES);
}

int ts_schedule_chunks_per_rank(ts_schedule_kind kind)
{
    switch (kind) {
    case TS_SCHEDULE_INTERLEAVED_1F1B:
    case TS_SCHEDULE_LOOPED_BFS:
    case TS_SCHEDULE_INTERLEAVED_ZB: return 0;
    case TS_SCHEDULE_ZB_V:
    case TS_SCHEDULE_DUALPIPE_V: return 2;
    default: return 1;
    }
}

ts_status ts_schedule_check_virtual_stages(ts_schedule_kind kind, int v)
{
    const char *name = ts_schedule_names[kind];
    const int need = ts_schedule_chunks_per_rank(kind);
    if (need == 2 && v != 2)
        return ts_fail("schedule \"%s\" needs parallel.virtual_stages = 2 (V placement: two "
                       "chunks per rank, rank r holding chunks r and 2*pp-1-r), got %d",
                       name, v);
    if (need == 1 && v != 1) {
        char multi[160];
        size_t len = 0;
        for (int k = 0; k < TS_N_SCHEDULES; k++)
            if (ts_schedule_chunks_per_rank((ts_schedule_kind)k) != 1)
                len += (size_t)snprintf(multi + len, sizeof multi - len, "%s\"%s\"",
                                        len ? ", " : "", ts_schedule_names[k]);
        return ts_fail("schedule \"%s\" runs one chunk per pipeline rank but "
                       "parallel.virtual_stages = %d: use a schedule for several chunks per "
                       "rank (%s; \"zb-v\" and \"dualpipe-v\" take exactly 2) or a CSV "
                       "schedule, or set virtual_stages = 1",
                       name, v, multi);
    }
    return TS_OK;
}
