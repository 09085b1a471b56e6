#!/usr/bin/python3
"""PyTorch peer for Tessera's throughput benchmark: nanoGPT GPT-2 training on CPU.

Same model as docs/CONTRACT.md "Model (gpt2)" (the nanoGPT definition is shared with
tests/make_fixture.py), nanoGPT-style step: forward, mean cross-entropy, backward,
clip_grad_norm_(1.0), AdamW (torch defaults for foreach/fused), zero_grad(set_to_none).
Each timed step is timed on its own: ms_per_step is the mean, median_step_ms and
min_step_ms summarise step_ms (the machine may be shared; the median resists outliers).
The thread budget is set explicitly: torch.set_num_threads(--threads) and
torch.set_num_interop_threads(1). Prints ONE JSON line.

--precision bf16 is mixed precision as a PyTorch user writes it on a CPU:
torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss; the parameters,
gradients and AdamW state stay float32 (the backward runs outside the context, as the
autocast docs prescribe). --compile wraps the model (forward and loss) in torch.compile
(inductor's default mode); the warm-up steps absorb the compilation (the first one's time
is reported as first_step_s), so give it at least 2. --attn sdpa replaces the written-out
attention with F.scaled_dot_product_attention(is_causal=True), nanoGPT's choice on
torch 2. What the installed torch lacks (Debian's 1.13 has no torch.compile and no SDPA)
is refused with exit status 2 before anything runs.

Examples:
  /usr/bin/python3 bench/torch_gpt2.py --n_layer 4 --n_head 4 --n_embd 128 \
      --vocab_size 256 --seq_len 64 --batch 16 --threads 2 --steps 10 --warmup_steps 2
  PY=$(scripts/peer_venv.sh); $PY bench/torch_gpt2.py --n_layer 12 --n_head 12 \
      --n_embd 768 --vocab_size 50257 --seq_len 1024 --batch 2 --threads 2 --steps 3 \
      --warmup_steps 2 --precision bf16 --compile
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import make_fixture  # noqa: E402  (same nanoGPT model)
from make_fixture import GPT, param_names  # noqa: E402


def sdpa_attention_forward(self, x):
    """make_fixture.CausalSelfAttention.forward with F.scaled_dot_product_attention."""
    Bx, Tx, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(Bx, Tx, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(Bx, Tx, C))


def refuse_missing(ap, a):
    """ap.error (exit 2) for an option this torch cannot run."""
    v = torch.__version__
    if a.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile: torch {v} has no torch.compile (it came in torch 2.0); "
                 "run a torch 2 python, e.g. the one scripts/peer_venv.sh prints")
    if a.attn == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        ap.error(f"--attn sdpa: torch {v} has no F.scaled_dot_product_attention (torch 2.0 "
                 "added it); use --attn manual or a torch 2 python (scripts/peer_venv.sh)")
    if a.precision == "bf16":
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ok = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        except (AttributeError, RuntimeError, TypeError) as e:
            ap.error(f"--precision bf16: torch {v} has no CPU bfloat16 autocast ({e})")
        if not ok:
            ap.error(f"--precision bf16: torch {v}'s CPU autocast does not run matmuls "
                     "in bfloat16")


def time_training(a, model, params, fields):
    """nanoGPT's training step on random tokens (AdamW with decay on matrices only, clip
    1.0, bf16 autocast with --precision bf16, torch.compile with --compile): a.warmup_steps
    untimed, then a.steps timed one by one; prints one JSON line of `fields` and the
    timings. Shared by this script and bench/torch_llama.py."""
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    g = torch.Generator().manual_seed(a.seed)
    B, T, V = a.batch, a.seq_len, a.vocab_size
    fwd = torch.compile(model) if a.compile else model
    amp = a.precision == "bf16"

    def step():
        seq = torch.randint(0, V, (B, T + 1), generator=g)
        x, y = seq[:, :T], seq[:, 1:]
        # F.cross_entropy(logits.view(-1, V), y.view(-1)), mean
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    losses = []
    first_s = None
    for i in range(a.warmup_steps):
        t1 = time.perf_counter()
        losses.append(step())  # compiles, with --compile (forward and backward graphs)
        if i == 0:
            first_s = time.perf_counter() - t1
    step_ms = []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        t1 = time.perf_counter()
        losses.append(step())  # loss.item() waits for the step: CPU ops are synchronous
        step_ms.append(1000.0 * (time.perf_counter() - t1))
    dt = time.perf_counter() - t0

    ms = 1000.0 * dt / max(a.steps, 1)
    srt = sorted(step_ms)
    med = (srt[len(srt) // 2] if len(srt) % 2 else 0.5 * (srt[len(srt) // 2 - 1] + srt[len(srt) // 2])) if srt else None
    print(json.dumps({
        "impl": "pytorch", **fields, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "attn": a.attn, "precision": a.precision, "compile": a.compile,
        "first_step_s": round(first_s, 3) if first_s is not None else None,
        "params": n_params, "tokens_per_step": B * T,
        "ms_per_step": round(ms, 3),
        "median_step_ms": round(med, 3) if med is not None else None,
        "min_step_ms": round(srt[0], 3) if srt else None,
        "step_ms": [round(t, 3) for t in step_ms],
        "tokens_per_s": round(B * T * a.steps / dt, 1) if dt > 0 else None,
        "losses": [round(l, 6) for l in losses],
        # the process's peak resident set (Linux: ru_maxrss in KiB), model and steps included
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=128)
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup_steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--attn", choices=["manual", "sdpa"], default="manual",
                    help="attention: written out (make_fixture's) or "
                         "F.scaled_dot_product_attention (torch 2)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: CPU autocast to bfloat16 around forward and loss, "
                         "fp32 master weights")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (torch 2; warm-up steps absorb it)")
    a = ap.parse_args()
    refuse_missing(ap, a)
    if a.attn == "sdpa":
        make_fixture.CausalSelfAttention.forward = sdpa_attention_forward

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)

    model = GPT(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.seq_len)
    names = param_names(a.n_layer)
    pm = dict(model.named_parameters())  # tied lm_head.weight appears once
    std_res = 0.02 / math.sqrt(2 * a.n_layer)
    with torch.no_grad():  # CONTRACT init
        for n in names:
            p = pm[n]
            if ".ln_" in n or n.startswith("transformer.ln_f"):
                p.fill_(1.0 if n.endswith(".weight") else 0.0)
            elif n.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std_res if n.endswith("c_proj.weight") else 0.02)
    params = [pm[n] for n in names]
    model.train()
    time_training(a, model, params, {})


if __name__ == "__main__":
    main()
