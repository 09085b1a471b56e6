#!/usr/bin/env python3
"""Generate Tessera's DeepSeek-V3 correctness fixture from Hugging Face transformers' own
DeepseekV3ForCausalLM (multi-head latent attention, YaRN, DeepSeekMoE), in float64.

Needs a torch 2 python with transformers 5 and safetensors (NOT a CI dependency: the
files it writes are committed), e.g. the benchmark peer's venv:
  PY=$(scripts/peer_venv.sh); $PY tests/make_deepseek_fixture.py
Deterministic: rerunning with the same torch and transformers gives the same files.

Writes, for STEM = deepseek_tiny:
  tests/fixtures/deepseek_tiny/           DeepseekV3ForCausalLM.save_pretrained (float32):
                                          config.json + model.safetensors, HF's checkpoint
                                          names (experts per expert, each MoE layer's
                                          mlp.gate.e_score_correction_bias). The C test
                                          loads it as model.init, config.json included.
  tests/fixtures/deepseek_tiny_expect.safetensors
      float64 reference in tests/torch_common.py's fixture format: tokens, targets, loss,
      grad.NAME of every parameter (HF's checkpoint names: a fused expert gradient split
      per expert), adamw_losses / adamw_lrs / adamw_grad_norms of 5 AdamW steps (the
      recipe torch_common.FIXTURE, which tests/fixture_check.h trains with), final.NAME
      after them; moe_counts.i [E] I32 (tokens routed to each expert by MoE layer i in the
      first forward) and adamw_moe_counts.i [5, E] (each step's forward). The bias is
      state, not a parameter: it does not move (no update rule in transformers).

The model (transformers 5's DeepseekV3Config; every field below is in config.json):
  3 layers, hidden 64, 4 heads, vocab 96, untied head, rms_norm_eps 1e-5;
  MLA: q_lora_rank 32, kv_lora_rank 16, qk_nope_head_dim 16, qk_rope_head_dim 8,
       v_head_dim 16, rope_interleave true (adjacent pairs), no attention bias;
  YaRN: rope_theta 10000, factor 4, original_max_position_embeddings 8 (the batch's 16
       positions reach beyond it), beta_fast 32, beta_slow 0.01, mscale 1, mscale_all_dim
       0.5. Why not V3's beta_slow 1 and mscale_all_dim 1: with a rope head of 8 and an
       original context of 8, beta 32/1 leaves every frequency at an end of YaRN's ramp
       (pair 0 kept, the rest divided by the factor), and equal mscales make the cos/sin
       factor 1; 0.01 puts two pairs inside the ramp (1/3, 2/3), and unequal mscales
       give cos/sin the factor mscale(1)/mscale(0.5) = 1.065 and the softmax
       mscale(0.5)^2 = 1.143, so the fixture checks the ramp's blend, the floor/ceil and
       clamp of its ends, and both mscale uses. The latent norms (q_a_layernorm,
       kv_a_layernorm) use transformers' fixed eps 1e-6, not rms_norm_eps (1e-5 here, so
       the difference is visible: q_a_proj's output is small).
  MoE: first_k_dense_replace 1 (layer 0 a SwiGLU of intermediate_size 96), layers 1-2
       of 8 routed experts (moe_intermediate_size 32) top-2, n_group 2 / topk_group 1
       (HF scores a group by its top 2 = K / topk_group: Tessera's rule), sigmoid scores,
       noaux_tc with a non-zero e_score_correction_bias (it changes selections: printed
       and required), norm_topk_prob, routed_scaling_factor 2.5, 1 shared expert;
       num_nextn_predict_layers 0 (HF's model has no MTP).
Computation: HF's modules as shipped cast RMSNorm, the router, the attention softmax and
the rotary tables to float32 even in a float64 model; here those casts read float64 (the
modules' `torch.float32`/`torch.float` rebound, as tests/check_moe_hf.py's hf64 does, the
YaRN tables computed by HF's own code under the same rebinding) so the reference is float64
throughout. attn_implementation and experts_implementation "eager". The loss is the mean
cross-entropy of logits against the fixture's targets (not HF's shifted labels).

Weights: every matrix normal(0, 0.02) except q_b_proj, kv_a_proj_with_mqa, kv_b_proj
normal(0, 0.2) (so the attention is peaked and RoPE matters) and the routers (ROUTER_STDS,
chosen for the selection margin); every RMSNorm weight 1 + normal(0, 0.1); the bias
uniform(-BIAS, BIAS). A selection flip between float64 and Tessera's float32 would break the
C test (a swapped expert changes the loss by far more than its tolerance), so the 5 steps
are also trained in float32 (HF as shipped) and every deciding gap (per token, MoE layer
and forward: the kept group's score over the best dropped one's, the K-th allowed expert's
score over the (K+1)-th's) is compared with how far float32 moved it: in the first forward
(whose loss and gradients the test checks) each must exceed MIN_MARGIN_RATIO times its
float32 error; over the steps' forwards, where AdamW's first step moves a weight whose
gradient is near float32's noise by up to lr in either direction, the selections must be
the same and each gap larger than its error. And float32's own error in the parameters
after the 5 steps (relative L2 per tensor, HF float32 against float64: AdamW's sign noise)
must stay under MAX_PARAM_ERR32, well inside the C test's 1e-4 (at some router stds HF's
float32 alone exceeds 1e-4). Of the router stds that pass, the one with the largest
smallest ratio is kept (0.6: 2480 in the first forward, 134 over all; float32's worst
parameter 1.6e-5). The C test checks each forward's per-expert counts, so a flip in
Tessera is named, not hidden. HF as shipped in
float64 (with its float32 casts) must give the loss within 1e-6, so the rebinding removed
casts and nothing else.
"""
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402

