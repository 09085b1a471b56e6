/* Tessera's llama against PyTorch (tests/make_llama_fixture.py, float64; its model,
 * tests/torch_llama.py, is Hugging Face's LlamaForCausalLM written out and checked against
 * transformers by tests/check_llama_hf.py): a grouped-query llama (4 query heads sharing 2
 * key/value heads, RoPE theta 10000, SwiGLU width 48, RMSNorm weights away from 1, lm_head
 * untied). The loss and every parameter gradient of one batch, then 5 AdamW steps with
 * clipping and the LR schedule (tests/fixture_check.h). This is what proves the model is
 * Hugging Face's llama. */
#include "fixture_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

int main(void)
{
    ts_test_require_blas_core();
    ts_config cfg;
    fixture_llama_config(&cfg);
    ts_config_resolve_model(&cfg.model);
    fixture_train_config(&cfg.train);
    /* The embedding, 9 per block, the final norm and the head. */
    return fixture_check(&cfg, "llama_tiny", 2 + 9 * 2 + 1, NULL);
}
