/* Multi-token prediction's rules (model.mtp_layers, train.mtp_loss; docs/CONTRACT.md
 * "Model"), checked against the rest of the config after ts_config_validate's own
 * checks. Nothing here prints. */
#include "config/config_internal.h"

#include <string.h>

ts_status ts_config_validate_mtp(const ts_config *cfg)
{
    const ts_model_config *m = &cfg->model;
    const ts_parallel_config *p = &cfg->parallel;
    const int D = m->mtp_layers;
    if (D == 0) return TS_OK;
    /* DeepSeek-V3's modules (RMSNorms, its checkpoint names) are the llama family's. */
    if (ts_model_arch(m) != TS_ARCH_LLAMA)
        return ts_fail("config key 'model.mtp_layers' = %d: multi-token prediction is built for "
                       "the llama family (model.arch = \"llama\"), not %s",
                       D, m->arch);
    /* Depth D predicts t_{i+D+1}: some position must have that target in the window. */
    if (D >= m->seq_len)
        return ts_fail("config key 'model.mtp_layers' = %d: depth %d predicts %d tokens ahead, "
                       "past every position of a model.seq_len = %d window; lower mtp_layers",
                       D, D, D + 1, m->seq_len);
    /* tp_overlap's sub-batches: the modules are not split into them (not built). */
    if (p->tp_overlap > 1)
        return ts_fail("config keys 'model.mtp_layers' = %d and 'parallel.tp_overlap' = %d: "
                       "multi-token prediction does not run in tp_overlap's sub-batches yet; "
                       "set parallel.tp_overlap = 1",
                       D, p->tp_overlap);
    return TS_OK;
}
