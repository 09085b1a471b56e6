"""What the Hugging Face MoE peers of Tessera's step benchmarks share (bench/torch_mixtral.py
for bench/moe.sh, bench/torch_deepseek.py for bench/deepseek.sh): their common options, the
model-and-loss module, the torch set-up and the timed loop, which is bench/torch_gpt2.py's
time_training (forward, mean cross-entropy, backward, clip_grad_norm_(1.0), AdamW,
zero_grad; --warmup_steps untimed, then --steps timed; ONE JSON line). Each peer keeps its
own config class, shape options and checks, and its count of active parameters."""
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


def add_moe_arguments(ap, experts, moe_ffn_hidden):
    """The routed experts' shape: --experts of width --moe_ffn_hidden, --top_k a token."""
    ap.add_argument("--experts", type=int, default=experts)
    ap.add_argument("--top_k", type=int, default=2)
    ap.add_argument("--moe_ffn_hidden", type=int, default=moe_ffn_hidden)


def add_step_arguments(ap, rope_theta, norm_eps):
    """The vocabulary, sequence, RoPE and norm, and the step's options (batch, threads,
    steps, optimizer, precision, torch.compile, transformers' experts kernel)."""
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--rope_theta", type=float, default=rope_theta)
    ap.add_argument("--norm_eps", type=float, default=norm_eps)
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


def parse(ap):
    """The options, with HF's attention: SDPA where the torch has it (time_training's JSON
    reports a.attn); what the torch lacks is refused."""
    a = ap.parse_args()
    a.attn = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "eager"
    refuse_missing(ap, a)
    return a


def start(a):
    """Threads and the seed, before the model is built (its random init); the config's
    keyword for transformers' experts kernel (none for its default, "eager")."""
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)
    if a.experts_impl != "eager":
        return {"experts_implementation": a.experts_impl}  # transformers 5's ExpertsInterface
    return {}


def train(a, hf, active_params, info):
    """Times the step of `hf`; active_params(n_total) gives the parameters one token uses
    (for the caller's active-FLOPs count), info the JSON's model fields."""
    hf.train()
    model = LossOf(hf)
    params = [p for p in model.parameters() if p.requires_grad]
    n_total = sum(p.numel() for p in params)
    time_training(a, model, params, dict(info, experts_impl=a.experts_impl,
                                         active_params=active_params(n_total)))
