"""A Tessera llama checkpoint in Hugging Face transformers. NOT a CI test: it needs
transformers (a torch 2 venv: PY=$(scripts/peer_venv.sh); $PY -m pip install
transformers). Run by hand:

  $PY tests/check_llama_hf_checkpoint.py build/tessera [configs/llama-tiny.cfg]

Trains the config 4 steps on the fortunes shard (data/, scripts/prepare_data.sh) into a
checkpoint, resumes it for step 4 (whose loss Tessera computes with the checkpoint's
weights), loads the step directory with LlamaForCausalLM.from_pretrained (its
config.json and model.safetensors, no conversion) and computes the mean cross-entropy
of step 4's batch (the batch rule in file order, data.shuffle = false: sequences
4*B .. 5*B-1 are windows of T+1 tokens at k*T). The two losses must agree within relative 1e-5. Then the other way: a random
LlamaForCausalLM of the config's shape saved by save_pretrained in float32 and in
bfloat16 is Tessera's model.init, and Tessera's step-0 loss equals the HF model's (in
float32 from those weights) on step 0's batch within 1e-5. Exits non-zero otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def batch(toks, T, B, step):
    """Step `step`'s inputs and targets by the batch rule (docs/CONTRACT.md)."""
    S = (len(toks) - 1) // T
    win = [(step * B + i) % S for i in range(B)]
    x = torch.tensor(np.stack([toks[k * T:k * T + T] for k in win]))
    y = torch.tensor(np.stack([toks[k * T + 1:k * T + T + 1] for k in win]))
    return x, y


def hf_loss(model, x, y):
    with torch.no_grad():
        logits = model.float()(x).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   y.reshape(-1)))


def last_loss(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l][-1]


def main():
    tessera = os.path.abspath(sys.argv[1])
    cfg = sys.argv[2] if len(sys.argv) > 2 else "configs/llama-tiny.cfg"
    data = "data/fortunes_train.bin"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory() as tmp:
        # data.shuffle = false: batch() follows the file order (the batch rule without
        # the seeded epoch permutation that data.shuffle, on by default, applies).
        common = [tessera, "train", cfg, "--set", f'data.train="{data}"', "--set", 'data.val=""',
                  "--set", "data.eval_every=0", "--set", "log.progress=false",
                  "--set", "data.shuffle=false"]
        subprocess.run(common + ["--set", "train.steps=4", "--set", f'checkpoint.dir="{tmp}/ck"',
                                 "--set", f'log.metrics="{tmp}/a.jsonl"'], check=True, env=env)
        step_dir = f"{tmp}/ck/step_00000004"
        subprocess.run(common + ["--set", "train.steps=5", "--set", f'checkpoint.load="{step_dir}"',
                                 "--set", f'log.metrics="{tmp}/b.jsonl"'], check=True, env=env)
        line = last_loss(f"{tmp}/b.jsonl")
        assert line["step"] == 4
        state = json.load(open(f"{step_dir}/state.json"))
        B = state["config"]["train"]["global_batch"]
        model = LlamaForCausalLM.from_pretrained(step_dir, torch_dtype=torch.float32).eval()
        T = model.config.max_position_embeddings
        raw = np.fromfile(data, dtype=np.uint8)
        toks = np.frombuffer(raw[1024:].tobytes(), dtype=np.uint16).astype(np.int64)
        hf = hf_loss(model, *batch(toks, T, B, 4))
        rel = abs(hf - line["loss"]) / abs(hf)
        print(f"step 4 loss: Tessera {line['loss']:.8f}, LlamaForCausalLM.from_pretrained "
              f"{hf:.8f}, relative difference {rel:.2e}")
        worst = rel
        # save_pretrained -> model.init, in float32 and bfloat16.
        torch.manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            hf_model = LlamaForCausalLM(LlamaConfig.from_pretrained(step_dir)).to(dtype).eval()
            out = f"{tmp}/hf_{str(dtype).split('.')[-1]}"
            hf_model.save_pretrained(out)
            subprocess.run(common + ["--set", "train.steps=1", "--set", f'model.init="{out}"',
                                     "--set", f'log.metrics="{tmp}/c.jsonl"'], check=True, env=env)
            ours = last_loss(f"{tmp}/c.jsonl")["loss"]
            ref = hf_loss(hf_model, *batch(toks, T, B, 0))
            rel = abs(ref - ours) / abs(ref)
            worst = max(worst, rel)
            print(f"save_pretrained ({dtype}) as model.init, step 0 loss: Tessera {ours:.8f}, "
                  f"HF {ref:.8f}, relative difference {rel:.2e}")
        rel = worst
        sys.exit(0 if rel < 1e-5 else 1)


if __name__ == "__main__":
    main()