try:
    import transformers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers import modeling_rope_utils
    from transformers.models.deepseek_v3 import modeling_deepseek_v3
except ImportError as e:
    raise SystemExit(f"make_deepseek_fixture.py needs transformers 5 ({e}); see its docstring")

STEM = "deepseek_tiny"
CONFIG = dict(
    vocab_size=96, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
    first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    hidden_act="silu", max_position_embeddings=32, rms_norm_eps=1e-5,
    tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
    rope_interleave=True, num_mtp_layers=0, initializer_range=0.02,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 8, "beta_fast": 32.0,
                     "beta_slow": 0.01, "mscale": 1.0, "mscale_all_dim": 0.5},
)
WIDE = ("q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight")
WIDE_STD = 0.2
NORM_PERTURB = 0.1
ROUTER_STDS = (0.1, 0.2, 0.3, 0.45, 0.6)  # the one with the largest margin ratio is kept
BIAS = 0.05                          # e_score_correction_bias ~ uniform(-BIAS, BIAS)
MIN_MARGIN_RATIO = 50
MAX_PARAM_ERR32 = 4e-5   # HF float32's parameters after the steps; the C test allows 1e-4


# ---- HF in float64 ---------------------------------------------------------------------------
class _Torch64:
    """The `torch` a modeling module sees in hf64: float32 (and torch.float) are float64."""
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


class hf64:
    """Context: DeepSeek-V3's modules (and the rope tables' code) compute in float64."""
    MODULES = (modeling_deepseek_v3, modeling_rope_utils)

    def __enter__(self):
        self.saved = [(m, m.torch) for m in self.MODULES]
        for m in self.MODULES:
            m.torch = _Torch64()
        return self

    def __exit__(self, *exc):
        for m, t in self.saved:
            m.torch = t


def hf_config():
    cfg = DeepseekV3Config(**CONFIG)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


# ---- names: HF's checkpoint (per expert) and its model (fused experts) -----------------------
def checkpoint_names(cfg):
    """Every parameter's checkpoint name, in model order; and the buffers (the biases)."""
    names, bufs = ["model.embed_tokens.weight"], []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"]
        names += [p + "self_attn." + n for n in (
            "q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
            "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
            "o_proj.weight")]
        names += [p + "post_attention_layernorm.weight"]
        trio = ("gate_proj", "up_proj", "down_proj")
        if i < cfg.first_k_dense_replace:
            names += [f"{p}mlp.{n}.weight" for n in trio]
            continue
        names += [p + "mlp.gate.weight"]
        for j in range(cfg.n_routed_experts):
            names += [f"{p}mlp.experts.{j}.{n}.weight" for n in trio]
        names += [f"{p}mlp.shared_experts.{n}.weight" for n in trio]
        bufs.append(p + "mlp.gate.e_score_correction_bias")
    names += ["model.norm.weight", "lm_head.weight"]
    return names, bufs


