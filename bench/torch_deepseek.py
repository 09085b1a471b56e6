#!/usr/bin/python3
"""PyTorch peer for Tessera's DeepSeek-V3-shaped benchmark (bench/deepseek.sh): Hugging Face's
DeepseekV3ForCausalLM training on CPU.

The model is transformers' own DeepseekV3ForCausalLM (not a rewrite: the peer is what a team
would run), built from a DeepseekV3Config of the given shape with HF's random init:
RMSNorm; multi-head latent attention (q through a `--q_lora_rank` latent with its RMSNorm, or
a plain q projection when it is 0; k and v from a `--kv_lora_rank` latent with its RMSNorm;
each q and k head `--qk_nope_head_dim` channels without RoPE then `--qk_rope_head_dim` with
it, the rope key one head shared by all; values of `--v_head_dim`), HF's interleaved RoPE
(rope_interleave, DeepSeek's checkpoint layout), attn_implementation "sdpa" on torch 2 (else
"eager"); the first `--first_dense` blocks a dense SwiGLU of `--ffn_hidden`, the others
DeepSeekMoE: a sigmoid router over `--experts` SwiGLU experts of width `--moe_ffn_hidden`,
group-limited (`--groups` groups, the best `--topk_groups` of them by their top-2 scores),
`--top_k` per token renormalised and times `--route_scale`, plus `--shared_experts` shared
experts (one SwiGLU of shared_experts * moe_ffn_hidden); untied lm_head. No balancing: HF's
router has no aux loss in training and its e_score_correction_bias is a buffer nothing
updates (Tessera's train.moe_aux_loss = 0 and moe_bias_rate = 0 are the same work). No
multi-token prediction: transformers' DeepseekV3ForCausalLM has none (its config's
num_mtp_layers is not used by the model; the hub's layer-61 MTP weights are ignored on
load), so there is no peer for Tessera's MTP rows. `--experts_impl` picks transformers'
experts kernel: "eager" (HF's default: a loop over the experts that were hit, index_add_ to
combine), "grouped_mm" or "batched_mm".

The step is bench/torch_step_common.py's (shared with bench/torch_mixtral.py): bench/torch_gpt2.py's time_training:
forward, mean cross-entropy over the logits, backward, clip_grad_norm_(1.0), AdamW (decay
on matrices, torch's defaults for foreach/fused), zero_grad(set_to_none); --warmup_steps
untimed (torch.compile compiles in the first), then --steps timed one by one.
--precision bf16: CPU autocast around forward and loss (float32 parameters, gradients and
AdamW state; HF keeps the router in fp32); --compile: torch.compile around the model and
loss. torch.set_num_threads(--threads), torch.set_num_interop_threads(1). Prints ONE JSON
line (median_step_ms, min_step_ms, tokens_per_s, params, active_params, peak_rss_mb, ...).
What the installed torch or transformers lacks is refused with exit status 2.

Example (issue 41's shape):
  PY=$(scripts/peer_venv.sh); $PY bench/torch_deepseek.py --n_layer 4 --n_embd 512 \
      --n_head 8 --q_lora_rank 192 --kv_lora_rank 64 --qk_nope_head_dim 32 \
      --qk_rope_head_dim 32 --v_head_dim 64 --experts 8 --top_k 2 --moe_ffn_hidden 512 \
      --groups 2 --topk_groups 1 --shared_experts 1 --first_dense 1 --ffn_hidden 1536 \
      --vocab_size 32000 --seq_len 512 --batch 2 --threads 2 --steps 3 --warmup_steps 2
"""
import argparse
import sys

sys.dont_write_bytecode = True  # keep bench/ free of __pycache__
import torch_step_common as common  # noqa: E402 (bench/, this script's folder)


