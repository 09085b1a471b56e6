#!/usr/bin/python3
"""Generate Tessera's Mixture-of-Experts correctness fixtures with a PyTorch reference
(tests/torch_moe.py: Hugging Face's MixtralForCausalLM / Qwen3MoeForCausalLM and
DeepSeek-V3's routing written out; tests/check_moe_hf.py compares it with transformers'
own classes).

Writes (deterministically; rerunning gives byte-identical files), for STEM in mixtral_tiny,
qwen3moe_tiny, dsmoe_tiny:
  tests/fixtures/STEM_weights.safetensors  float32 weights, HF names (dsmoe_tiny also
                                           each MoE layer's e_score_correction_bias, zeros)
  tests/fixtures/STEM_expect.safetensors   float64 reference: loss, gradients, 5 AdamW
                                           steps (losses, lrs, grad norms, final
                                           parameters), and the MoE's own records below

The three models share tests/make_llama_fixture.py's tiny llama (C 32, 4 query heads
sharing 2 key/value heads, vocabulary 96, T 16, rope_theta 10000, lm_head untied):
  mixtral_tiny   2 layers, both MoE: 4 experts top-2 of width 24, softmax, norm_topk
                 (Mixtral), Mixtral's names; no auxiliary losses.
  qwen3moe_tiny  2 layers, moe_every 2: layer 0 dense (SwiGLU 48), layer 1 MoE of 4
                 experts top-2 of width 24, softmax without norm_topk, q/k RMSNorm
                 (Qwen3-MoE), heads of 16 (head_dim, not n_embd / n_head = 8: the
                 q|k|v and attention widths 64 exceed C, as Qwen3-MoE's 128 at 2048 do),
                 Qwen3-MoE's names; no auxiliary losses.
  dsmoe_tiny     3 layers, moe_first_dense 1: layer 0 dense (SwiGLU 48), layers 1 and 2 MoE
                 of 16 experts top-4 of width 24 in 4 groups, 2 kept (each gives its top
                 2, DeepSeek-V3's rule), sigmoid, norm_topk, route_scale 2.5, 1 shared
                 expert; z-loss 1e-3, sequence-wise balance loss 1e-2, aux-loss-free bias
                 at rate 1e-2 (updated after every optimizer step: it moves, and it changes
                 the selection within the 5 steps: printed and required). 16 experts, not
                 8: with 8 in 4 groups each group holds just the K/topk_groups = 2 experts
                 its score sums, so the 2 kept groups' 4 experts would be the top-4 and the
                 top-K over the unmasked experts would never choose.
Weights: tests/make_llama_fixture.py's init (matrices normal(0, 0.02), q_proj and k_proj
normal(0, 0.2) so that the attention matters, every RMSNorm weight 1 + normal(0, 0.1),
q_norm and k_norm included) with the routers wider (normal(0, 0.2); the sigmoid one 0.6):
at 0.02 the router logits would be nearly equal, the routing weights nearly uniform and the
selection a near-tie that float32 could flip. A selection flip between float64 and
Tessera's float32 would break the fixture test, so the generator also trains the same 5
steps in float32 and requires the same selections at every step and the smallest
selection margin (the gap between the last selected and the first unselected sel value,
or group score, over every token, MoE layer and forward) to exceed 50 times float32's
largest error in sel (its errors grow over the steps: AdamW's first steps move a weight
by about lr whatever its gradient's size, so a gradient near float32's noise moves it
differently).

The expect file's MoE records (i = an MoE layer's index; "adamw_NAME" stacks NAME of each
of the 5 steps' forwards, [5, ...]):
  moe_aux_loss [1], moe_z_loss [1]  the forward's sequence-wise and z losses (with their
                                    coefficients, summed over the MoE layers; 0 when off)
  moe_counts.i [E] I32              tokens routed to each expert over the batch
  moe_topk_idx.i [B*T, K] I32       the selection, in descending order of sel
  moe_bias.i [E]                    (bias only) the bias that forward selected with
  final.model.layers.i.mlp.gate.e_score_correction_bias  (bias only) after the 5 updates
The metadata holds every MoE key by Tessera's name (moe_experts ... moe_bias_rate,
qk_norm), moe_layers and hf_naming, besides the llama keys. The loss is the cross-entropy
alone; the gradients (and so the steps) are of cross-entropy + the auxiliary losses.

Run:  /usr/bin/python3 tests/make_moe_fixture.py   (needs torch, 1.13 or 2; no other packages)
"""
import math
import os
import sys