def moe_layers(cfg):
    return list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))


def unfuse(cfg, named):
    """{checkpoint name: tensor} from HF's module tensors (experts fused)."""
    out, Fh = {}, cfg.moe_intermediate_size
    for n, t in named.items():
        if n.endswith("experts.gate_up_proj"):
            base = n[:-len("gate_up_proj")]
            for j in range(cfg.n_routed_experts):
                out[f"{base}{j}.gate_proj.weight"] = t[j, :Fh]
                out[f"{base}{j}.up_proj.weight"] = t[j, Fh:]
        elif n.endswith("experts.down_proj"):
            base = n[:-len("down_proj")]
            for j in range(cfg.n_routed_experts):
                out[f"{base}{j}.down_proj.weight"] = t[j]
        else:
            out[n] = t
    return out


def init_weights(cfg, names, bufs, router_std):
    """F32 tensors under the checkpoint names, drawn in `names` order (then the biases)."""
    torch.manual_seed(tc.FIXTURE.init_seed)
    shapes = {n: tuple(t.shape) for n, t in unfuse(cfg, dict(
        DeepseekV3ForCausalLM(hf_config()).state_dict())).items()}
    sd = {}
    for n in names:
        if len(shapes[n]) == 1:
            sd[n] = torch.ones(shapes[n])
        else:
            std = (WIDE_STD if n.endswith(WIDE) else router_std if n.endswith("mlp.gate.weight")
                   else 0.02)
            sd[n] = torch.randn(shapes[n]) * std
    for n in names:
        if sd[n].dim() == 1:
            sd[n] += torch.randn(shapes[n]) * NORM_PERTURB
    for n in bufs:
        sd[n] = (torch.rand(shapes[n]) * 2 - 1) * BIAS
    return {n: t.float() for n, t in sd.items()}


def load_hf(directory, dtype):
    """from_pretrained of `directory`, strict: nothing missing, unexpected or mismatched."""
    m, info = DeepseekV3ForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True,
        attn_implementation="eager", experts_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"from_pretrained({directory}): {bad}")
    return m.to(dtype)


