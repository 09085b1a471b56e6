/* A schedule's placement in words, for the trainer's start-up line and `tessera plan`. */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/schedule.h"

char *ts_placement_describe(const ts_schedule *s, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "placement %s:", ts_placement_names[s->placement]);
    int *mine = ts_malloc((size_t)s->n_chunks * sizeof(int));
    for (int r = 0; r < s->pp && at < size; r++) {
        const int n = ts_rank_chunks(s, r, mine);
        at += (size_t)snprintf(buf + at, size - at, "%s rank %d: chunk%s", r ? ";" : "", r,
                               n == 1 ? "" : "s");
        for (int k = 0; k < n && at < size; k++)
            at += (size_t)snprintf(buf + at, size - at, "%s%d", k ? ", " : " ", mine[k]);
    }
    free(mine);
    return buf;
}
