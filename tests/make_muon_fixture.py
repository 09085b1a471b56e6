#!/usr/bin/python3
"""Generate Tessera's Muon fixture with torch.optim.Muon (tests/test_muon_fixture.c).

The model is the llama fixture's (tests/make_llama_fixture.py: its SHAPE, the weights of
tests/fixtures/llama_tiny_weights.safetensors and the batch of llama_tiny_expect), trained
for 5 steps on that batch as the contract's Muon ("Optimizer"): the learning-rate schedule,
clip_grad_norm_(1.0) over every parameter, then torch.optim.Muon on every 2-D matrix inside
the blocks (q, k, v, o, gate, up, down; weight decay 0.1, the unscaled lr's) and
torch.optim.AdamW on the rest (the embedding and lm_head with weight decay 0.1, the RMSNorm
weights without). Everything in float64, the Newton-Schulz iteration included:
torch.optim.Muon runs it in bfloat16, so its _zeropower_via_newtonschulz is replaced by the
same iteration in float64 that also takes one coefficient tuple per step (torch's takes
one tuple for every step).

Two runs, each stored under its prefix:
  a.  torch.optim.Muon's defaults: momentum 0.95, Nesterov, 5 steps of (3.4445, -4.7750,
      2.0315), adjust_lr_fn "match_rms_adamw" (Tessera's default scale)
  b.  momentum 0.9, no Nesterov, the per-step quintic set over 6 steps (the fifth tuple
      reused), adjust_lr_fn "original"
Per run: muon_losses, muon_lrs, muon_grad_norms [5] and final.NAME of every parameter.

Writes tests/fixtures/muon_tiny_expect.safetensors (deterministic: rerunning gives
byte-identical files).
Run:  /root/.cache/tessera/peer-venv/bin/python tests/make_muon_fixture.py  (torch >= 2.9)
"""
import os
import sys

import torch
import torch.optim._muon as tmuon

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
from make_llama_fixture import SHAPE  # noqa: E402
from torch_llama import Llama, param_names  # noqa: E402

TORCH = (3.4445, -4.7750, 2.0315)
QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
RUNS = {
    "a": dict(momentum=0.95, nesterov=True, coeffs=[TORCH] * 5, scale="match_rms_adamw"),
    "b": dict(momentum=0.9, nesterov=False, coeffs=QUINTIC + [QUINTIC[-1]], scale="original"),
}
_COEFFS = []  # the running configuration's per-step tuples, read by ns_float64


def ns_float64(grad, ns_coefficients, ns_steps, eps):
    """torch's _zeropower_via_newtonschulz in float64, one (a, b, c) per step."""
    assert ns_steps == len(_COEFFS)
    x = grad.to(torch.float64, copy=True)
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for a, b, c in _COEFFS:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def is_muon(name, p):
    return p.dim() == 2 and name.startswith("model.layers.")


def run(prefix, cfg, weights, tokens, targets, names):
    torch.manual_seed(0)
    m = Llama(SHAPE)
    m.load_state_dict({n: weights[n] for n in names}, strict=False)
    m = m.double()
    pm = dict(m.named_parameters())
    h = tc.FIXTURE
    muon_params = [pm[n] for n in names if is_muon(n, pm[n])]
    rest = [n for n in names if not is_muon(n, pm[n])]
    _COEFFS[:] = cfg["coeffs"]
    muon = torch.optim.Muon(muon_params, lr=h.lr, weight_decay=h.weight_decay,
                            momentum=cfg["momentum"], nesterov=cfg["nesterov"],
                            ns_steps=len(cfg["coeffs"]), adjust_lr_fn=cfg["scale"])
    adamw = tc.adamw(pm, rest, h)
    params = [pm[n] for n in names]
    losses, lrs, norms = [], [], []
    for s in range(h.train_steps):
        lr = tc.lr_at(h, s)
        for opt in (muon, adamw):
            for grp in opt.param_groups:
                grp["lr"] = lr
        loss = m(tokens, targets)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, h.grad_clip)
        muon.step()
        adamw.step()
        muon.zero_grad(set_to_none=True)
        adamw.zero_grad(set_to_none=True)
        losses.append(loss.item())
        lrs.append(lr)
        norms.append(float(gn))
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    print(f"{prefix}: losses " + " ".join(f"{x:.10f}" for x in losses))
    out = [(prefix + ".muon_losses", f64(losses)), (prefix + ".muon_lrs", f64(lrs)),
           (prefix + ".muon_grad_norms", f64(norms))]
    out += [(prefix + ".final." + n, pm[n].detach().double()) for n in names]
    return out, losses


def main():
    torch.set_num_threads(1)  # fixed reduction order -> reproducible float64 results
    torch.use_deterministic_algorithms(True)
    tmuon._zeropower_via_newtonschulz = ns_float64
    fx = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    weights, _ = tc.read_safetensors(os.path.join(fx, "llama_tiny_weights.safetensors"))
    expect, _ = tc.read_safetensors(os.path.join(fx, "llama_tiny_expect.safetensors"))
    tokens, targets = expect["tokens"].long(), expect["targets"].long()
    names = param_names(SHAPE)
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32))]
    ok = True
    for prefix, cfg in RUNS.items():
        t, losses = run(prefix, cfg, weights, tokens, targets, names)
        tensors += t
        ok &= all(b < a for a, b in zip(losses, losses[1:]))
    h = tc.FIXTURE
    meta = {"torch": torch.__version__, "dtype": "float64", "weights": "llama_tiny_weights",
            "lr": h.lr, "min_lr": h.min_lr, "warmup": h.warmup, "steps": h.train_steps,
            "weight_decay": h.weight_decay, "beta1": h.beta1, "beta2": h.beta2, "eps": h.eps,
            "grad_clip": h.grad_clip,
            "muon": "torch.optim.Muon on 2-D block matrices, NS in float64; AdamW on the rest"}
    for prefix, cfg in RUNS.items():
        meta[prefix] = (f"momentum {cfg['momentum']} nesterov {cfg['nesterov']} "
                        f"ns_steps {len(cfg['coeffs'])} scale {cfg['scale']}")
    tc.write_safetensors(os.path.join(fx, "muon_tiny_expect.safetensors"), tensors, meta)
    print("sanity", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