class LM(torch.nn.Module):
    """The HF model with the fixture's loss: mean cross-entropy of logits vs targets; in
    float64 with hf64's casts when `f64`."""

    def __init__(self, hf, f64):
        super().__init__()
        self.hf, self.f64 = hf, f64

    def forward(self, x, y):
        if self.f64:
            with hf64():
                logits = self.hf(input_ids=x, use_cache=False).logits
        else:
            logits = self.hf(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# ---- the routing's records ---------------------------------------------------------------------
class Routing:
    """Forward hooks on each MoE layer's router: per forward, each layer's selection, the
    scores it selected by, its smallest margin, and how many tokens the bias changed."""

    def __init__(self, hf, cfg):
        self.cfg, self.forwards, self.cur = cfg, [], None
        for i in moe_layers(cfg):
            hf.model.layers[i].mlp.gate.register_forward_hook(self._hook(i))

    def begin(self):
        self.cur = {}
        self.forwards.append(self.cur)

    def _hook(self, layer):
        def hook(mod, _inp, out):
            logits, _w, idx = out
            c = self.cfg
            E, G, TG, K = c.n_routed_experts, c.n_group, c.topk_group, c.num_experts_per_tok
            with torch.no_grad():
                scores = logits.sigmoid()
                sfc = scores + mod.e_score_correction_bias.to(scores.dtype)
                idx = idx.sort(dim=-1).values

                def select(s):
                    gs = s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
                    gsort = gs.sort(dim=-1, descending=True).values
                    gmargin = (gsort[:, TG - 1] - gsort[:, TG]) if TG < G else None
                    keep = torch.zeros_like(gs).scatter_(1, gs.topk(TG, dim=-1)[1], 1)
                    mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                    ms = s.masked_fill(~mask, float("-inf")).sort(dim=-1, descending=True).values
                    emargin = ms[:, K - 1] - ms[:, K]
                    m = emargin if gmargin is None else torch.minimum(gmargin, emargin)
                    sel = s.masked_fill(~mask, float("-inf")).topk(K, dim=-1)[1].sort(-1).values
                    return sel, float(m.min())
                sel, margin = select(sfc)
                assert torch.equal(sel, idx), "the hook's selection is not HF's"
                unbiased, _ = select(scores)
                self.cur[layer] = dict(
                    idx=idx.clone(), sfc=sfc.detach().double().clone(), margin=margin,
                    changed=int((unbiased != idx).any(-1).sum()),
                    counts=torch.bincount(idx.reshape(-1), minlength=E).to(torch.int32))
        return hook


def gap_ratio(cfg, s64, s32):
    """The smallest, over the tokens, of each deciding gap (the kept group's score over the
    best dropped group's; the K-th allowed expert's over the (K+1)-th) in float64, over
    how much float32 moved that same gap."""
    E, G, TG, K = cfg.n_routed_experts, cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok
    gaps = []
    gs64 = s64.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
    gs32 = s32.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
    order = gs64.argsort(dim=-1, descending=True)
    if TG < G:
        a, b = order[:, TG - 1:TG], order[:, TG:TG + 1]
        gaps.append((gs64.gather(1, a) - gs64.gather(1, b), gs32.gather(1, a) - gs32.gather(1, b)))
    keep = torch.zeros_like(gs64).scatter_(1, order[:, :TG], 1)
    mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
    eo = s64.masked_fill(~mask, float("-inf")).argsort(dim=-1, descending=True)
    a, b = eo[:, K - 1:K], eo[:, K:K + 1]
    gaps.append((s64.gather(1, a) - s64.gather(1, b), s32.gather(1, a) - s32.gather(1, b)))
    return min(float((g64 / (g64 - g32).abs().clamp_min(1e-300)).min()) for g64, g32 in gaps)


def run(hf_dir, cfg, names, tokens, targets, f64):
    """Loss and gradients at the initial weights, then FIXTURE's AdamW steps; the routing
    of every forward (the first, then one per step)."""
    torch.manual_seed(0)
    hf = load_hf(hf_dir, torch.float64 if f64 else torch.float32)
    if f64:
        # the rotary tables in float64, by HF's own YaRN code under hf64
        with hf64():
            inv, att = modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"](hf.config)
        hf.model.rotary_emb.inv_freq = inv.to(torch.float64)
        hf.model.rotary_emb.attention_scaling = att
    routing = Routing(hf, cfg)
    model = LM(hf, f64)
    pnames = [n for n, _ in model.named_parameters()]
    routing.begin()
    loss = model(tokens, targets)
    loss.backward()
    grads = unfuse(cfg, {n[len("hf."):]: p.grad.detach().double()
                         for n, p in model.named_parameters()})
    loss0 = loss.item()
    model.zero_grad(set_to_none=True)
    # a fresh copy for the steps (the same weights)
    hf = load_hf(hf_dir, torch.float64 if f64 else torch.float32)
    if f64:
        with hf64():
            inv, att = modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"](hf.config)
        hf.model.rotary_emb.inv_freq = inv.to(torch.float64)
        hf.model.rotary_emb.attention_scaling = att
    steps_routing = Routing(hf, cfg)
    model = LM(hf, f64)
    steps_routing.begin()

    def after(_m, s):
        if s + 1 < tc.FIXTURE.train_steps:
            steps_routing.begin()
    _, losses, lrs, norms = tc.train(model, pnames, tc.FIXTURE, tc.FIXTURE.train_steps,
                                     lambda _: (tokens, targets), after)
    final = unfuse(cfg, {n[len("hf."):]: p.detach().double()
                         for n, p in model.named_parameters()})
    return dict(loss0=loss0, grads=grads, losses=losses, lrs=lrs, norms=norms, final=final,
                routing=routing.forwards + steps_routing.forwards, inv_freq=hf.model.rotary_emb)


def attempt(cfg, names, bufs, router_std, tokens, targets, outdir):
    """The fixture at one router std: (ok, margin ratio, results, report lines)."""
    sd = init_weights(cfg, names, bufs, router_std)
    with tempfile.TemporaryDirectory() as d:
        hf_config().save_pretrained(d)
        tc.write_safetensors(os.path.join(d, "model.safetensors"), list(sd.items()),
                             {"format": "pt"})
        hf = load_hf(d, torch.float32)
        hf.save_pretrained(outdir)
    r64 = run(outdir, cfg, names, tokens, targets, True)
    r32 = run(outdir, cfg, names, tokens, targets, False)
    same, err32, margin, changed, ratio = True, 0.0, math.inf, 0, math.inf
    first_ratio = math.inf
    for k, (f64s, f32s) in enumerate(zip(r64["routing"], r32["routing"])):
        for i in f64s:
            same &= torch.equal(f64s[i]["idx"], f32s[i]["idx"])
            err32 = max(err32, float((f32s[i]["sfc"] - f64s[i]["sfc"]).abs().max()))
            margin = min(margin, f64s[i]["margin"])
            changed += f64s[i]["changed"]
            r_ = gap_ratio(cfg, f64s[i]["sfc"], f32s[i]["sfc"])
            ratio = min(ratio, r_)
            if k == 0:
                first_ratio = min(first_ratio, r_)
    # float32's own error in the parameters after the 5 steps (relative L2 per tensor):
    # the C test holds Tessera's to 1e-4, so HF's float32 must stay well inside it
    worst32, worst32_name = max((float((r32["final"][n] - r64["final"][n]).norm()
                                       / r64["final"][n].norm()), n) for n in names)
    lines = [f"router std {router_std}: the 5 steps in float32 give "
             f"{'the same' if same else 'DIFFERENT'} selections; smallest margin {margin:.3g}, "
             f"largest |score32 - score64| {err32:.3g}; smallest ratio of a deciding gap to "
             f"float32's error in it: {first_ratio:.3g} in the first forward (required > "
             f"{MIN_MARGIN_RATIO}), {ratio:.3g} over the steps' too (required > 1: the same "
             f"selections); tokens x layers x forwards whose top-K the bias changed: {changed}; "
             f"float32's worst parameter after the steps {worst32:.3g} ({worst32_name}; "
             f"required < {MAX_PARAM_ERR32})"]
    ok = (same and first_ratio > MIN_MARGIN_RATIO and ratio > 1 and changed > 0
          and worst32 < MAX_PARAM_ERR32)
    return ok, min(first_ratio / MIN_MARGIN_RATIO, ratio), r64, sd, lines


def main():
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # fixed reduction order -> reproducible float64 results
    torch.use_deterministic_algorithms(True)
    cfg = hf_config()
    names, bufs = checkpoint_names(cfg)
    fixdir = os.path.join(HERE, "fixtures")
    outdir = os.path.join(fixdir, STEM)
    B, T, V = tc.FIXTURE.batch, tc.FIXTURE.seq_len, cfg.vocab_size
    g = torch.Generator().manual_seed(tc.FIXTURE.data_seed)
    seq = torch.randint(0, V, (B, T + 1), generator=g, dtype=torch.long)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    best = None
    for std in ROUTER_STDS:
        ok, ratio, r, sd, lines = attempt(cfg, names, bufs, std, tokens, targets, outdir)
        for line in lines:
            print(line)
        if ok and (best is None or ratio > best[0]):
            best = (ratio, std)
    if best is None:
        raise SystemExit("no router std gives a safe selection margin")
    std = best[1]
    shutil.rmtree(outdir)
    ok, ratio, r, sd, lines = attempt(cfg, names, bufs, std, tokens, targets, outdir)
    assert ok

    # what save_pretrained wrote: exactly the checkpoint names and the weights drawn
    saved, _ = tc.read_safetensors(os.path.join(outdir, "model.safetensors"))
    if set(saved) != set(names) | set(bufs):
        raise SystemExit(f"save_pretrained wrote other names: only its "
                         f"{sorted(set(saved) - set(names) - set(bufs))[:4]}, only ours "
                         f"{sorted(set(names) | set(bufs) - set(saved))[:4]}")
    for n, t in sd.items():
        if not torch.equal(saved[n], t):
            raise SystemExit(f"save_pretrained changed {n}")
    with open(os.path.join(outdir, "config.json")) as f:
        cj = json.load(f)

    routing = r["routing"]
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32)),
               ("loss", f64([r["loss0"]]))]
    tensors += [("grad." + n, r["grads"][n]) for n in names]
    tensors += [("adamw_losses", f64(r["losses"])), ("adamw_lrs", f64(r["lrs"])),
                ("adamw_grad_norms", f64(r["norms"]))]
    for i in moe_layers(cfg):
        tensors.append((f"moe_counts.{i}", routing[0][i]["counts"]))
    for i in moe_layers(cfg):
        tensors.append((f"adamw_moe_counts.{i}",
                        torch.stack([fw[i]["counts"] for fw in routing[1:]])))
    tensors += [("final." + n, r["final"][n]) for n in names]
    tensors += [("final." + n, sd[n].double()) for n in bufs]
    h = tc.FIXTURE
    meta = {
        "model": "transformers DeepseekV3ForCausalLM, config: " + STEM + "/config.json",
        "B": B, "T": T, "torch": torch.__version__, "transformers": transformers.__version__,
        "dtype": "float64 (HF's float32 casts read as float64)",
        "init_seed": h.init_seed, "data_seed": h.data_seed,
        "init": f"matrices normal 0.02; q_b_proj, kv_a_proj_with_mqa, kv_b_proj normal "
                f"{WIDE_STD}; routers normal {std}; RMSNorm weights 1 + normal(0,"
                f"{NORM_PERTURB}); e_score_correction_bias uniform(-{BIAS},{BIAS})",
        "data": "tokens = seq[:, :T], targets = seq[:, 1:], seq random in [0,vocab)",
        "loss": "mean cross-entropy over B*T targets",
        "lr": h.lr, "min_lr": h.min_lr, "warmup": h.warmup, "steps": h.train_steps,
        "weight_decay": h.weight_decay, "beta1": h.beta1, "beta2": h.beta2, "eps": h.eps,
        "grad_clip": h.grad_clip,
        "adamw": "per step: loss (before update), backward, clip_grad_norm_(1.0), AdamW "
                 "step; weight decay only on dim>=2 params; the bias does not move",
        "moe_records": "moe_counts.i [E]: tokens per expert of MoE layer i, first forward; "
                       "adamw_moe_counts.i [steps, E]: each step's forward",
    }
    tc.write_safetensors(os.path.join(fixdir, f"{STEM}_expect.safetensors"), tensors, meta)

    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"router std {std} (margin ratio {ratio:.3g})")
    print(f"config.json: model_type {cj.get('model_type')}, rope_parameters "
          f"{cj.get('rope_parameters')}, num_nextn_predict_layers "
          f"{cj.get('num_nextn_predict_layers', cj.get('num_mtp_layers'))}")
    print(f"loss {r['loss0']:.10f}  ln({V}) = {math.log(V):.10f}")
    print("adamw_losses " + " ".join(f"{x:.10f}" for x in r["losses"]))
    print("adamw_grad_norms " + " ".join(f"{x:.10f}" for x in r["norms"]))
    for i in moe_layers(cfg):
        print(f"counts layer {i} per forward: "
              + " | ".join(" ".join(str(int(c)) for c in fw[i]["counts"]) for fw in routing))
    for f in sorted(os.listdir(outdir)):
        print(f"{os.path.join(outdir, f)}: {os.path.getsize(os.path.join(outdir, f))} bytes")
    p = os.path.join(fixdir, f"{STEM}_expect.safetensors")
    print(f"{p}: {os.path.getsize(p)} bytes")
    # HF as shipped (float64 model, its float32 casts kept): the same loss to float32's
    # accuracy, so the rebinding removed casts and nothing else
    with torch.no_grad():
        shipped = LM(load_hf(outdir, torch.float64), False)(tokens, targets).item()
    d_shipped = abs(shipped - r["loss0"]) / r["loss0"]
    print(f"HF as shipped in float64 (float32 casts): loss {shipped:.12f}, rel {d_shipped:.2e} "
          f"(required < 1e-6)")
    sane = (d_shipped < 1e-6 and abs(r["loss0"] - math.log(V)) < 0.5
            and all(b < a for a, b in zip(r["losses"], r["losses"][1:])))
    print("sanity", "OK" if sane else "FAILED")
    return 0 if sane else 1


if __name__ == "__main__":
    sys.exit(main())
