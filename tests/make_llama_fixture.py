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
values stored in the weights file.

Run:  /usr/bin/python3 tests/make_llama_fixture.py   (needs torch; no other packages)
"""
import math
import os
import sys

import torch

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixture import write_safetensors  # noqa: E402
from torch_llama import Llama, Shape, init_weights, param_names  # noqa: E402

# ---- hyperparameters --------------------------------------------------------------
SHAPE = Shape(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=96,
              seq_len=16, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)
B, T = 4, 16
INIT_SEED = 42          # torch.manual_seed for init + perturbation
DATA_SEED = 1234        # separate generator for the token batch
QK_STD = 0.2            # q_proj, k_proj: peaked attention, so that RoPE matters
NORM_PERTURB = 0.1      # noise added to the RMSNorm weights after init
LR, MIN_LR, WARMUP, STEPS = 1e-2, 1e-3, 2, 5
WEIGHT_DECAY, BETAS, EPS, GRAD_CLIP = 0.1, (0.9, 0.95), 1e-8, 1.0


def lr_at(s):
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    r = (s - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * r)) * (LR - MIN_LR)


def qk_std(name):
    return QK_STD if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02


def main():
    torch.set_num_threads(1)  # fixed reduction order -> reproducible float64 results
    torch.use_deterministic_algorithms(True)
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = os.path.join(here, "fixtures")
    os.makedirs(outdir, exist_ok=True)
    names = param_names(SHAPE)

    # float32 weights, as stored in the weights file
    torch.manual_seed(INIT_SEED)
    model32 = Llama(SHAPE)
    init_weights(model32, names, NORM_PERTURB, qk_std)
    p32 = dict(model32.named_parameters())
    assert sorted(p32) == sorted(names), (sorted(p32), sorted(names))
    w_meta = SHAPE.meta()
    write_safetensors(os.path.join(outdir, "llama_tiny_weights.safetensors"),
                      [(n, p32[n].float()) for n in names], w_meta)

    # token batch: B windows of T+1 tokens; inputs first T, targets last T
    g = torch.Generator().manual_seed(DATA_SEED)
    seq = torch.randint(0, SHAPE.vocab_size, (B, T + 1), generator=g, dtype=torch.long)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    def fresh_double():
        m = Llama(SHAPE)
        m.load_state_dict(model32.state_dict())
        return m.double()

    # loss and gradients at the initial weights (float64)
    m = fresh_double()
    loss = m(tokens, targets)
    loss.backward()
    pm = dict(m.named_parameters())
    grads = [("grad." + n, pm[n].grad.double()) for n in names]
    loss0 = loss.item()

    # the same weights without the rotary embedding (angle 0): how much RoPE matters here
    with torch.no_grad():
        m_norope = fresh_double()
        m_norope.rope_cos = torch.ones_like(m_norope.rope_cos)
        m_norope.rope_sin = torch.zeros_like(m_norope.rope_sin)
        loss_norope = m_norope(tokens, targets).item()

    # 5 AdamW steps on the same batch
    m = fresh_double()
    pm = dict(m.named_parameters())
    decay = [pm[n] for n in names if pm[n].dim() >= 2]
    no_decay = [pm[n] for n in names if pm[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    uniq = [pm[n] for n in names]
    losses, lrs, norms = [], [], []
    for s in range(STEPS):
        lr = lr_at(s)
        for grp in opt.param_groups:
            grp["lr"] = lr
        l = m(tokens, targets)
        l.backward()
        gn = torch.nn.utils.clip_grad_norm_(uniq, GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(l.item())
        lrs.append(lr)
        norms.append(float(gn))

    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32)),
               ("loss", f64([loss0]))]
    tensors += grads
    tensors += [("adamw_losses", f64(losses)), ("adamw_lrs", f64(lrs)),
                ("adamw_grad_norms", f64(norms))]
    tensors += [("final." + n, pm[n].detach().double()) for n in names]
    e_meta = dict(w_meta)
    e_meta.update({
        "B": B, "T": T, "torch": torch.__version__, "dtype": "float64",
        "init_seed": INIT_SEED, "data_seed": DATA_SEED,
        "init": "Tessera's llama init (matrices and embedding normal 0.02, RMSNorm weights 1) "
                f"except q_proj, k_proj normal {QK_STD}; then every RMSNorm weight perturbed "
                f"by +normal(0,{NORM_PERTURB})",
        "data": "tokens = seq[:, :T], targets = seq[:, 1:], seq random in [0,vocab)",
        "loss": "mean cross-entropy over B*T targets",
        "lr": LR, "min_lr": MIN_LR, "warmup": WARMUP, "steps": STEPS,
        "weight_decay": WEIGHT_DECAY, "beta1": BETAS[0], "beta2": BETAS[1],
        "eps": EPS, "grad_clip": GRAD_CLIP,
        "adamw": "per step: loss (before update), backward, clip_grad_norm_(1.0), "
                 "AdamW step; weight decay only on dim>=2 params",
    })
    write_safetensors(os.path.join(outdir, "llama_tiny_expect.safetensors"), tensors, e_meta)

    print(f"torch {torch.__version__}")
    print(f"loss {loss0:.10f}  ln({SHAPE.vocab_size}) = {math.log(SHAPE.vocab_size):.10f}")
    print(f"loss without rotary embedding {loss_norope:.10f} (differs by "
          f"{abs(loss_norope - loss0):.3g})")
    print("adamw_losses " + " ".join(f"{x:.10f}" for x in losses))
    print("adamw_lrs " + " ".join(f"{x:.6g}" for x in lrs))
    print("adamw_grad_norms " + " ".join(f"{x:.10f}" for x in norms))
    ok = (abs(loss0 - math.log(SHAPE.vocab_size)) < 0.5 and abs(loss_norope - loss0) > 1e-4
          and all(b < a for a, b in zip(losses, losses[1:])))
    print("sanity", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
