#!/usr/bin/python3
"""Generate Tessera's GPT-2 correctness fixture with a PyTorch (nanoGPT) reference.

Writes (deterministically; rerunning gives byte-identical files):
  tests/fixtures/gpt2_tiny_weights.safetensors  float32 weights, nanoGPT names
  tests/fixtures/gpt2_tiny_expect.safetensors   float64 reference: loss, gradients,
                                                5 AdamW steps (losses, lrs, grad norms,
                                                final parameters)

Model, init and optimizer follow docs/CONTRACT.md ("Model (gpt2)",
"Optimizer", "Checkpoints"). After the contract's init (torch.manual_seed(42)) every
bias and LayerNorm weight/bias gets + normal(0, 0.02) noise so that the fixture
exercises them (with zero biases / unit LN weights a bug there could go unnoticed).
The reference itself is computed in float64 starting from exactly the float32 values
stored in the weights file; the batch, the seeds, the optimizer steps and the files'
layout are tests/torch_common.py's (FIXTURE, make_fixture), shared with
tests/make_llama_fixture.py.

Run:  /usr/bin/python3 tests/make_fixture.py   (needs torch; no other packages)
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

# ---- hyperparameters (the batch, seeds and optimizer: torch_common.FIXTURE) ---------------
N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ_LEN = 2, 2, 32, 96, 16
PERTURB_STD = 0.02      # noise added to biases and LayerNorm params after init


# ---- nanoGPT GPT-2 ------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=True)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=True)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer(
            "mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
            .view(1, 1, block_size, block_size), persistent=False)

    def forward(self, x):
        Bx, Tx, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(Bx, Tx, self.n_head, hs).transpose(1, 2)
        k = k.view(Bx, Tx, self.n_head, hs).transpose(1, 2)
        v = v.view(Bx, Tx, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:, :, :Tx, :Tx], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(Bx, Tx, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=True)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=True)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size):
        super().__init__()
        self.n_layer = n_layer
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx, targets):
        Tx = idx.size(1)
        pos = torch.arange(Tx, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def param_names(n_layer):
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        names += [p + s for s in (
            "ln_1.weight", "ln_1.bias",
            "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias",
            "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias")]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    return names


def init_weights(model, names):
    """CONTRACT init, in the order of `names`, then perturb biases / LN params."""
    params = dict(model.named_parameters())  # tied lm_head.weight is deduplicated
    std_res = 0.02 / math.sqrt(2 * model.n_layer)
    with torch.no_grad():
        for n in names:
            p = params[n]
            if ".ln_" in n or n.startswith("transformer.ln_f"):
                p.fill_(1.0 if n.endswith(".weight") else 0.0)
            elif n.endswith(".bias"):
                p.zero_()
            elif n.endswith("c_proj.weight"):
                p.normal_(0.0, std_res)
            else:
                p.normal_(0.0, 0.02)
        for n in names:  # perturbation pass (after the contract init)
            p = params[n]
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * PERTURB_STD)


def main():
    names = param_names(N_LAYER)
    w_meta = {"n_layer": N_LAYER, "n_head": N_HEAD, "n_embd": N_EMBD,
              "vocab_size": VOCAB, "seq_len": SEQ_LEN, "format": "nanoGPT"}
    fx = tc.make_fixture(
        "gpt2_tiny", lambda: GPT(N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ_LEN), names,
        lambda m: init_weights(m, names), w_meta, VOCAB,
        "CONTRACT init (normal 0.02; c_proj weights normal 0.02/sqrt(2*n_layer); "
        "biases 0; LN weight 1 bias 0), then every bias and LayerNorm "
        f"weight/bias perturbed by +normal(0,{PERTURB_STD})")
    return tc.report_fixture(fx, VOCAB)


if __name__ == "__main__":
    sys.exit(main())