import torch

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402
import torch_moe as tm  # noqa: E402

# ---- hyperparameters (the batch, seeds and optimizer: torch_common.FIXTURE) ---------------
LLAMA = dict(n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=96, seq_len=16,
             rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)
# stem: (shape, the routers' init std; see ROUTER_STD)
FIXTURES = {
    "mixtral_tiny": (tm.MoeShape(
        "mixtral", moe_experts=4, moe_top_k=2, moe_ffn_hidden=24, moe_router="softmax",
        moe_norm_topk=True, n_layer=2, **LLAMA), 0.2),
    "qwen3moe_tiny": (tm.MoeShape(
        "qwen3_moe", moe_experts=4, moe_top_k=2, moe_ffn_hidden=24, moe_router="softmax",
        moe_norm_topk=False, moe_every=2, qk_norm=True, n_layer=2, head_dim=16, **LLAMA), 0.2),
    "dsmoe_tiny": (tm.MoeShape(
        "deepseek", moe_experts=16, moe_top_k=4, moe_ffn_hidden=24, moe_shared_experts=1,
        moe_router="sigmoid", moe_norm_topk=True, moe_route_scale=2.5, moe_groups=4,
        moe_topk_groups=2, moe_first_dense=1, moe_z_loss=1e-3, moe_aux_loss=1e-2,
        moe_bias_rate=1e-2, n_layer=3, **LLAMA), 0.6),
}
QK_STD = 0.2            # q_proj, k_proj: peaked attention, so that RoPE matters
NORM_PERTURB = 0.1      # noise added to the RMSNorm weights (and q/k norms) after init
# ROUTER_STD (per fixture, above): wide enough that the router logits differ (at 0.02 the
# selection would be a near-tie), chosen among 0.2..1.0 for the largest selection margin
# against float32's error in sel over the 5 steps (a sigmoid router needs the wider logits)
MIN_MARGIN_RATIO = 50   # the smallest selection gap over float32's largest error in sel


def std_of(router_std):
    def std(name):
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            return QK_STD
        return router_std if name.endswith(".gate.weight") else 0.02
    return std


