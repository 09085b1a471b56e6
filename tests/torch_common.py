"""What the PyTorch references in tests/ share (torch only: Debian's python3-torch 1.13,
which has no safetensors package, so the format is read and written by hand).

  - safetensors: write_safetensors, read_safetensors, write_weights
  - data: read_tokens (an llm.c shard or a text file) and batch (docs/CONTRACT.md "The
    batch rule")
  - the optimizer (CONTRACT "Optimizer"): lr_at, adamw, train; check_optimizer and
    check_moments hold an optimizer.safetensors against torch.optim.AdamW
  - the command line of tests/torch_gpt2.py and tests/torch_llama.py: parser,
    init_command, loss_command (a model supplies its shape arguments, build, init and load),
    run_commands (several commands in one process)
  - the fixtures of tests/make_fixture.py and tests/make_llama_fixture.py: FIXTURE (the
    recipe), make_fixture and report_fixture (a model supplies build, init and names)

Every function takes the model's pieces as arguments; importing this module only defines.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import struct
import sys
import traceback

import torch

# ---- safetensors ------------------------------------------------------------------------
_DT = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}
_DTYPES = {"F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
           "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
           "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
           "BOOL": (torch.bool, 1)}


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, tensor)] in file order; metadata: {key: value} (as strings)."""
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


def write_weights(path, model, names, meta, buffers=()):
    """The model's parameters `names` (in that order), then its buffers `buffers` (state
    that is no parameter, e.g. an MoE router's bias), as F32."""
    params = dict(model.named_parameters())
    bufs = dict(model.named_buffers())
    write_safetensors(path, [(n, params[n].float()) for n in names]
                      + [(n, bufs[n].float()) for n in buffers], meta)


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


# ---- the optimizer ----------------------------------------------------------------------
# h, the hyperparameters: lr, min_lr, warmup, train_steps, weight_decay, beta1, beta2, eps,
# grad_clip (the `loss` subcommand's arguments, or FIXTURE).
def lr_at(h, s):
    """CONTRACT "Optimizer": linear warmup, then cosine from lr to min_lr."""
    if s < h.warmup:
        return h.lr * (s + 1) / h.warmup
    r = (s - h.warmup) / (h.train_steps - h.warmup)
    return h.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (h.lr - h.min_lr)


def adamw(pm, names, h):
    """torch.optim.AdamW over pm[n] for n in names, weight decay only on dim >= 2."""
    return torch.optim.AdamW(
        [{"params": [pm[n] for n in names if pm[n].dim() >= 2], "weight_decay": h.weight_decay},
         {"params": [pm[n] for n in names if pm[n].dim() < 2], "weight_decay": 0.0}],
        lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps)


def train(model, names, h, steps, data, after_step=None):
    """`steps` AdamW steps, each: the LR schedule's lr, loss of data(s) (before the update),
    backward, clip_grad_norm_(grad_clip) over every parameter (when grad_clip > 0), step,
    then after_step(model, s) when given (what a step changes besides the parameters: an
    MoE's router bias). Returns (optimizer, losses, lrs, grad norms); a norm is None where
    nothing clipped."""
    pm = dict(model.named_parameters())
    opt = adamw(pm, names, h)
    params = [pm[n] for n in names]
    losses, lrs, norms = [], [], []
    for s in range(steps):
        lr = lr_at(h, s)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x, y = data(s)
        loss = model(x, y)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, h.grad_clip) if h.grad_clip > 0 else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        lrs.append(lr)
        norms.append(None if gn is None else float(gn))
        if after_step:
            after_step(model, s)
    return opt, losses, lrs, norms


def check_optimizer(path, params):
    """optimizer.safetensors holds exactly exp_avg.<name> and exp_avg_sq.<name> of every
    parameter, F32, in its shape, finite (exp_avg_sq >= 0)."""
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


def check_moments(path, ref, tol):
    """optimizer.safetensors' moments against ref {name: (exp_avg, exp_avg_sq)}."""
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


def replay(args, load, names, seq_len, tokens, check=None, after_step=None):
    """AdamW from --replay for --replay-steps steps in float64 on the batch rule;
    {name: (exp_avg, exp_avg_sq)}."""
    model, _ = load(args.replay)
    model = model.double()
    if check:
        check(model)
    opt, losses, _, _ = train(model, names, args, args.replay_steps,
                              lambda s: batch(tokens, seq_len, args.batch, s), after_step)
    for s, loss in enumerate(losses):
        print(f"replay step {s} loss_f64 {loss:.12g}")
    pm = dict(model.named_parameters())
    return {n: (opt.state[pm[n]]["exp_avg"], opt.state[pm[n]]["exp_avg_sq"]) for n in names}


