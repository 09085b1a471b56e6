/* The sub-batch runner (phase_runner.h): step by step, every sub-batch in turn. */
#include "tensor/phase_runner.h"

#include "core/error.h"

void ts_phase_run(const ts_tp *tp, int S, const ts_phase_step *steps, int n_steps, void *ctx)
{
    TS_ASSERT(1 <= S && S <= TS_TP_OVERLAP_MAX);
    if (S == 1) {
        for (int j = 0; j < n_steps; j++) steps[j](ctx, 0, NULL);
        return;
    }
    ts_tp_pending pending[TS_TP_OVERLAP_MAX] = {0};
    for (int j = 0; j < n_steps; j++)
        for (int i = 0; i < S; i++) {
            ts_tp_finish(tp, &pending[i]); /* what step j-1 of sub-batch i started */
            steps[j](ctx, i, &pending[i]);
            for (int q = 0; q < S; q++) ts_tp_poll(&pending[q]);
        }
    for (int i = 0; i < S; i++) ts_tp_finish(tp, &pending[i]);
}