def make(stem, s, router_std):
    names = tm.param_names(s)
    margins, changed = [], []

    sels = []  # per forward: {layer: (topk_idx, sel)}

    def record(m):
        f64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731  (stored as [1], [5])
        out = {"moe_aux_loss": f64(m.moe_aux_loss), "moe_z_loss": f64(m.moe_z_loss)}
        step_margin, step_changed = math.inf, 0
        sels.append({i: (moe.last_idx, moe.last_sel) for i, moe in m.moes().items()})
        for i, moe in m.moes().items():
            out[f"moe_counts.{i}"] = moe.last_counts.to(torch.int32)
            out[f"moe_topk_idx.{i}"] = moe.last_idx.to(torch.int32)
            if moe.gate.bias() is not None:
                out[f"moe_bias.{i}"] = moe.gate.bias().detach().double().clone()
            step_margin = min(step_margin, moe.last_margin)
            step_changed += moe.last_bias_changed
        margins.append(step_margin)
        changed.append(step_changed)
        return out

    e_meta = {
        "moe_records": "moe_aux_loss, moe_z_loss: the forward's losses with coefficients, "
                       "summed over MoE layers; moe_counts.i [E]: tokens per expert; "
                       "moe_topk_idx.i [B*T,K]: selection in descending sel order (ties: "
                       "lower index); moe_bias.i [E]: the bias the forward selected with; "
                       "adamw_NAME: NAME of each step's forward [steps,...]",
        "objective": "loss = mean cross-entropy (reported); gradients of cross-entropy + "
                     "moe_z_loss + moe_aux_loss",
    }
    if s.has_bias:
        e_meta["moe_bias_update"] = ("after each AdamW step: bias += moe_bias_rate * "
                                     "sign(B*T*K/E - counts) per MoE layer; not a parameter")
    fx = tc.make_fixture(
        stem, lambda: tm.MoeLM(s), names,
        lambda m: tm.init_weights(m, names, NORM_PERTURB, std_of(router_std)), s.meta(),
        s.vocab_size,
        "Tessera's llama init (matrices and embedding normal 0.02, RMSNorm weights 1) "
        f"except q_proj, k_proj normal {QK_STD}, routers (gate.weight) normal {router_std}; "
        f"then every RMSNorm weight (q_norm, k_norm included) perturbed by "
        f"+normal(0,{NORM_PERTURB}); biases zero",
        buffers=tm.buffer_names(s), record=record,
        after_step=(lambda m, _: tm.update_bias(m)) if s.has_bias else None, e_meta=e_meta)

    lines = [f"{stem}: {s.n_layer} layers, MoE layers {s.moe_layers()}, E {s.moe_experts} "
             f"top-{s.moe_top_k} width {s.moe_ffn_hidden}, {s.moe_router}, norm_topk "
             f"{s.moe_norm_topk}, route_scale {s.moe_route_scale}, groups {s.moe_groups}/"
             f"{s.moe_topk_groups}, shared {s.moe_shared_experts}, qk_norm {s.qk_norm}, "
             f"aux {s.moe_aux_loss} z {s.moe_z_loss} bias_rate {s.moe_bias_rate}"]
    rec = fx.steps_recorded
    lines.append("adamw_moe_aux_loss " + " ".join(f"{float(x):.10g}" for x in rec["moe_aux_loss"]))
    lines.append("adamw_moe_z_loss " + " ".join(f"{float(x):.10g}" for x in rec["moe_z_loss"]))
    for i in s.moe_layers():
        lines.append(f"counts layer {i} per step: "
                     + " | ".join(" ".join(str(int(c)) for c in t) for t in rec[f"moe_counts.{i}"]))
    ok = True
    if s.has_bias:
        for i in s.moe_layers():
            b = fx.final.moes()[i].gate.bias()
            lines.append(f"final bias layer {i}: " + " ".join(f"{float(x):+.2f}" for x in b))
        # changed[0] is the initial forward's (bias 0), then one per step
        lines.append(f"tokens x layers whose top-K the bias changed, per step: {changed[1:]}")
        ok &= sum(changed[1:]) > 0
        ok &= all(float(x) > 0 for x in rec["moe_aux_loss"] + rec["moe_z_loss"])
    # The same 5 steps in float32 (as Tessera computes): the same selections at every
    # step, and how far float32's sel strays from float64's against the margin.
    sels32 = []

    def hook32(m, _):
        sels32.append({i: (moe.last_idx, moe.last_sel) for i, moe in m.moes().items()})
        if s.has_bias:
            tm.update_bias(m)
    m32 = fx.fresh_double().float()
    tc.train(m32, names, tc.FIXTURE, tc.FIXTURE.train_steps, lambda _: (fx.tokens, fx.targets),
             hook32)
    same, err32 = True, 0.0
    for f64s, f32s in zip(sels[1:], sels32):
        for i, (idx64, sel64) in f64s.items():
            idx32, sel32 = f32s[i]
            same &= torch.equal(idx64, idx32)
            err32 = max(err32, float((sel32.double() - sel64).abs().max()))
    margin = min(margins)
    lines.append(f"smallest selection margin {margin:.3g} (per forward: "
                 + " ".join(f"{x:.2g}" for x in margins) + ")")
    lines.append(f"the 5 steps in float32: {'the same' if same else 'DIFFERENT'} selections; "
                 f"largest |sel32 - sel64| {err32:.3g}, margin / that {margin / err32:.3g} "
                 f"(required > {MIN_MARGIN_RATIO})")
    ok &= same and margin > MIN_MARGIN_RATIO * err32
    for kind in ("weights", "expect"):
        path = os.path.join(HERE, "fixtures", f"{stem}_{kind}.safetensors")
        lines.append(f"{path}: {os.path.getsize(path)} bytes")
    return tc.report_fixture(fx, s.vocab_size, lines, ok)


def main():
    rc = 0
    for stem, (s, router_std) in FIXTURES.items():
        rc = make(stem, s, router_std) or rc
        print()
    return rc


if __name__ == "__main__":
    sys.exit(main())
