/* Which GPU each rank of a node drives (ts_gpu_assign, topology.h): the pure part of
 * the choice, from CPU sets alone, so it is unit-tested without a GPU or MPI.
 *
 * Every GPU gets floor(R/G) or ceil(R/G) of the R ranks (so with R <= G no two ranks
 * share one, which NCCL requires), and within that the ranks go where most of their
 * cores are near the GPU. Greedy, one (rank, GPU) pair at a time: the pair whose GPU is
 * nearest the rank (the share of the rank's CPUs that are near the GPU, compared
 * exactly as fractions), then the least-loaded GPU, then the lowest rank, then the
 * lowest GPU. Sharing first rather than a rank's order lets a rank bound near one GPU
 * only take it before a rank that is near every GPU does. Without locality (every
 * share equal, or unknown) the load and rank order give local rank i GPU i mod G, the
 * old rule. The inputs are the same on every rank of the node, so every rank computes
 * the same answer whatever order the ranks run in. */
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>

#include "topology/topology.h"

/* A CPU list ("0-3,8"; NULL or "": unknown, the empty set), or NULL when unparsable. */
static hwloc_bitmap_t parse(const char *list)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set && list && *list && hwloc_bitmap_list_sscanf(set, list) != 0) {
        hwloc_bitmap_free(set);
        return NULL;
    }
    return set;
}

/* a / b > c / d for non-negative fractions (a zero denominator counts as 0). */
static bool share_greater(long long a, long long b, long long c, long long d)
{
    if (b <= 0) a = 0, b = 1;
    if (d <= 0) c = 0, d = 1;
    return a * d > c * b;
}

ts_status ts_gpu_assign(const char *const *rank_cpus, int n_ranks, const char *const *gpu_cpus,
                        int n_gpus, int *gpu_of_rank)
{
    TS_ASSERT(n_ranks >= 0 && n_gpus > 0);
    if (n_ranks == 0) return TS_OK;
    hwloc_bitmap_t *gpus = ts_calloc((size_t)n_gpus, sizeof *gpus);
    long long *overlap = ts_calloc((size_t)n_ranks * (size_t)n_gpus, sizeof *overlap);
    long long *size = ts_calloc((size_t)n_ranks, sizeof *size);
    int *load = ts_calloc((size_t)n_gpus, sizeof *load);
    ts_status st = TS_OK;
    for (int g = 0; g < n_gpus && st == TS_OK; g++)
        if (!(gpus[g] = parse(gpu_cpus ? gpu_cpus[g] : NULL)))
            st = ts_fail("the CPUs near GPU %d, \"%s\", are no CPU list (like \"0-3,8\")", g,
                         gpu_cpus[g]);
    for (int r = 0; r < n_ranks && st == TS_OK; r++) {
        hwloc_bitmap_t mine = parse(rank_cpus ? rank_cpus[r] : NULL);
        if (!mine) {
            st = ts_fail("the CPUs of local rank %d, \"%s\", are no CPU list (like \"0-3,8\")",
                         r, rank_cpus[r]);
            break;
        }
        int w = hwloc_bitmap_weight(mine);
        size[r] = w > 0 ? w : 0;
        hwloc_bitmap_t both = hwloc_bitmap_alloc();
        for (int g = 0; g < n_gpus; g++) {
            hwloc_bitmap_and(both, mine, gpus[g]);
            int o = hwloc_bitmap_weight(both);
            overlap[(size_t)r * n_gpus + g] = o > 0 ? o : 0;
        }
        hwloc_bitmap_free(both);
        hwloc_bitmap_free(mine);
    }

    if (st == TS_OK) {
        for (int r = 0; r < n_ranks; r++) gpu_of_rank[r] = -1;
        const int base = n_ranks / n_gpus, extra = n_ranks % n_gpus;
        int at_ceil = 0; /* GPUs holding base + 1 ranks (at most `extra` may) */
        for (int step = 0; step < n_ranks; step++) {
            int br = -1, bg = -1;
            for (int r = 0; r < n_ranks; r++) {
                if (gpu_of_rank[r] >= 0) continue;
                for (int g = 0; g < n_gpus; g++) {
                    bool room = load[g] < base || (load[g] == base && at_ceil < extra);
                    if (!room) continue;
                    if (br >= 0) {
                        const long long *o = overlap;
                        size_t rg = (size_t)r * n_gpus + g, bgi = (size_t)br * n_gpus + bg;
                        if (share_greater(o[bgi], size[br], o[rg], size[r])) continue;
                        if (!share_greater(o[rg], size[r], o[bgi], size[br]) &&
                            load[g] >= load[bg])
                            continue; /* equal share: only a less-loaded GPU wins; ties
                                       * keep the lower rank and GPU found first */
                    }
                    br = r;
                    bg = g;
                }
            }
            TS_ASSERT(br >= 0); /* the capacities add up to n_ranks */
            gpu_of_rank[br] = bg;
            if (++load[bg] == base + 1) at_ceil++;
        }
    }
    for (int g = 0; g < n_gpus; g++)
        if (gpus[g]) hwloc_bitmap_free(gpus[g]);
    free(gpus);
    free(overlap);
    free(size);
    free(load);
    return st;
}
