"""A Tessera DeepSeek-V3 checkpoint in Hugging Face transformers. NOT a CI test: it needs
transformers 5 (a torch 2 venv: PY=$(scripts/peer_venv.sh); $PY -m pip install
transformers safetensors). Run by hand from the source directory:

  $PY tests/check_deepseek_hf.py build/tessera

The model is tests/fixtures/deepseek_tiny (tests/make_deepseek_fixture.py: MLA with
YaRN past its original context, a dense block, then DeepSeekMoE with sigmoid scores,
groups, a shared expert and a non-zero e_score_correction_bias), given to Tessera as
model.init (its config.json read by config_hf_deepseek.c). On a token shard of its
vocabulary (random tokens, written here) and data.shuffle = false:

 1. Tessera trains 4 steps with the aux-loss-free bias moving (train.moe_bias_rate), into
    a checkpoint, and resumes it for step 4, whose loss Tessera computes with the
    checkpoint's weights and biases. DeepseekV3ForCausalLM.from_pretrained(step_dir)
    (config.json and model.safetensors as Tessera wrote them; eager attention and
    experts, float32) must load with no key missing, unexpected or mismatched, hold the
    biases state.json records (bit for bit), and give step 4's batch the same mean
    cross-entropy within 1e-5 relative.
 2. The same with model.mtp_layers = 1 (when this Tessera builds multi-token
    prediction; else said and skipped): the step directory holds layer 3's MTP tensors;
    from_pretrained reports exactly those as unexpected (transformers 5.25's
    _keys_to_ignore_on_load_unexpected names only DeepSeek-V3's layer 61, so a model of
    another depth sees its MTP layer reported, not ignored), loads everything else, and
    gives the main loss.
 3. Without Tessera: the fixture's directory with MTP-shaped layer 3 tensors added loads
    the same way (unexpected keys: exactly those; the logits unchanged), which is what
    (2) relies on.
Exits non-zero on any mismatch.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402

try:
    import transformers
    from transformers import DeepseekV3ForCausalLM
except ImportError as e:
    raise SystemExit(f"check_deepseek_hf.py needs transformers 5 ({e}); see its docstring")

FIXTURE = os.path.join(HERE, "fixtures", "deepseek_tiny")
T, B, STEPS = 16, 4, 4
TOL = 1e-5


def write_shard(path, tokens):
    """An llm.c token shard (tests/torch_common.py read_tokens reads it back)."""
    header = struct.pack("<3i", tc.SHARD_MAGIC, tc.SHARD_VERSION, len(tokens))
    header += b"\0" * (4 * tc.SHARD_HEADER_INTS - len(header))
    with open(path, "wb") as f:
        f.write(header)
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def load(step_dir):
    m, info = DeepseekV3ForCausalLM.from_pretrained(
        step_dir, dtype=torch.float32, output_loading_info=True, attn_implementation="eager",
        experts_implementation="eager")
    return m.eval(), {k: sorted(v) for k, v in info.items() if v}


def loss_of(model, x, y):
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))), logits


def metrics(path):
    return [json.loads(line) for line in open(path) if '"loss"' in line]


def explicit_keys(mtp):
    """The fixture's model as Tessera's keys (no model.init: a random init), with `mtp`
    MTP layers."""
    c = json.load(open(os.path.join(FIXTURE, "config.json")))
    r = c["rope_parameters"]
    keys = dict(arch='"llama"', n_layer=c["num_hidden_layers"], n_embd=c["hidden_size"],
                n_head=c["num_attention_heads"], vocab_size=c["vocab_size"],
                ffn_hidden=c["intermediate_size"], norm_eps=c["rms_norm_eps"],
                tie_embeddings="false", rope_theta=r["rope_theta"], q_lora_rank=c["q_lora_rank"],
                kv_lora_rank=c["kv_lora_rank"], qk_nope_head_dim=c["qk_nope_head_dim"],
                qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
                moe_experts=c["n_routed_experts"], moe_top_k=c["num_experts_per_tok"],
                moe_ffn_hidden=c["moe_intermediate_size"], moe_shared_experts=c["n_shared_experts"],
                moe_router='"sigmoid"', moe_norm_topk="true",
                moe_route_scale=c["routed_scaling_factor"], moe_groups=c["n_group"],
                moe_topk_groups=c["topk_group"], moe_first_dense=c["first_k_dense_replace"],
                rope_type='"yarn"', rope_scaling=r["factor"],
                rope_original_context=r["original_max_position_embeddings"],
                rope_beta_fast=r["beta_fast"], rope_beta_slow=r["beta_slow"],
                rope_mscale=r["mscale"], rope_mscale_all_dim=r["mscale_all_dim"], mtp_layers=mtp)
    return " ".join(f"{k} = {float(v) if isinstance(v, float) else v};" for k, v in keys.items())


def tessera_run(tessera, tmp, shard, model_keys, env):
    """Train STEPS steps of the model `model_keys` (libconfig text) into tmp/ck, resume for
    step STEPS; (step_dir, step STEPS's metrics line) or None when Tessera refuses the
    config (the message printed)."""
    cfg = os.path.join(tmp, "deepseek.cfg")
    with open(cfg, "w") as f:
        f.write(f"model = {{ {model_keys} seq_len = {T}; }};\n")
    common = [tessera, "train", cfg,
              "--set", f"train.global_batch={B}", "--set", "parallel.micro_batch=2",
              "--set", f'data.train="{shard}"', "--set", 'data.val=""', "--set",
              "data.eval_every=0", "--set", "log.progress=false", "--set", "data.shuffle=false",
              "--set", "train.lr=1e-2", "--set", "train.warmup=1", "--set",
              "train.moe_bias_rate=0.01", "--set", "train.lr_decay_steps=8"]
    ck = os.path.join(tmp, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    r = subprocess.run(common + ["--set", f"train.steps={STEPS}", "--set", f'checkpoint.dir="{ck}"',
                                 "--set", f'log.metrics="{tmp}/a.jsonl"'],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print("  tessera refused: " + (r.stderr.strip().splitlines() or ["?"])[-1])
        return None
    step_dir = os.path.join(ck, f"step_{STEPS:08d}")
    subprocess.run(common + ["--set", f"train.steps={STEPS + 1}", "--set",
                             f'checkpoint.load="{step_dir}"', "--set",
                             f'log.metrics="{tmp}/b.jsonl"'], check=True, env=env,
                   capture_output=True)
    line = metrics(f"{tmp}/b.jsonl")[-1]
    assert line["step"] == STEPS, line
    return step_dir, line


def check_biases(model, step_dir):
    """The biases from_pretrained holds against state.json's bits."""
    state = json.load(open(os.path.join(step_dir, "state.json")))
    E = state["moe_bias"]["experts"]
    bits = torch.tensor(state["moe_bias"]["bits"], dtype=torch.int64).to(torch.int32)
    want = bits.view(torch.float32).view(-1, E)
    worst, moved = 0.0, 0.0
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue
        have = gate.e_score_correction_bias.float()
        worst = max(worst, float((have - want[i]).abs().max()))
        moved = max(moved, float(want[i].abs().max()))
    return worst, moved


def check_checkpoint(tessera, tmp, shard, x, y, env, mtp):
    name = "with 1 MTP layer" if mtp else "without MTP"
    # without MTP the fixture's directory as model.init (its config.json gives every model
    # key); with MTP, which no HF save_pretrained holds, a random init of the same model
    keys = explicit_keys(1) if mtp else f'init = "{FIXTURE}";'
    got = tessera_run(tessera, tmp, shard, keys, env)
    if got is None:
        return None
    step_dir, line = got
    model, info = load(step_dir)
    n_layer = model.config.num_hidden_layers
    want_unexpected = set()
    if mtp:
        saved = set()
        for f in os.listdir(step_dir):
            if f.startswith("model") and f.endswith(".safetensors"):
                saved |= set(tc.read_safetensors(os.path.join(step_dir, f))[0])
        want_unexpected = {reported(n) for n in saved if n.startswith(f"model.layers.{n_layer}.")}
    unexpected = set(info.pop("unexpected_keys", []))
    ok = not info and unexpected == want_unexpected and (not mtp or bool(want_unexpected))
    hf, _ = loss_of(model, x, y)
    main = line["loss"]  # the main loss (the MTP depths are "mtp_loss")
    rel = abs(hf - main) / abs(hf)
    bias_err, bias_size = check_biases(model, step_dir)
    print(f"{name}: step {STEPS} loss Tessera {main:.8f}, from_pretrained {hf:.8f} (rel "
          f"{rel:.2e}, required < {TOL}); other loading reports {info or 'none'}; unexpected "
          f"{len(unexpected)} keys ({'as expected' if unexpected == want_unexpected else 'NOT the MTP layer'})"
          f"; biases off state.json's by {bias_err:.3g} (largest {bias_size:.3g})")
    ok &= rel < TOL and bias_err == 0.0 and bias_size > 0.0
    if not ok:
        print("  FAIL")
    return ok


def reported(name):
    """A checkpoint name as transformers 5 reports it (its experts fused on load)."""
    import re
    name = re.sub(r"experts\.\d+\.(gate|up)_proj\.weight$", "experts.gate_up_proj", name)
    return re.sub(r"experts\.\d+\.down_proj\.weight$", "experts.down_proj", name)


def check_mtp_names_alone(x):
    """(3): the fixture directory plus MTP-shaped layer-3 tensors."""
    base, info0 = load(FIXTURE)
    _, logits0 = loss_of(base, x, x)
    w, meta = tc.read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    C = base.config.hidden_size
    extra = {}
    pre = f"model.layers.{base.config.num_hidden_layers}."
    for n in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight",
              "input_layernorm.weight", "post_attention_layernorm.weight"):
        extra[pre + n] = torch.ones(C)
    extra[pre + "eh_proj.weight"] = torch.zeros(C, 2 * C)
    for n, t in w.items():  # a copy of block 1 (MoE) as the MTP block's
        if n.startswith("model.layers.1.") and "layernorm" not in n:
            extra[pre + n[len("model.layers.1."):]] = t
    with tempfile.TemporaryDirectory() as d:
        cfg = json.load(open(os.path.join(FIXTURE, "config.json")))
        cfg["num_nextn_predict_layers"] = 1
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        tc.write_safetensors(os.path.join(d, "model.safetensors"), list(w.items()) + list(extra.items()),
                             {"format": "pt"})
        m, info = load(d)
    _, logits = loss_of(m, x, x)
    unexpected = set(info.pop("unexpected_keys", []))
    same = torch.equal(logits, logits0)
    want = {reported(n) for n in extra}
    ok = not info and not info0 and unexpected == want and same
    print(f"fixture + {len(extra)} MTP-shaped layer {base.config.num_hidden_layers} tensors: "
          f"from_pretrained reports {len(unexpected)} unexpected keys "
          f"({'exactly those' if unexpected == want else 'OTHERS'}: experts fused), nothing else "
          f"{'' if not info else info}, logits {'unchanged' if same else 'CHANGED'}")
    return ok


def main():
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    tessera = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    cfg = json.load(open(os.path.join(FIXTURE, "config.json")))
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, V, (B * (STEPS + 2) * (T + 1) + 1,), generator=g)
    x, y = tc.batch(tokens, T, B, STEPS)
    ok = check_mtp_names_alone(x)
    if tessera:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        with tempfile.TemporaryDirectory() as tmp:
            shard = os.path.join(tmp, "tokens.bin")
            write_shard(shard, tokens.tolist())
            for mtp in (False, True):
                r = check_checkpoint(tessera, tmp, shard, x, y, env, mtp)
                if r is None:
                    print(f"{'with' if mtp else 'without'} MTP: not run (Tessera refused it)")
                    ok &= mtp  # the one without MTP must run
                else:
                    ok &= r
    else:
        print("no tessera binary given: the checkpoint checks not run")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
