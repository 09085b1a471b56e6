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

The step is bench/torch_step_common.py's: bench/torch_gpt2.py's time_training (as in bench/torch_llama.py):
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
import sys

sys.dont_write_bytecode = True  # keep bench/ free of __pycache__
import torch_step_common as common  # noqa: E402 (bench/, this script's folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_kv_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=64)
    common.add_moe_arguments(ap, experts=4, moe_ffn_hidden=128)
    common.add_step_arguments(ap, rope_theta=1e6, norm_eps=1e-5)
    a = common.parse(ap)
    try:
        import transformers
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError as e:
        ap.error(f"needs transformers with Mixtral ({e}); run scripts/peer_venv.sh's python")
    if a.n_embd % a.n_head or a.n_head % a.n_kv_head or not 1 <= a.top_k <= a.experts:
        ap.error("shape: n_embd % n_head, n_head % n_kv_head must be 0 and 1 <= top_k <= experts")

    kw = common.start(a)
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

    # The parameters one token uses (the routed experts it does not reach are left out),
    # for the caller's active-FLOPs count; the 3-D expert tensors of transformers 5 or
    # the per-expert w1/w2/w3 of transformers 4 both count as 3 * F * C per expert.
    expert = 3 * a.moe_ffn_hidden * a.n_embd
    common.train(a, hf, lambda n_total: n_total - a.n_layer * (a.experts - a.top_k) * expert,
                 {"model": "mixtral", "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
