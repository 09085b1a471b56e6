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
stored in the weights file.

Run:  /usr/bin/python3 tests/make_fixture.py   (needs torch; no other packages)
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- hyperparameters --------------------------------------------------------------
N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ_LEN = 2, 2, 32, 96, 16
B, T = 4, 16
INIT_SEED = 42          # torch.manual_seed for init + perturbation
DATA_SEED = 1234        # separate generator for the token batch
PERTURB_STD = 0.02      # noise added to biases and LayerNorm params after init
LR, MIN_LR, WARMUP, STEPS = 1e-2, 1e-3, 2, 5
WEIGHT_DECAY, BETAS, EPS, GRAD_CLIP = 0.1, (0.9, 0.95), 1e-8, 1.0


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


def lr_at(s):
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    r = (s - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * r)) * (LR - MIN_LR)


# ---- safetensors writer (no safetensors package) --------------------------------------
_DT = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        if t.dtype not in _DT:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    torch.set_num_threads(1)  # fixed reduction order -> reproducible float64 results
    torch.use_deterministic_algorithms(True)
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = os.path.join(here, "fixtures")
    os.makedirs(outdir, exist_ok=True)
    names = param_names(N_LAYER)

    # float32 weights, as stored in the weights file
    torch.manual_seed(INIT_SEED)
    model32 = GPT(N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ_LEN)
    init_weights(model32, names)
    p32 = dict(model32.named_parameters())
    assert sorted(p32) == sorted(names), (sorted(p32), sorted(names))
    w_meta = {"n_layer": N_LAYER, "n_head": N_HEAD, "n_embd": N_EMBD,
              "vocab_size": VOCAB, "seq_len": SEQ_LEN, "format": "nanoGPT"}
    write_safetensors(os.path.join(outdir, "gpt2_tiny_weights.safetensors"),
                      [(n, p32[n].float()) for n in names], w_meta)

    # token batch: B windows of T+1 tokens; inputs first T, targets last T
    g = torch.Generator().manual_seed(DATA_SEED)
    seq = torch.randint(0, VOCAB, (B, T + 1), generator=g, dtype=torch.long)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    def fresh_double():
        m = GPT(N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ_LEN)
        m.load_state_dict(model32.state_dict())
        return m.double()

    # loss and gradients at the initial weights (float64)
    m = fresh_double()
    loss = m(tokens, targets)
    loss.backward()
    pm = dict(m.named_parameters())
    grads = [("grad." + n, pm[n].grad.double()) for n in names]
    loss0 = loss.item()

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
        "init": "CONTRACT init (normal 0.02; c_proj weights normal 0.02/sqrt(2*n_layer); "
                "biases 0; LN weight 1 bias 0), then every bias and LayerNorm "
                f"weight/bias perturbed by +normal(0,{PERTURB_STD})",
        "data": "tokens = seq[:, :T], targets = seq[:, 1:], seq random in [0,vocab)",
        "loss": "mean cross-entropy over B*T targets",
        "lr": LR, "min_lr": MIN_LR, "warmup": WARMUP, "steps": STEPS,
        "weight_decay": WEIGHT_DECAY, "beta1": BETAS[0], "beta2": BETAS[1],
        "eps": EPS, "grad_clip": GRAD_CLIP,
        "adamw": "per step: loss (before update), backward, clip_grad_norm_(1.0), "
                 "AdamW step; weight decay only on dim>=2 params",
    })
    write_safetensors(os.path.join(outdir, "gpt2_tiny_expect.safetensors"), tensors, e_meta)

    print(f"torch {torch.__version__}")
    print(f"loss {loss0:.10f}  ln({VOCAB}) = {math.log(VOCAB):.10f}")
    print("adamw_losses " + " ".join(f"{x:.10f}" for x in losses))
    print("adamw_lrs " + " ".join(f"{x:.6g}" for x in lrs))
    print("adamw_grad_norms " + " ".join(f"{x:.10f}" for x in norms))
    ok = abs(loss0 - math.log(VOCAB)) < 0.5 and all(
        b < a for a, b in zip(losses, losses[1:]))
    print("sanity", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
