#!/usr/bin/python3
"""Generate Tessera's Llama correctness fixture with a PyTorch reference (tests/torch_llama.py,
Hugging Face's LlamaForCausalLM written out; tests/check_llama_hf.py compares it with
transformers' own).

Writes (deterministically; rerunning gives byte-identical files):
  tests/fixtures/llama_tiny_weights.safetensors  float32 weights, HF names
  tests/fixtures/llama_tiny_expect.safetensors   float64 reference: loss, gradients,
                                                 5 AdamW steps (losses, lrs, grad norms,
                                                 final parameters)

The model is a tiny grouped-query llama (2 layers, C 32, 4 query heads sharing 2
key/value heads, SwiGLU width 48, vocabulary 96, T 16, rope_theta 10000, lm_head untied).
Weights: Tessera's llama init (matrices and the embedding normal(0, 0.02), RMSNorm weights
1) drawn with torch.manual_seed(42), except q_proj and k_proj at normal(0, 0.2) so that
the attention is far from uniform and the rotary embedding changes the loss (printed);
then every RMSNorm weight + normal(0, 0.1) so that the norms' weights matter. The
optimizer is the contract's ("Optimizer"), exactly as tests/make_fixture.py takes it for
GPT-2: linear warmup then cosine, clip_grad_norm_(1.0) over every parameter, AdamW with
weight decay on the tensors of two or more dimensions (every matrix and the embedding, not
the RMSNorm weights). The reference is computed in float64 from exactly the float32
values stored in the weights file; the batch, the seeds, the optimizer steps and the
files' layout are tests/torch_common.py's (FIXTURE, make_fixture).

Run:  /usr/bin/python3 tests/make_llama_fixture.py   (needs torch; no other packages)
"""
import os
import sys

import torch

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
from torch_llama import Llama, Shape, init_weights, param_names  # noqa: E402

# ---- hyperparameters (the batch, seeds and optimizer: torch_common.FIXTURE) ---------------
SHAPE = Shape(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=96,
              seq_len=16, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)
QK_STD = 0.2            # q_proj, k_proj: peaked attention, so that RoPE matters
NORM_PERTURB = 0.1      # noise added to the RMSNorm weights after init


def qk_std(name):
    return QK_STD if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02


def main():
    names = param_names(SHAPE)
    fx = tc.make_fixture(
        "llama_tiny", lambda: Llama(SHAPE), names,
        lambda m: init_weights(m, names, NORM_PERTURB, qk_std), SHAPE.meta(), SHAPE.vocab_size,
        "Tessera's llama init (matrices and embedding normal 0.02, RMSNorm weights 1) "
        f"except q_proj, k_proj normal {QK_STD}; then every RMSNorm weight perturbed "
        f"by +normal(0,{NORM_PERTURB})")

    # the same weights without the rotary embedding (angle 0): how much RoPE matters here
    with torch.no_grad():
        m_norope = fx.fresh_double()
        m_norope.rope_cos = torch.ones_like(m_norope.rope_cos)
        m_norope.rope_sin = torch.zeros_like(m_norope.rope_sin)
        loss_norope = m_norope(fx.tokens, fx.targets).item()
    return tc.report_fixture(
        fx, SHAPE.vocab_size,
        [f"loss without rotary embedding {loss_norope:.10f} (differs by "
         f"{abs(loss_norope - fx.loss0):.3g})"],
        abs(loss_norope - fx.loss0) > 1e-4)


if __name__ == "__main__":
    sys.exit(main())
