#!/usr/bin/python3
"""PyTorch reference for Tessera's checkpoints: nanoGPT's GPT-2, safetensors by hand, and
the batch rule (docs/CONTRACT.md "Model (gpt2)", "The batch rule", "Data shards",
"Checkpoints").

The model classes come from tests/make_fixture.py (importing it only defines classes,
functions and constants; its fixtures are written by its main()). torch 1.13 has no
safetensors package, so the reader below parses the format by hand.

Subcommands (run with /usr/bin/python3, the interpreter that has torch):

  init OUT.safetensors --n-layer L --n-head H --n-embd C --vocab V --seq-len T [--seed S]
      random nanoGPT weights (the contract's init, then biases and LayerNorm parameters
      perturbed as in make_fixture.py so that they matter), F32, nanoGPT names, no
      lm_head.weight (it is tied to transformer.wte.weight).

  loss MODEL.safetensors --n-layer ... --seq-len T --data FILE [FILE...] --batch B
       --step S [--step S2 ...] [--optimizer OPTIMIZER.safetensors]
      builds nanoGPT's GPT, load_state_dict(strict=True) of the file (plus lm_head.weight =
      transformer.wte.weight, as nanoGPT's tied state_dict has it), checks the tie, and
      prints for every step S one line
          step S loss_f32 X loss_f64 Y
      the mean cross-entropy of step S's global batch (B windows by the batch rule) in
      float32 (the number to compare) and float64 (for information). With --optimizer it
      first checks that the file holds exactly exp_avg.<name> and exp_avg_sq.<name> for
      every parameter, F32, in the parameter's shape, with finite values (exp_avg_sq >= 0).
      With --replay INIT.safetensors (and --lr, --min-lr, --warmup, --train-steps,
      --weight-decay, --beta1, --beta2, --eps, --grad-clip) it also trains INIT for as many
      steps as the checkpoint has done (--replay-steps K) with torch.optim.AdamW in float64
      on the batch rule, prints "replay step s loss_f64 X" for each, and checks that the
      checkpoint's moments match torch's AdamW state (relative L2 error per tensor within
      --moment-tol).

Exits non-zero with a message on any mismatch.
"""
import argparse
import copy
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixture import GPT, init_weights, param_names, write_safetensors  # noqa: E402


# ---- safetensors reader ----------------------------------------------------------------
_DTYPES = {"F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
           "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
           "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
           "BOOL": (torch.bool, 1)}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata dict). Checks the header and every offset."""
    if sys.byteorder != "little":
        raise SystemExit("read_safetensors: needs a little-endian host")
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SystemExit(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > len(raw) - 8:
        raise SystemExit(f"{path}: header length {hlen} exceeds the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    data = memoryview(raw)[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors, spans = {}, []
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _DTYPES:
            raise SystemExit(f"{path}: {name}: unsupported dtype {dt}")
        tdtype, size = _DTYPES[dt]
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if not (0 <= begin <= end <= len(data)) or end - begin != numel * size:
            raise SystemExit(f"{path}: {name}: data_offsets [{begin}, {end}] do not fit "
                             f"shape {shape} of {dt} in {len(data)} data bytes")
        spans.append((begin, end, name))
        if numel == 0:
            t = torch.zeros(shape, dtype=tdtype)
        else:
            # a bytearray copy: frombuffer needs a writable buffer, and the tensor owns it
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=tdtype).reshape(shape)
        tensors[name] = t
    spans.sort()
    pos = 0
    for begin, end, name in spans:  # the data is covered exactly, without overlaps
        if begin != pos:
            raise SystemExit(f"{path}: {name} starts at {begin}, expected {pos} (gap/overlap)")
        pos = end
    if pos != len(data):
        raise SystemExit(f"{path}: {len(data) - pos} trailing bytes after the last tensor")
    return tensors, meta


# ---- data and the batch rule ------------------------------------------------------------
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256


def read_tokens(path):
    """One data file as a 1-D int64 tensor: an llm.c shard, else a text file (bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    hdr = 4 * SHARD_HEADER_INTS
    if len(raw) >= hdr:
        magic, version, count = struct.unpack("<3i", raw[:12])
        if magic == SHARD_MAGIC:
            if version != SHARD_VERSION or len(raw) != hdr + 2 * count:
                raise SystemExit(f"{path}: bad llm.c shard (version {version}, count "
                                 f"{count}, {len(raw)} bytes)")
            toks = torch.frombuffer(bytearray(raw[hdr:]), dtype=torch.int16)
            return toks.to(torch.int64) & 0xFFFF  # uint16 tokens
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)


