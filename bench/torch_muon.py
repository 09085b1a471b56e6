"""PyTorch's optimizer step on a GPT-2-124M-shaped Llama's parameters: the peer of
bench/muon.sh. No model is run: the parameters are leaf tensors of the Llama's shapes
(embedding and untied head [vocab, 768], q/k/v/o [768, 768], gate/up [2048, 768], down
[768, 2048], two RMSNorm weights a block and the final one) with fixed random gradients,
and one timed step is what Tessera's trainer does after the gradient reduction (its
metrics' optim_ms): the global gradient norm clipped to 1.0, then

  adamw: torch.optim.AdamW on every parameter;
  muon:  torch.optim.Muon (adjust_lr_fn "match_rms_adamw", Tessera's default) on the
         blocks' matrices and torch.optim.AdamW on the rest, as train.optimizer = "muon".

torch.optim.Muon runs Newton-Schulz in bfloat16 (it casts the momentum to bf16 before the
iteration, whatever the parameters' dtype); --ns_dtype float32 replaces its iteration by
the same one in float32 (the arithmetic Tessera's fp32 run does), to compare like with
like. Also the iteration alone over the model's matrices (ns_ms). One JSON line.
Usage: torch_muon.py --optimizer adamw|muon [--ns_dtype bfloat16|float32] [--threads N]
       [--steps N] [--warmup N] [--layers N] [--vocab N]
"""

import argparse
import json
import statistics
import time

import torch
import torch.optim._muon as muon_mod


def ns_float32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's iteration with float32 instead of bfloat16 operands."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float32, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        upd = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, upd, x, beta=a)
    return x.T if tall else x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", choices=["adamw", "muon"], required=True)
    ap.add_argument("--ns_dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.ns_dtype == "float32":
        muon_mod._zeropower_via_newtonschulz = ns_float32

    d, f = 768, 2048
    other = [torch.randn(args.vocab, d) * 0.02, torch.randn(args.vocab, d) * 0.02,
             torch.ones(d)]
    mats = []
    for _ in range(args.layers):
        other += [torch.ones(d), torch.ones(d)]
        mats += [torch.randn(d, d) * 0.02 for _ in range(4)]
        mats += [torch.randn(f, d) * 0.02, torch.randn(f, d) * 0.02, torch.randn(d, f) * 0.02]
    params = other + mats
    for p in params:
        p.requires_grad_(True)
        p.grad = torch.randn_like(p) * 1e-3

    wd_adamw = [p for p in other if p.ndim == 2]
    no_wd = [p for p in other if p.ndim != 2]
    if args.optimizer == "adamw":
        opts = [torch.optim.AdamW([{"params": wd_adamw + mats, "weight_decay": 0.1},
                                   {"params": no_wd, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)]
    else:
        opts = [torch.optim.Muon(mats, lr=args.lr, weight_decay=0.1, momentum=0.95,
                                 nesterov=True, adjust_lr_fn="match_rms_adamw"),
                torch.optim.AdamW([{"params": wd_adamw, "weight_decay": 0.1},
                                   {"params": no_wd, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)]

    ms = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for o in opts:
            o.step()
        dt = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            ms.append(dt)

    out = {"optimizer": args.optimizer, "threads": args.threads, "torch": torch.__version__,
           "median_ms": statistics.median(ms), "min_ms": min(ms), "steps": len(ms)}
    if args.optimizer == "muon":
        out["ns_dtype"] = args.ns_dtype
        # The iteration alone over the model's matrices (one warm-up pass, then the
        # median of three passes), what bench_muon's model_ns_ms times for Tessera.
        ns = muon_mod._zeropower_via_newtonschulz
        coef = (muon_mod.DEFAULT_A, muon_mod.DEFAULT_B, muon_mod.DEFAULT_C)
        passes = []
        with torch.no_grad():
            for r in range(4):
                t0 = time.perf_counter()
                for p in mats:
                    ns(p.grad, coef, 5, 1e-7)
                if r > 0:
                    passes.append((time.perf_counter() - t0) * 1e3)
        out["ns_ms"] = statistics.median(passes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
