#!/usr/bin/env python3
"""PyTorch peer for the GPU benchmark: GPT-2 trained the nanoGPT way on one GPU.

The model of docs/CONTRACT.md "Model (gpt2)" (nanoGPT's GPT-2: learned position embeddings,
pre-LayerNorm blocks, tanh GELU, LM head tied to the token embedding, CONTRACT's init),
with nanoGPT's speed settings: bf16 autocast around forward and loss (parameters,
gradients and AdamW state stay fp32), F.scaled_dot_product_attention(is_causal=True)
(flash attention on the GPU), fused AdamW, TF32 allowed for the few fp32 matmuls left,
clip_grad_norm_(1.0), zero_grad(set_to_none=True). The vocabulary is the real 50257 (not
nanoGPT's padded 50304), as Tessera runs it.

Runs each --modes entry in this process, eager first: "eager", then "compile"
(torch.compile, inductor's default mode). Per mode: warm-up steps (for compile the first
one compiles; its time is reported as compile_s and excluded), then --steps steps, each
timed with CUDA events and ended by loss.item() (as Tessera reports each step's loss).
Prints ONE JSON line per mode as soon as it is done: tokens_per_s is
tokens_per_step / median_step_ms.

With --device cpu (the benchmark's dry run) it runs in fp32 without autocast; where this
torch lacks scaled_dot_product_attention the attention is written out, and where it lacks
torch.compile the compile mode prints {"skipped": reason}.

  python3 bench/gpu/torch_gpt2_gpu.py --batch 16 --steps 25 --modes eager,compile
"""
import argparse
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the dry run's CPU torch): the same math written out
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, seq_len):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(seq_len, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        std_res = 0.02 / math.sqrt(2 * n_layer)
        for name, p in self.named_parameters():  # CONTRACT init
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                nn.init.constant_(p, 1.0 if name.endswith(".weight") else 0.0)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std_res if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def run_mode(mode, a, device):
    torch.manual_seed(a.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.seq_len).to(device)
    params = list(model.parameters())  # the tied weight once
    n_params = sum(p.numel() for p in params)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if fused else {}))
    fwd = model
    if mode == "compile":
        fwd = torch.compile(model)
    use_amp = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(a.seed)
    B, T, V = a.batch, a.seq_len, a.vocab_size

    def step():
        seq = torch.randint(0, V, (B, T + 1), generator=g, device=device)
        x, y = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
        if use_amp:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
        else:
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # waits for the step

    losses = []
    t0 = time.perf_counter()
    losses.append(step())  # compile happens here (and the first-call set-up in eager)
    first_s = time.perf_counter() - t0
    for _ in range(a.warmup_steps - 1):
        losses.append(step())
    step_ms = []
    for _ in range(a.steps):
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            losses.append(step())
            e1.record()
            e1.synchronize()
            step_ms.append(e0.elapsed_time(e1))
        else:
            t1 = time.perf_counter()
            losses.append(step())
            step_ms.append(1000.0 * (time.perf_counter() - t1))
    med = statistics.median(step_ms)
    out = {
        "impl": "pytorch", "mode": mode, "torch": torch.__version__, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": "bf16-autocast" if use_amp else "fp32",
        "attn": "sdpa" if HAVE_SDPA else "manual", "fused_adamw": fused,
        "params": n_params, "batch": B, "seq_len": T, "tokens_per_step": B * T,
        "warmup_steps": a.warmup_steps, "steps": a.steps,
        "median_step_ms": round(med, 3), "mean_step_ms": round(statistics.mean(step_ms), 3),
        "min_step_ms": round(min(step_ms), 3),
        "tokens_per_s": round(B * T / (med / 1000.0), 1),
        "first_step_s": round(first_s, 2),
        "compile_s": round(first_s, 2) if mode == "compile" else None,
        "peak_mem_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
        if device.type == "cuda" else None,
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
    }
    if not all(math.isfinite(l) for l in losses):
        out["error"] = "non-finite loss"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--n_embd", type=int, default=768)
    ap.add_argument("--vocab_size", type=int, default=50257)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=25, help="timed steps per mode")
    ap.add_argument("--warmup_steps", type=int, default=3, help="untimed steps first (>= 1)")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "compile")]
    if bad or not modes:
        ap.error(f"--modes '{a.modes}': choose from eager,compile (comma-separated)")
    if a.warmup_steps < 1 or a.steps < 1:
        ap.error("--warmup_steps and --steps must be at least 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch", "error": "no CUDA device visible to torch "
                          f"{torch.__version__}"}), flush=True)
        return 1
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT
        torch.backends.cudnn.allow_tf32 = True
    rc = 0
    for mode in modes:
        if mode == "compile" and not hasattr(torch, "compile"):
            print(json.dumps({"impl": "pytorch", "mode": mode, "torch": torch.__version__,
                              "skipped": f"torch {torch.__version__} has no torch.compile"}),
                  flush=True)
            continue
        try:
            out = run_mode(mode, a, device)
        except Exception as e:  # report and go on to the next mode
            out = {"impl": "pytorch", "mode": mode, "error": f"{type(e).__name__}: {e}"[:500]}
        if "error" in out:
            rc = 1
        print(json.dumps(out), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
