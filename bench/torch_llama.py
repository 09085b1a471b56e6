#!/usr/bin/python3
"""PyTorch peer for Tessera's llama benchmark (bench/llama.sh): Llama training on CPU.

The model is tests/torch_llama.py's (Hugging Face's LlamaForCausalLM written out: RMSNorm,
grouped-query attention, rotate_half RoPE, SwiGLU, untied lm_head unless --tie), with
Tessera's llama init (matrices and embedding normal(0, 0.02), norms 1). The step is
nanoGPT's, as bench/torch_gpt2.py's: forward, mean cross-entropy, backward,
clip_grad_norm_(1.0), AdamW (weight decay on the matrices and the embedding; torch's
defaults for foreach/fused), zero_grad(set_to_none). Each timed step is timed on its own:
median_step_ms and min_step_ms summarise step_ms. torch.set_num_threads(--threads),
torch.set_num_interop_threads(1). Prints ONE JSON line.

--attn sdpa (the default on a torch 2) runs F.scaled_dot_product_attention(is_causal=True)
on the repeated key/value heads, as HF's sdpa attention does; --attn manual the written-out
softmax. --compile wraps the model (forward and loss) in torch.compile; the warm-up steps
absorb the compilation (first_step_s). --precision bf16: CPU autocast around forward and
loss, float32 parameters, gradients and AdamW state. What the installed torch lacks
(Debian's 1.13 has no torch.compile and no SDPA) is refused with exit status 2.

Example:
  PY=$(scripts/peer_venv.sh); $PY bench/torch_llama.py --n_layer 12 --n_head 12 \
      --n_kv_head 4 --n_embd 768 --ffn_hidden 2048 --vocab_size 50304 --seq_len 1024 \
      --batch 2 --threads 2 --steps 3 --warmup_steps 2
"""
import argparse
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_llama as tl  # noqa: E402
# bench/torch_gpt2.py's option checks and timed loop (by path: tests/ has a torch_gpt2 too).
_spec = importlib.util.spec_from_file_location(
    "bench_torch_gpt2", os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gpt2.py"))
_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_peer)
refuse_missing, time_training = _peer.refuse_missing, _peer.time_training


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_kv_head", type=int, default=2)
    ap.add_argument("--n_embd", type=int, default=128)
    ap.add_argument("--ffn_hidden", type=int, default=384)
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--rope_theta", type=float, default=500000.0)
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup_steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--attn", choices=["manual", "sdpa"],
                    default="sdpa" if hasattr(F, "scaled_dot_product_attention") else "manual")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    refuse_missing(ap, a)
    tl.Attention.sdpa = a.attn == "sdpa"

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)

    s = tl.Shape(a.n_layer, a.n_head, a.n_kv_head, a.n_embd, a.ffn_hidden, a.vocab_size,
                 a.seq_len, rope_theta=a.rope_theta, tie_embeddings=a.tie)
    model = tl.Llama(s)
    names = tl.param_names(s)
    tl.init_weights(model, names, 0.0)  # Tessera's init (norms exactly 1)
    pm = dict(model.named_parameters())
    params = [pm[n] for n in names]
    model.train()

    time_training(a, model, params, {"model": "llama"})


if __name__ == "__main__":
    main()
