#!/usr/bin/python3
"""PyTorch reference for Tessera's checkpoints: nanoGPT's GPT-2, safetensors by hand, and
the batch rule (docs/CONTRACT.md "Model (gpt2)", "The batch rule", "Data shards",
"Checkpoints").

The model classes come from tests/make_fixture.py (importing it only defines classes,
functions and constants; its fixtures are written by its main()); safetensors, the batch
rule, the optimizer checks and the command line are tests/torch_common.py's, shared with
tests/torch_llama.py.

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

Several commands in one process (torch's import costs seconds, more than these models):
  [--out FILE] COMMAND ARGS... :: [--out FILE] COMMAND ARGS... ...
each command's output into its --out FILE when given (tests/torch_common.py run_commands).

Exits non-zero with a message on any mismatch.
"""
import os
import sys

import torch

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
from make_fixture import GPT, init_weights, param_names  # noqa: E402


# ---- model ------------------------------------------------------------------------------
def build(args):
    return GPT(args.n_layer, args.n_head, args.n_embd, args.vocab, args.seq_len)


def load_model(args, path):
    tensors, _ = tc.read_safetensors(path)
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


def check_tie(model):
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    if head is not wte or head.data_ptr() != wte.data_ptr():
        raise SystemExit("lm_head.weight is not tied to transformer.wte.weight")


def add_shape_args(ap):
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)


# ---- CLI --------------------------------------------------------------------------------
def main(argv=None):
    ap, _ = tc.parser(__doc__, add_shape_args, "nanoGPT")
    args = ap.parse_args(argv)
    names = param_names(args.n_layer)

    torch.set_num_threads(1)  # fixed reduction order; the models are tiny
    if args.cmd == "init":
        meta = {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
                "vocab_size": args.vocab, "seq_len": args.seq_len, "format": "nanoGPT"}
        return tc.init_command(args, lambda: build(args), names,
                               lambda m: init_weights(m, names), meta)
    return tc.loss_command(args, lambda path: load_model(args, path), names, args.seq_len,
                           args.vocab, check_tie)


if __name__ == "__main__":
    sys.exit(tc.run_commands(main, sys.argv[1:]))
