/* `tessera plan --cluster`'s ZeRO-2/3 traffic per pipeline rank: the JSON object and the
 * text lines (plan_cli.h), apart from cmd_plan_search.c's other output. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/plan_cli.h"
#include "core/error.h"
#include "plan/predict.h"

/* Rank q's ZeRO traffic per step: {"pp_rank", "gathers", "reductions", "gather_bytes",
 * "reduce_bytes", "allgather_bytes", "dp_bytes", "chunks": [{"chunk", "gathers",
 * "reductions", "dp_bytes"}]}. */
json_t *ts_plan_cli_zero_json(ts_plan_ctx *x, const ts_plan_grid *g, int q)
{
    const int n = g->pp * g->v;
    int *gathers = ts_calloc((size_t)n, sizeof(int));
    double *bytes = ts_calloc((size_t)n, sizeof(double));
    const int *rank = ts_plan_chunk_rank(x, g);
    ts_zero_traffic t;
    ts_plan_zero_of(x, g, q, &t, gathers, bytes);
    json_t *chunks = json_array();
    for (int c = 0; c < n; c++)
        if (rank[c] == q)
            json_array_append_new(chunks, json_pack("{s:i, s:i, s:i, s:I}", "chunk", c, "gathers",
                                                    gathers[c], "reductions", 1, "dp_bytes",
                                                    (json_int_t)llround(bytes[c])));
    free(gathers);
    free(bytes);
    return json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:o}", "pp_rank", q, "gathers",
                     t.gathers, "reductions", t.reductions, "gather_bytes",
                     (json_int_t)llround(t.gather_bytes), "reduce_bytes",
                     (json_int_t)llround(t.reduce_bytes), "allgather_bytes",
                     (json_int_t)llround(t.allgather_bytes), "dp_bytes",
                     (json_int_t)llround(t.bytes), "chunks", chunks);
}

void ts_plan_cli_print_zero(ts_plan_ctx *x, const ts_plan_grid *g)
{
    if (g->zero < 2 || ts_plan_grad_ranks(g) == 1) return;
    const int n = g->pp * g->v;
    int *gathers = ts_calloc((size_t)n, sizeof(int));
    double *bytes = ts_calloc((size_t)n, sizeof(double));
    const int *rank = ts_plan_chunk_rank(x, g);
    printf("zero %d per step (ring over dp * cp = %d, bytes each rank sends):\n", g->zero,
           ts_plan_grad_ranks(g));
    for (int q = 0; q < g->pp; q++) {
        ts_zero_traffic t;
        ts_plan_zero_of(x, g, q, &t, gathers, bytes);
        printf("  pp rank %d: %d weight gathers, %d gradient reductions, %.3f GB:", q, t.gathers,
               t.reductions, t.bytes / 1e9);
        for (int c = 0; c < n; c++)
            if (rank[c] == q) printf(" chunk %d %d+1 (%.3f GB);", c, gathers[c], bytes[c] / 1e9);
        printf("\n");
    }
    free(gathers);
    free(bytes);
}
