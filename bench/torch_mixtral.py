#!/usr/bin/python3
"""PyTorch peer for Tessera's MoE benchmark (bench/moe.sh): Hugging Face's MixtralForCausalLM
training on CPU.

The model is transformers' own MixtralForCausalLM (not a rewrite: the peer is what a team
would run), built from a MixtralConfig of the given shape with HF's random init: RMSNorm,
grouped-query attention (attn_implementation "sdpa" on torch 2, else "eager"), RoPE, and
each block's MLP a softmax top-k router over `--experts` SwiGLU experts of width
`--moe_ffn_hidden`, renormalised over the top k (Mixtral's), dropless; untied lm_head. No
router aux loss (output_router_logits False: Tessera's train.moe_aux_loss = 0 is the same
work). `--experts_impl` picks transformers' experts kernel: "eager" (HF's default: a loop
over the experts that were hit, index_add_ to combine), "grouped_mm" or "batched_mm".

The step is bench/torch_gpt2.py's time_training (shared with bench/torch_llama.py):
forward, mean cross-entropy over the logits, backward, clip_grad_norm_(1.0), AdamW (decay
on matrices, torch's defaults for foreach/fused), zero_grad(set_to_none); --warmup_steps
untimed (torch.compile compiles in the first), then --steps timed one by one.
--precision bf16: CPU autocast around forward and loss (float32 parameters, gradients and
AdamW state); --compile: torch.compile around the model and loss. torch.set_num_threads
(--threads), torch.set_num_interop_threads(1). Prints ONE JSON line (median_step_ms,
min_step_ms, tokens_per_s, params, active_params, peak_rss_mb, ...). What the installed
torch or transformers lacks is refused with exit status 2.

Example (issue 39's shape):
  PY=$(scripts/peer_venv.sh); $PY bench/torch_mixtral.py --n_layer 4 --n_embd 512 \
      --n_head 8 --n_kv_head 8 --experts 8 --top_k 2 --moe_ffn_hidden 1024 \
      --vocab_size 32000 --seq_len 512 --batch 2 --threads 2 --steps 3 --warmup_steps 2
"""
import argparse
import importlib.util
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep bench/ free of __pycache__
# bench/torch_gpt2.py's option checks and timed loop (by path: tests/ has a torch_gpt2 too).
_spec = importlib.util.spec_from_file_location(
    "bench_torch_gpt2", os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gpt2.py"))
_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_peer)
refuse_missing, time_training = _peer.refuse_missing, _peer.time_training


class LossOf(nn.Module):
    """The HF model and the loss as one module, so that torch.compile and autocast take
    both (as bench/torch_llama.py's model returns its loss): mean cross-entropy of the
    next-token logits, computed in float32."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, x, y):
        logits = self.hf(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_kv_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=64)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top_k", type=int, default=2)
    ap.add_argument("--moe_ffn_hidden", type=int, default=128)
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--rope_theta", type=float, default=1e6)
    ap.add_argument("--norm_eps", type=float, default=1e-5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup_steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--experts_impl", choices=["eager", "grouped_mm", "batched_mm"],
                    default="eager")
    a = ap.parse_args()
    # HF's attention: SDPA where the torch has it (time_training's JSON reports a.attn)
    a.attn = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "eager"
    refuse_missing(ap, a)
    try:
        import transformers
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError as e:
        ap.error(f"needs transformers with Mixtral ({e}); run scripts/peer_venv.sh's python")
    if a.n_embd % a.n_head or a.n_head % a.n_kv_head or not 1 <= a.top_k <= a.experts:
        ap.error("shape: n_embd % n_head, n_head % n_kv_head must be 0 and 1 <= top_k <= experts")

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)

    kw = {}
    if a.experts_impl != "eager":
        kw["experts_implementation"] = a.experts_impl  # transformers 5's ExpertsInterface
    cfg = MixtralConfig(
        vocab_size=a.vocab_size, hidden_size=a.n_embd, intermediate_size=a.moe_ffn_hidden,
        num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
        num_key_value_heads=a.n_kv_head, head_dim=a.n_embd // a.n_head,
        max_position_embeddings=a.seq_len, rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta,
        tie_word_embeddings=False, num_local_experts=a.experts, num_experts_per_tok=a.top_k,
        output_router_logits=False, router_aux_loss_coef=0.0, sliding_window=None,
        attention_dropout=0.0, use_cache=False, attn_implementation=a.attn, **kw)
    try:
        hf = MixtralForCausalLM(cfg)
    except (TypeError, ValueError) as e:
        ap.error(f"transformers {transformers.__version__}: {e}")
    hf.train()
    model = LossOf(hf)
    params = [p for p in model.parameters() if p.requires_grad]

    # The parameters one token uses (the routed experts it does not reach are left out),
    # for the caller's active-FLOPs count; the 3-D expert tensors of transformers 5 or
    # the per-expert w1/w2/w3 of transformers 4 both count as 3 * F * C per expert.
    n_total = sum(p.numel() for p in params)
    expert = 3 * a.moe_ffn_hidden * a.n_embd
    active = n_total - a.n_layer * (a.experts - a.top_k) * expert
    time_training(a, model, params, {
        "model": "mixtral", "transformers": transformers.__version__,
        "experts_impl": a.experts_impl, "active_params": active})


if __name__ == "__main__":
    main()
