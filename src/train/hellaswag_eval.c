/* HellaSwag inside the trainer (and `tessera eval`): the items' completions through the
 * engine's forward-only walk (ts_engine_score, as validation), the summed losses brought
 * together over the grid, the scores from them (dataset/hellaswag.h). */
#include <stdlib.h>
#include <string.h>

#include "core/watchdog.h"
#include "train/internal.h"

static void fill_row(void *ctx, int row, int *tokens, int *targets, int *from, int *to)
{
    ts_hellaswag_row(ctx, row, tokens, targets, from, to);
}

void ts_trainer_hellaswag(ts_trainer *t, ts_hellaswag_score *out, double *row_loss)
{
    ts_hellaswag *h = &t->hellaswag;
    double *loss = ts_calloc((size_t)h->n_rows, sizeof *loss);
    const ts_engine_rows rows = {.n_rows = h->n_rows, .unit = TS_HS_ENDINGS, .fill = fill_row,
                                 .ctx = h};
    /* ZeRO-3: the forwards need every chunk's weights; gathered for the evaluation. */
    ts_watchdog_context("hellaswag: gathering the ZeRO-3 weights", 0, 0, 0);
    ts_zero_materialize(&t->zero, TS_ZERO_GATHER_COMPUTE);
    ts_engine_score(&t->engine, &rows, loss);
    ts_zero_dematerialize(&t->zero, false);
    /* Each row's sum is on the last stage's ranks of the one replica that scored it: the
     * tp ranks hold the same (tp rank 0's counts), the cp ranks each their positions'. A
     * sum over the world of values and zeros: every rank gets every row. */
    ts_watchdog_context("hellaswag: summing the rows' losses", 0, 0, 0);
    if (t->model.tp.rank != 0) memset(loss, 0, (size_t)h->n_rows * sizeof *loss);
    ts_host_allreduce_sum_f64(&t->groups->world, loss, h->n_rows);
    ts_hellaswag_score_rows(h, loss, out);
    if (row_loss) memcpy(row_loss, loss, (size_t)h->n_rows * sizeof *loss);
    free(loss);
}