def batch(tokens, seq_len, global_batch, step):
    """Step `step`'s global batch: inputs and targets, [B, T] each (CONTRACT batch rule)."""
    n = tokens.numel()
    windows = (n - 1) // seq_len
    if windows < 1:
        raise SystemExit(f"data: {n} tokens hold no window of {seq_len + 1}")
    g = torch.arange(step * global_batch, (step + 1) * global_batch) % windows
    idx = g[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    seq = tokens[idx]
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# ---- model ------------------------------------------------------------------------------
def build(args):
    return GPT(args.n_layer, args.n_head, args.n_embd, args.vocab, args.seq_len)


def load_model(args, path):
    tensors, _ = read_safetensors(path)
    sd = dict(tensors)
    if "lm_head.weight" in sd:
        raise SystemExit(f"{path}: holds lm_head.weight; it must be left out (tied to wte)")
    for name, t in sd.items():
        if t.dtype != torch.float32:
            raise SystemExit(f"{path}: {name} is {t.dtype}, expected float32")
    if "transformer.wte.weight" not in sd:
        raise SystemExit(f"{path}: no transformer.wte.weight")
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # nanoGPT's tied state_dict
    model = build(args)
    model.load_state_dict(sd, strict=True)  # every name and shape, nothing extra
    check_tie(model)
    if not torch.equal(model.transformer.wte.weight.detach(), tensors["transformer.wte.weight"]):
        raise SystemExit("transformer.wte.weight differs from the file after loading")
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise SystemExit(f"{path}: {name} has non-finite values")
    return model, tensors


def check_optimizer(path, params):
    opt, _ = read_safetensors(path)
    want = {}
    for name, t in params.items():
        want["exp_avg." + name] = t.shape
        want["exp_avg_sq." + name] = t.shape
    missing = sorted(set(want) - set(opt))
    extra = sorted(set(opt) - set(want))
    if missing or extra:
        raise SystemExit(f"{path}: missing {missing[:6]}{'...' if len(missing) > 6 else ''}"
                         f" unexpected {extra[:6]}{'...' if len(extra) > 6 else ''}")
    for name, shape in want.items():
        t = opt[name]
        if t.dtype != torch.float32:
            raise SystemExit(f"{path}: {name} is {t.dtype}, expected float32")
        if t.shape != shape:
            raise SystemExit(f"{path}: {name} has shape {list(t.shape)}, "
                             f"the parameter {list(shape)}")
        if not torch.isfinite(t).all():
            raise SystemExit(f"{path}: {name} has non-finite values")
        if name.startswith("exp_avg_sq.") and (t < 0).any():
            raise SystemExit(f"{path}: {name} has negative values")
    nonzero = sum(1 for n, t in opt.items() if n.startswith("exp_avg_sq.") and t.abs().sum() > 0)
    print(f"optimizer: {len(opt)} tensors, {len(params)} parameters x (exp_avg, exp_avg_sq), "
          f"{nonzero} second moments non-zero")


def check_tie(model):
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    if head is not wte or head.data_ptr() != wte.data_ptr():
        raise SystemExit("lm_head.weight is not tied to transformer.wte.weight")


def lr_at(args, s):
    """CONTRACT "Optimizer": linear warmup, then cosine from lr to min_lr."""
    if s < args.warmup:
        return args.lr * (s + 1) / args.warmup
    r = (s - args.warmup) / (args.train_steps - args.warmup)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (args.lr - args.min_lr)


def replay(args, tokens):
    """AdamW from --replay for --replay-steps steps in float64; {name: (exp_avg, exp_avg_sq)}."""
    model, _ = load_model(args, args.replay)
    model = model.double()
    check_tie(model)
    pm = dict(model.named_parameters())
    names = param_names(args.n_layer)
    opt = torch.optim.AdamW(
        [{"params": [pm[n] for n in names if pm[n].dim() >= 2], "weight_decay": args.weight_decay},
         {"params": [pm[n] for n in names if pm[n].dim() < 2], "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    for s in range(args.replay_steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(args, s)
        x, y = batch(tokens, args.seq_len, args.batch, s)
        loss = model(x, y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([pm[n] for n in names], args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"replay step {s} loss_f64 {loss.item():.12g}")
    return {n: (opt.state[pm[n]]["exp_avg"], opt.state[pm[n]]["exp_avg_sq"]) for n in names}


def check_moments(path, ref, tol):
    opt, _ = read_safetensors(path)
    worst, worst_name = 0.0, ""
    for name, (m, v) in ref.items():
        for key, want in (("exp_avg." + name, m), ("exp_avg_sq." + name, v)):
            got = opt[key].double()
            err = float((got - want).norm() / want.norm().clamp_min(1e-300))
            if err > worst:
                worst, worst_name = err, key
    print(f"moments: worst relative L2 error {worst:.3g} ({worst_name}) against torch's AdamW")
    if not worst <= tol:
        raise SystemExit(f"{path}: {worst_name} differs from torch's AdamW state by relative "
                         f"L2 {worst:.3g} > {tol}")


@torch.no_grad()
def step_loss(model, tokens, args, step):
    check_tie(model)
    x, y = batch(tokens, args.seq_len, args.batch, step)
    return model(x, y).item()


# ---- CLI --------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--n-layer", type=int, required=True)
    common.add_argument("--n-head", type=int, required=True)
    common.add_argument("--n-embd", type=int, required=True)
    common.add_argument("--vocab", type=int, required=True)
    common.add_argument("--seq-len", type=int, required=True)
    p_init = sub.add_parser("init", parents=[common], help="write random nanoGPT weights")
    p_init.add_argument("out")
    p_init.add_argument("--seed", type=int, default=42)
    p_loss = sub.add_parser("loss", parents=[common], help="loss of a step's batch")
    p_loss.add_argument("model")
    p_loss.add_argument("--data", nargs="+", required=True)
    p_loss.add_argument("--batch", type=int, required=True)
    p_loss.add_argument("--step", type=int, action="append", required=True)
    p_loss.add_argument("--optimizer")
    p_loss.add_argument("--replay", help="initial weights to replay AdamW from")
    p_loss.add_argument("--replay-steps", type=int, default=0)
    p_loss.add_argument("--moment-tol", type=float, default=1e-4)
    for flag, default in (("--lr", 6e-4), ("--min-lr", 6e-5), ("--warmup", 10),
                          ("--train-steps", 100), ("--weight-decay", 0.1), ("--beta1", 0.9),
                          ("--beta2", 0.95), ("--eps", 1e-8), ("--grad-clip", 1.0)):
        p_loss.add_argument(flag, type=type(default), default=default)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # fixed reduction order; the models are tiny
    if args.cmd == "init":
        torch.manual_seed(args.seed)
        model = build(args)
        names = param_names(args.n_layer)
        init_weights(model, names)
        params = dict(model.named_parameters())
        meta = {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
                "vocab_size": args.vocab, "seq_len": args.seq_len, "format": "nanoGPT"}
        write_safetensors(args.out, [(n, params[n].float()) for n in names], meta)
        print(f"wrote {args.out}: {len(names)} tensors")
        return 0

    model, tensors = load_model(args, args.model)
    if args.optimizer:
        check_optimizer(args.optimizer, tensors)
    tokens = torch.cat([read_tokens(p) for p in args.data])
    if int(tokens.max()) >= args.vocab:
        raise SystemExit(f"data: token {int(tokens.max())} >= vocab {args.vocab}")
    if args.replay:
        if not args.optimizer or args.replay_steps < 1:
            raise SystemExit("--replay needs --optimizer and --replay-steps >= 1")
        check_moments(args.optimizer, replay(args, tokens), args.moment_tol)
    model64 = copy.deepcopy(model).double()  # the same F32 values, in float64
    for s in args.step:
        l32 = step_loss(model, tokens, args, s)
        l64 = step_loss(model64, tokens, args, s)
        print(f"step {s} loss_f32 {l32:.9g} loss_f64 {l64:.12g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