# ---- the command line of tests/torch_gpt2.py and tests/torch_llama.py -------------------
def parser(doc, add_shape_args, what):
    """`init OUT SHAPE [--seed S]` and `loss MODEL SHAPE --data ... --batch B --step S ...
    [--optimizer F] [--replay INIT --replay-steps K --lr ... --grad-clip ...]`, SHAPE
    being add_shape_args's. Returns (the parser, the init subparser)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    add_shape_args(common)
    p_init = sub.add_parser("init", parents=[common], help=f"write random {what} weights")
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
    return ap, p_init


def run_commands(main, argv):
    """`[--out FILE] COMMAND ARGS... [:: [--out FILE] COMMAND ARGS...]...`: main(ARGS) of
    each command in turn, in this one process (importing torch takes seconds of CPU, more
    than a tiny model's command). A command's stdout and stderr go to its --out FILE when
    given. Every command runs, whatever the others did: the exit code is 0 when all
    succeeded, else the first failure's (1 for an exception, printed into its output).
    Each command seeds what it draws (init: --seed), so one gives the bytes it gives
    alone."""
    commands, cur = [], []
    for a in argv:
        if a == "::":
            commands.append(cur)
            cur = []
        else:
            cur.append(a)
    commands.append(cur)
    code = 0
    for args in filter(None, commands):  # a trailing "::" ends nothing
        out = None
        if len(args) >= 2 and args[0] == "--out":
            out, args = args[1], args[2:]
        with contextlib.ExitStack() as stack:
            if out:
                f = stack.enter_context(open(out, "w"))
                stack.enter_context(contextlib.redirect_stdout(f))
                stack.enter_context(contextlib.redirect_stderr(f))
            try:
                rc = main(args) or 0
            except SystemExit as e:  # argparse's errors, raise SystemExit("message")
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            except Exception:  # noqa: BLE001 -- reported, and the next command still runs
                traceback.print_exc()
                rc = 1
        if rc and not code:
            code = rc
        if rc:
            print(f"command failed (exit {rc}): {' '.join(args)}"
                  + (f" (its output: {out})" if out else ""), file=sys.stderr)
    return code


def init_weights_seeded(seed, build, init):
    """build() then init(model) after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    model = build()
    init(model)
    return model


def init_command(args, build, names, init, meta):
    """`init`: random weights (build, then init, under --seed) written as F32."""
    model = init_weights_seeded(args.seed, build, init)
    write_weights(args.out, model, names, meta)
    print(f"wrote {args.out}: {len(names)} tensors")
    return 0


def loss_command(args, load, names, seq_len, vocab, check=None, after_step=None):
    """`loss`: load(path) -> (model, tensors) the model; with --optimizer check the file,
    with --replay its moments (after_step: train's); then for every --step its batch's
    loss in float32 and in float64. check(model), if given, runs on every model before it
    is used."""
    model, tensors = load(args.model)
    if args.optimizer:
        check_optimizer(args.optimizer, tensors)
    tokens = torch.cat([read_tokens(p) for p in args.data])
    if int(tokens.max()) >= vocab:
        raise SystemExit(f"data: token {int(tokens.max())} >= vocab {vocab}")
    if args.replay:
        if not args.optimizer or args.replay_steps < 1:
            raise SystemExit("--replay needs --optimizer and --replay-steps >= 1")
        check_moments(args.optimizer,
                      replay(args, load, names, seq_len, tokens, check, after_step),
                      args.moment_tol)
    model64 = copy.deepcopy(model).double()  # the same F32 values, in float64
    with torch.no_grad():
        for step in args.step:
            x, y = batch(tokens, seq_len, args.batch, step)
            if check:
                check(model)
                check(model64)
            l32, l64 = model(x, y).item(), model64(x, y).item()
            print(f"step {step} loss_f32 {l32:.9g} loss_f64 {l64:.12g}")
    return 0


# ---- the fixtures of tests/make_fixture.py and tests/make_llama_fixture.py --------------
# The recipe (tests/fixture_check.h trains with the same): B windows of T+1 tokens drawn
# with their own generator, and 5 steps of the contract's optimizer.
FIXTURE = argparse.Namespace(
    batch=4, seq_len=16,
    init_seed=42,       # torch.manual_seed for init + perturbation
    data_seed=1234,     # separate generator for the token batch
    lr=1e-2, min_lr=1e-3, warmup=2, train_steps=5,
    weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0)


def make_fixture(stem, build, names, init, w_meta, vocab, init_text, buffers=(),
                 record=None, after_step=None, e_meta=None):
    """Writes tests/fixtures/STEM_weights.safetensors (build(), then init(model) under
    FIXTURE.init_seed; F32) and STEM_expect.safetensors: in float64 from exactly those F32
    values, the batch, the loss and every gradient at the initial weights, then FIXTURE's
    AdamW steps (losses, lrs, grad norms, final parameters). Deterministic: rerunning
    gives byte-identical files. Returns what report_fixture prints, and fresh_double()
    (a float64 copy of the initial model) for a caller's own checks.

    For a model with more than parameters (an MoE; every hook may be left out):
      buffers      names of model buffers stored after the parameters in the weights file
                   (F32) and as final.NAME in the expect file (e.g. a router's bias);
      record(m)    {name: tensor} of what the forward just run computed besides the loss
                   (float64 or int32): the initial forward's under NAME, each AdamW
                   step's stacked under adamw_NAME [steps, ...];
      after_step   train's hook, run after each optimizer step (and after record);
      e_meta       more metadata for the expect file (what the hooks did)."""
    torch.set_num_threads(1)  # fixed reduction order -> reproducible float64 results
    torch.use_deterministic_algorithms(True)
    outdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    os.makedirs(outdir, exist_ok=True)
    B, T = FIXTURE.batch, FIXTURE.seq_len

    # float32 weights, as stored in the weights file
    model32 = init_weights_seeded(FIXTURE.init_seed, build, init)
    p32 = dict(model32.named_parameters())
    assert sorted(p32) == sorted(names), (sorted(p32), sorted(names))
    write_weights(os.path.join(outdir, f"{stem}_weights.safetensors"), model32, names, w_meta,
                  buffers)

    # token batch: B windows of T+1 tokens; inputs first T, targets last T
    g = torch.Generator().manual_seed(FIXTURE.data_seed)
    seq = torch.randint(0, vocab, (B, T + 1), generator=g, dtype=torch.long)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    def fresh_double():
        m = build()
        m.load_state_dict(model32.state_dict())
        return m.double()

    # loss and gradients at the initial weights (float64)
    m = fresh_double()
    loss = m(tokens, targets)
    loss.backward()
    pm = dict(m.named_parameters())
    missing = [n for n in names if pm[n].grad is None]
    if missing:  # AdamW would skip them (no decay, no moments); Tessera steps every one
        raise SystemExit(f"{stem}: no gradient for {missing}")
    grads = [("grad." + n, pm[n].grad.double()) for n in names]
    loss0 = loss.item()
    recorded = list(record(m).items()) if record else []

    # the AdamW steps on the same batch
    m = fresh_double()
    pm = dict(m.named_parameters())
    steps_rec = {n: [] for n, _ in recorded}

    def hook(model, s):
        if record:
            for n, t in record(model).items():
                steps_rec[n].append(t)
        if after_step:
            after_step(model, s)
    _, losses, lrs, norms = train(m, names, FIXTURE, FIXTURE.train_steps,
                                  lambda s: (tokens, targets), hook)

    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32)),
               ("loss", f64([loss0]))]
    tensors += grads
    tensors += [("adamw_losses", f64(losses)), ("adamw_lrs", f64(lrs)),
                ("adamw_grad_norms", f64(norms))]
    tensors += [(n, t.reshape(-1) if t.dim() == 0 else t) for n, t in recorded]
    tensors += [("adamw_" + n, torch.stack(ts)) for n, ts in steps_rec.items()]
    tensors += [("final." + n, pm[n].detach().double()) for n in names]
    bufs = dict(m.named_buffers())
    tensors += [("final." + n, bufs[n].detach().double()) for n in buffers]
    h = FIXTURE
    more_meta = e_meta or {}
    e_meta = dict(w_meta)
    e_meta.update({
        "B": B, "T": T, "torch": torch.__version__, "dtype": "float64",
        "init_seed": h.init_seed, "data_seed": h.data_seed, "init": init_text,
        "data": "tokens = seq[:, :T], targets = seq[:, 1:], seq random in [0,vocab)",
        "loss": "mean cross-entropy over B*T targets",
        "lr": h.lr, "min_lr": h.min_lr, "warmup": h.warmup, "steps": h.train_steps,
        "weight_decay": h.weight_decay, "beta1": h.beta1, "beta2": h.beta2,
        "eps": h.eps, "grad_clip": h.grad_clip,
        "adamw": "per step: loss (before update), backward, clip_grad_norm_(1.0), "
                 "AdamW step; weight decay only on dim>=2 params",
    })
    e_meta.update(more_meta)
    write_safetensors(os.path.join(outdir, f"{stem}_expect.safetensors"), tensors, e_meta)
    return argparse.Namespace(tokens=tokens, targets=targets, fresh_double=fresh_double,
                              loss0=loss0, losses=losses, lrs=lrs, norms=norms,
                              recorded=dict(recorded), steps_recorded=steps_rec, final=m)


def report_fixture(fx, vocab, extra_lines=(), extra_ok=True):
    """Prints the fixture's numbers; sane when the initial loss is near ln(vocab), the
    losses fall and extra_ok. Returns the exit code."""
    print(f"torch {torch.__version__}")
    print(f"loss {fx.loss0:.10f}  ln({vocab}) = {math.log(vocab):.10f}")
    for line in extra_lines:
        print(line)
    print("adamw_losses " + " ".join(f"{x:.10f}" for x in fx.losses))
    print("adamw_lrs " + " ".join(f"{x:.6g}" for x in fx.lrs))
    print("adamw_grad_norms " + " ".join(f"{x:.10f}" for x in fx.norms))
    ok = (abs(fx.loss0 - math.log(vocab)) < 0.5 and extra_ok
          and all(b < a for a, b in zip(fx.losses, fx.losses[1:])))
    print("sanity", "OK" if ok else "FAILED")
    return 0 if ok else 1
