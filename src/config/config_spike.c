/* The spike guard's rule (train.skip_spikes, train.spike_window; train/spike_guard.h),
 * checked against the rest of the config after ts_config_validate's own checks. Nothing
 * here prints. */
#include "config/config_internal.h"

#include <math.h>

ts_status ts_config_validate_spikes(const ts_config *cfg)
{
    const ts_train_config *t = &cfg->train;
    if (t->skip_spikes == 0.0) return TS_OK;
    /* The step's own value is in its window (llm.c's z-score), so no z-score exceeds
     * sqrt(W - 1): a threshold there or above would never skip (a key in effect ignored). */
    const double most = sqrt((double)t->spike_window - 1.0);
    if (t->skip_spikes >= most)
        return ts_fail("config key 'train.skip_spikes' = %g can never skip a step: a step's "
                       "z-score over a window of train.spike_window = %d steps (its own value "
                       "included, as llm.c computes it) is at most sqrt(%d - 1) = %.4g; lower "
                       "skip_spikes or widen spike_window (llm.c's 128 allows up to %.4g)",
                       t->skip_spikes, t->spike_window, t->spike_window, most, sqrt(127.0));
    return TS_OK;
}