def active_params(a, n_total):
    """The parameters one token uses: all of them but the routed experts it does not
    reach (E - K of each MoE block's, 3 * FE * C each) and the embedding lookup is left to
    the caller. The router (E x C) and the shared experts count."""
    n_moe = max(a.n_layer - a.first_dense, 0) if a.experts > 0 else 0
    return n_total - n_moe * (a.experts - a.top_k) * 3 * a.moe_ffn_hidden * a.n_embd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=64)
    ap.add_argument("--q_lora_rank", type=int, default=48, help="0: a plain q projection")
    ap.add_argument("--kv_lora_rank", type=int, default=32)
    ap.add_argument("--qk_nope_head_dim", type=int, default=16)
    ap.add_argument("--qk_rope_head_dim", type=int, default=8)
    ap.add_argument("--v_head_dim", type=int, default=16)
    common.add_moe_arguments(ap, experts=8, moe_ffn_hidden=64)
    ap.add_argument("--shared_experts", type=int, default=1)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--topk_groups", type=int, default=1)
    ap.add_argument("--route_scale", type=float, default=2.5)
    ap.add_argument("--first_dense", type=int, default=1)
    ap.add_argument("--ffn_hidden", type=int, default=192, help="the dense blocks' SwiGLU width")
    common.add_step_arguments(ap, rope_theta=10000.0, norm_eps=1e-6)
    a = common.parse(ap)
    try:
        import transformers
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    except ImportError as e:
        ap.error(f"needs transformers with DeepSeek-V3 (4.50 or later: {e}); run "
                 "scripts/peer_venv.sh's python")
    if a.kv_lora_rank <= 0 or a.qk_rope_head_dim <= 0 or a.qk_rope_head_dim % 2 or a.v_head_dim <= 0:
        ap.error("shape: kv_lora_rank > 0, an even qk_rope_head_dim > 0 and v_head_dim > 0")
    if a.experts > 0 and (not 1 <= a.top_k <= a.experts or a.groups < 1 or a.experts % a.groups
                          or not 1 <= a.topk_groups <= a.groups
                          or a.experts // a.groups < 2
                          or a.top_k > a.topk_groups * (a.experts // a.groups)):
        ap.error("shape: 1 <= top_k <= experts, groups divide experts with at least 2 experts "
                 "a group (HF scores a group by its top 2), 1 <= topk_groups <= groups, and "
                 "top_k experts within topk_groups groups")
    if a.experts <= 0 and a.first_dense < a.n_layer:
        ap.error("--experts 0 needs --first_dense >= --n_layer (every block dense)")

    kw = common.start(a)
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    try:
        cfg = DeepseekV3Config(
            vocab_size=a.vocab_size, hidden_size=a.n_embd, intermediate_size=a.ffn_hidden,
            moe_intermediate_size=a.moe_ffn_hidden, num_hidden_layers=a.n_layer,
            num_attention_heads=a.n_head, num_key_value_heads=a.n_head,
            n_shared_experts=a.shared_experts, n_routed_experts=max(a.experts, 1),
            routed_scaling_factor=a.route_scale, kv_lora_rank=a.kv_lora_rank,
            q_lora_rank=a.q_lora_rank if a.q_lora_rank > 0 else None,
            qk_rope_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim,
            qk_nope_head_dim=a.qk_nope_head_dim, n_group=a.groups, topk_group=a.topk_groups,
            num_experts_per_tok=a.top_k, first_k_dense_replace=a.first_dense,
            norm_topk_prob=True, hidden_act="silu", max_position_embeddings=a.seq_len,
            rms_norm_eps=a.norm_eps, use_cache=False, tie_word_embeddings=False,
            rope_parameters=rope, rope_interleave=True, attention_bias=False,
            attention_dropout=0.0, output_router_logits=False, attn_implementation=a.attn,
            **kw)
        hf = DeepseekV3ForCausalLM(cfg)
    except (TypeError, ValueError, KeyError) as e:
        ap.error(f"transformers {transformers.__version__}: {e}")
    common.train(a, hf, lambda n_total: active_params(a, n_total),
                 {"model": "deepseek_v3", "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
