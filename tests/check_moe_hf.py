"""tests/torch_moe.py against Hugging Face transformers' own MoE classes. NOT a CI test: it
needs transformers, which no CI machine has; run it by hand after changing torch_moe.py
(its results are recorded in the commit that last changed it).

Needs a torch 2 python with transformers and safetensors, e.g. the benchmark peer's venv:
  PY=$(scripts/peer_venv.sh); $PY -m pip install transformers safetensors
  $PY tests/check_moe_hf.py

Whole models (the committed fixtures' weights and batches, then random weights of other
shapes): torch_moe's F32 weights are written, under their per-expert HF names, with the
HF config.json into a directory that XForCausalLM.from_pretrained reads (so that HF's own
checkpoint conversion, which fuses the experts into gate_up_proj [E, 2F, C] and down_proj
[E, C, F], interprets the names; no key may be missing, unexpected or mismatched); both
models then run in float64 (router aux loss off: output_router_logits False, its
coefficient 0; experts_implementation "eager") on one batch:
  MixtralForCausalLM    softmax, top-k, renormalised (Mixtral's names)
  Qwen3MoeForCausalLM   norm_topk_prob false and true, q/k RMSNorm, dense and MoE
                        blocks by decoder_sparse_step (Qwen3-MoE's names)
compared: the logits, the mean cross-entropy and every parameter's gradient (HF's fused
expert gradients split back into the per-expert names; an expert HF never ran has no
gradient there, zero here):
  hf     HF as shipped, which computes RMSNorm, the router softmax, the attention softmax
         and the rotary tables in float32 even in a float64 model: ~1e-7 expected, 1e-6
         required of the loss;
  hf64   HF with those float32 casts removed (its modules' torch.float32/torch.float read
         as float64, Mixtral's router .float() dropped, the rotary inv_freq float64): every
         difference within 1e-10 relative (to the largest magnitude of that tensor) required.
Sigmoid routing (DeepseekV3's MLA attention is not Tessera's, so its MoE layer alone):
  DeepseekV3MoE (transformers.models.deepseek_v3) against torch_moe.MoE with DeepSeek's
  names: sigmoid, groups, topk_group, routed_scaling_factor, e_score_correction_bias,
  norm_topk_prob, shared experts; the output and the gradients of the input and every
  parameter for a random upstream gradient, on random weights and on the dsmoe fixture's
  layer 1 with its trained bias; hf64 only (the router's float32 casts removed as above).
  HF scores a group by the sum of its top 2, the design by its top K/topk_groups: the
  cases keep K/topk_groups = 2.
For the fixtures it also checks the stored reference loss. Exits non-zero on any mismatch.
"""
import os
import re
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402
import torch_llama as tl  # noqa: E402
import torch_moe as tm  # noqa: E402

try:
    import transformers
    from transformers import (DeepseekV3Config, MixtralConfig, MixtralForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)
    from transformers.models.deepseek_v3 import modeling_deepseek_v3
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.mixtral import modeling_mixtral
    from transformers.models.qwen3_moe import modeling_qwen3_moe
except ImportError as e:
    raise SystemExit(f"check_moe_hf.py needs transformers ({e}); see its docstring")

TOL64 = 1e-10     # relative, hf64
TOL_HF = 1e-6     # relative loss, HF as shipped


# ---- HF in float64: the float32 casts removed ------------------------------------------------
class _Torch64:
    """The `torch` a modeling module sees in hf64: float32 (and torch.float) are float64."""
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _mixtral_router64(self, hidden_states):
    """MixtralTopKRouter.forward without its .float() (HF 5.25's code otherwise)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.nn.functional.softmax(router_logits, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
    router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


class hf64:
    """Context: the modeling modules compute in their input's dtype."""
    MODULES = (modeling_mixtral, modeling_qwen3_moe, modeling_deepseek_v3)

    def __enter__(self):
        self.saved = [(m, m.torch) for m in self.MODULES]
        for m in self.MODULES:
            m.torch = _Torch64()
        self.router = modeling_mixtral.MixtralTopKRouter.forward
        modeling_mixtral.MixtralTopKRouter.forward = _mixtral_router64
        return self

    def __exit__(self, *exc):
        for m, t in self.saved:
            m.torch = t
        modeling_mixtral.MixtralTopKRouter.forward = self.router


# ---- configs and names -----------------------------------------------------------------------
def hf_config(s):
    common = dict(vocab_size=s.vocab_size, hidden_size=s.n_embd, num_hidden_layers=s.n_layer,
                  num_attention_heads=s.n_head, num_key_value_heads=s.n_kv_head,
                  head_dim=s.head_dim, hidden_act="silu", max_position_embeddings=s.seq_len,
                  rms_norm_eps=s.norm_eps, tie_word_embeddings=s.tie_embeddings,
                  rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
                  attention_dropout=0.0, num_experts_per_tok=s.moe_top_k,
                  output_router_logits=False, router_aux_loss_coef=0.0)
    if s.naming == "mixtral":
        assert s.moe_router == "softmax" and s.moe_norm_topk and not s.qk_norm
        assert s.moe_layers() == list(range(s.n_layer)) and s.moe_route_scale == 1.0
        return MixtralConfig(intermediate_size=s.moe_ffn_hidden,
                             num_local_experts=s.moe_experts, router_jitter_noise=0.0,
                             sliding_window=None, **common)
    assert s.naming == "qwen3_moe" and s.moe_router == "softmax" and s.qk_norm
    assert s.moe_first_dense == 0 and s.moe_route_scale == 1.0
    return Qwen3MoeConfig(intermediate_size=s.ffn_hidden, moe_intermediate_size=s.moe_ffn_hidden,
                          num_experts=s.moe_experts, norm_topk_prob=s.moe_norm_topk,
                          decoder_sparse_step=s.moe_every, mlp_only_layers=[],
                          attention_bias=False, use_sliding_window=False, **common)


def expert_trio(s):
    return ("w1", "w3", "w2") if s.naming == "mixtral" else ("gate_proj", "up_proj", "down_proj")


def our_name(s, hf_name):
    """HF 5's module name -> torch_moe's (Mixtral's MoE module is block_sparse_moe in the
    checkpoint names, mlp inside HF's model)."""
    m = re.match(r"model\.layers\.(\d+)\.mlp\.(.*)", hf_name)
    if s.naming == "mixtral" and m and s.is_moe(int(m.group(1))):
        return f"model.layers.{m.group(1)}.block_sparse_moe.{m.group(2)}"
    return hf_name


def unfuse(s, hf_named, prefix_map=lambda n: n):
    """{torch_moe name: tensor} from HF's tensors (experts fused), e.g. gradients."""
    out = {}
    Fh = s.moe_ffn_hidden
    gate, up, down = expert_trio(s)
    for n, t in hf_named.items():
        if n.endswith("experts.gate_up_proj"):
            base = prefix_map(n[:-len("gate_up_proj")])
            for j in range(s.moe_experts):
                out[f"{base}{j}.{gate}.weight"] = t[j, :Fh]
                out[f"{base}{j}.{up}.weight"] = t[j, Fh:]
        elif n.endswith("experts.down_proj"):
            base = prefix_map(n[:-len("down_proj")])
            for j in range(s.moe_experts):
                out[f"{base}{j}.{down}.weight"] = t[j]
        else:
            out[prefix_map(n)] = t
    return out


def fuse(s, sd, prefix):
    """HF's fused experts of one MoE module (prefix "...mlp.") from torch_moe's names."""
    gate, up, down = expert_trio(s)
    E = s.moe_experts
    return {prefix + "experts.gate_up_proj": torch.stack(
                [torch.cat((sd[f"{prefix}experts.{j}.{gate}.weight"],
                            sd[f"{prefix}experts.{j}.{up}.weight"])) for j in range(E)]),
            prefix + "experts.down_proj": torch.stack(
                [sd[f"{prefix}experts.{j}.{down}.weight"] for j in range(E)])}


# ---- comparisons -----------------------------------------------------------------------------
def rel(a, b):
    """(max |a - b|, that over max |b|)."""
    a, b = a.detach().double(), b.detach().double()
    d = float((a - b).abs().max()) if a.numel() else 0.0
    m = float(b.abs().max()) if b.numel() else 0.0
    return d, d / m if m > 0 else d


def compare_grads(ours, theirs):
    """Worst (relative, absolute, name) over every gradient; theirs None = zero."""
    worst = (0.0, 0.0, "")
    for n, g in ours.items():
        h = theirs.get(n)
        if h is None:
            h = torch.zeros_like(g)
        d, r = rel(g, h)
        if r > worst[0]:
            worst = (r, d, n)
    return worst


def hf_from_dir(s, sd):
    """XForCausalLM.from_pretrained of sd (F32, HF per-expert names) + config.json."""
    cls = MixtralForCausalLM if s.naming == "mixtral" else Qwen3MoeForCausalLM
    with tempfile.TemporaryDirectory() as d:
        hf_config(s).save_pretrained(d)
        tc.write_safetensors(os.path.join(d, "model.safetensors"),
                             [(n, t.float()) for n, t in sd.items()], {"format": "pt"})
        m, info = cls.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                      attn_implementation="eager",
                                      experts_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"from_pretrained of torch_moe's names: {bad}")
    return m


def saved_names(m):
    """The tensor names HF's save_pretrained writes for m."""
    with tempfile.TemporaryDirectory() as d:
        m.save_pretrained(d)
        names = set()
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                names |= set(tc.read_safetensors(os.path.join(d, f))[0])
    return names


def check_model(name, s, sd, tokens, targets, want=None):
    ok = True
    ours = tm.MoeLM(s)
    full = dict(sd)
    if s.tie_embeddings:
        full["lm_head.weight"] = full["model.embed_tokens.weight"]
    ours.load_state_dict(full, strict=True)
    ours = ours.double()
    lo_logits = ours.logits(tokens)
    lo = F.cross_entropy(lo_logits.view(-1, s.vocab_size), targets.reshape(-1))
    lo.backward()
    mine = lo.item()
    our_grads = {n: p.grad for n, p in ours.named_parameters()}

    base = hf_from_dir(s, sd)
    names_saved = saved_names(base)
    with torch.no_grad():
        hf = base.double().eval()
        l_hf = F.cross_entropy(hf(input_ids=tokens).logits.view(-1, s.vocab_size),
                               targets.reshape(-1)).item()
    hf = hf_from_dir(s, sd).double().eval()
    hf.model.rotary_emb.inv_freq = tl.rope_inv_freq(s)
    with hf64():
        h_logits = hf(input_ids=tokens).logits
        lh = F.cross_entropy(h_logits.view(-1, s.vocab_size), targets.reshape(-1))
        lh.backward()
    hf_grads = unfuse(s, {n: p.grad for n, p in hf.named_parameters()},
                      lambda n: our_name(s, n))
    if set(hf_grads) != set(our_grads):
        print(f"  FAIL: parameter names differ: only ours "
              f"{sorted(set(our_grads) - set(hf_grads))[:4]}, only HF's "
              f"{sorted(set(hf_grads) - set(our_grads))[:4]}")
        return False
    d_hf = abs(mine - l_hf) / abs(l_hf)
    d_log, r_log = rel(lo_logits, h_logits)
    d_loss = abs(mine - lh.item())
    r_loss = d_loss / abs(lh.item())
    g_rel, g_abs, g_name = compare_grads(our_grads, hf_grads)
    print(f"{name}: torch_moe {mine:.15f}  hf {l_hf:.15f} (rel {d_hf:.2e})  hf64 "
          f"{lh.item():.15f}: loss |d| {d_loss:.2e} (rel {r_loss:.2e}), logits max |d| "
          f"{d_log:.2e} (rel {r_log:.2e}), worst gradient max |d| {g_abs:.2e} (rel {g_rel:.2e}, "
          f"{g_name})")
    if not d_hf <= TOL_HF:
        print(f"  FAIL: against HF as shipped {d_hf:.3g} > {TOL_HF}")
        ok = False
    if not max(r_loss, r_log, g_rel) <= TOL64:
        print(f"  FAIL: against HF in float64 (> {TOL64})")
        ok = False
    ours_names = set(tm.param_names(s))
    if names_saved != ours_names:
        print(f"  note: HF's save_pretrained writes other names: only HF's "
              f"{sorted(names_saved - ours_names)[:3]}, only ours "
              f"{sorted(ours_names - names_saved)[:3]}")
    else:
        print(f"  HF's save_pretrained writes exactly torch_moe's {len(ours_names)} names")
    if want is not None:
        d = abs(mine - want) / abs(want)
        print(f"  fixture's stored loss {want:.15f} (rel {d:.2e})")
        ok = ok and d <= 1e-12
    return ok


# ---- DeepSeek-V3's MoE layer -----------------------------------------------------------------
def ds_config(s):
    return DeepseekV3Config(hidden_size=s.n_embd, moe_intermediate_size=s.moe_ffn_hidden,
                            n_routed_experts=s.moe_experts, num_experts_per_tok=s.moe_top_k,
                            n_group=s.moe_groups, topk_group=s.moe_topk_groups,
                            routed_scaling_factor=s.moe_route_scale,
                            norm_topk_prob=s.moe_norm_topk,
                            n_shared_experts=s.moe_shared_experts, hidden_act="silu")


def check_ds_layer(name, s, sd, bias, x, dy):
    """sd: one MoE module's tensors under torch_moe's names relative to it (gate.weight,
    experts.j..., shared_experts...); bias [E]; x [B, T, C]; dy the upstream gradient."""
    assert s.moe_router == "sigmoid" and s.moe_top_k // s.moe_topk_groups == 2
    ours = tm.MoE(s, bias=True)
    ours.load_state_dict(dict(sd, **{"gate.e_score_correction_bias": bias}), strict=True)
    ours = ours.double()
    cfg = ds_config(s)
    cfg._experts_implementation = "eager"
    hf = DeepseekV3MoE(cfg)
    hsd = {n: t for n, t in sd.items() if not n.startswith("experts.")}
    hsd.update(fuse(s, sd, ""))
    hsd["gate.e_score_correction_bias"] = bias
    hf.load_state_dict(hsd, strict=True)
    hf = hf.double()
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    y1 = ours(x1)
    (y1 * dy).sum().backward()
    with hf64():
        y2 = hf(x2)
        (y2 * dy).sum().backward()
    d_y, r_y = rel(y1, y2)
    d_x, r_x = rel(x1.grad, x2.grad)
    g_rel, g_abs, g_name = compare_grads(
        {n: p.grad for n, p in ours.named_parameters()},
        unfuse(s, {n: p.grad for n, p in hf.named_parameters()}))
    sel = ours.last_sel
    print(f"{name}: output max |d| {d_y:.2e} (rel {r_y:.2e}), input gradient max |d| {d_x:.2e} "
          f"(rel {r_x:.2e}), worst parameter gradient max |d| {g_abs:.2e} (rel {g_rel:.2e}, "
          f"{g_name}); bias changes {ours.last_bias_changed} of {sel.shape[0]} selections, "
          f"margin {ours.last_margin:.2g}")
    ok = max(r_y, r_x, g_rel) <= TOL64
    if not ok:
        print(f"  FAIL: against DeepseekV3MoE in float64 (> {TOL64})")
    return ok


# ---- the auxiliary losses and the bias update, the design's words as loops (no HF) -------------
def check_aux_formulas(s, sd):
    """The dsmoe fixture's initial forward: torch_moe's z-loss, sequence-wise loss (their
    values and their gradients with respect to the router logits) and bias update against
    MOE_DESIGN's formulas written out token by token."""
    B, T, E, K = 4, s.seq_len, s.moe_experts, s.moe_top_k
    m = tm.MoeLM(s)
    m.load_state_dict(sd, strict=True)
    m = m.double()
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, s.vocab_size, (B, T), generator=g)
    m.logits(tokens)
    ok, worst = True, 0.0
    for i, moe in m.moes().items():
        logits = moe.last_logits.clone().requires_grad_(True)
        z = 0.0
        aux = 0.0
        for b in range(B):
            count = [0] * E
            P = [0.0] * E
            for t in range(T):
                n = b * T + t
                lse = torch.logsumexp(logits[n], dim=0)
                z = z + s.moe_z_loss * lse * lse / (B * T)
                sc = (torch.sigmoid(logits[n]) if s.moe_router == "sigmoid"
                      else F.softmax(logits[n], 0))
                p = sc / sc.sum()
                for j in range(E):
                    P[j] = P[j] + p[j] / T
                for k in range(K):
                    count[int(moe.last_idx[n, k])] += 1
            for j in range(E):
                aux = aux + s.moe_aux_loss * (E / (K * T) * count[j]) * P[j] / B
        gz, ga = torch.autograd.grad(z, logits)[0], torch.autograd.grad(aux, logits)[0]
        # torch_moe's own, from the same logits and selection
        lg = moe.last_logits.clone().requires_grad_(True)
        sc = torch.sigmoid(lg) if s.moe_router == "sigmoid" else F.softmax(lg, -1)
        z2, a2 = tm.aux_losses(s, lg, sc, moe.last_idx, B, T)
        gz2, ga2 = torch.autograd.grad(z2, lg)[0], torch.autograd.grad(a2, lg)[0]
        for a_, b_ in ((z2, z), (a2, aux), (gz2, gz), (ga2, ga)):
            worst = max(worst, rel(a_.reshape(-1), b_.reshape(-1))[1])
        # the bias update: counts over the batch, sign(mean - count)
        cnt = torch.bincount(moe.last_idx.reshape(-1), minlength=E)
        assert torch.equal(cnt, moe.last_counts)
        before = moe.gate.bias().clone()
        tm.update_bias(m)
        mean = B * T * K / E
        want = before + s.moe_bias_rate * torch.tensor(
            [(1.0 if mean > c else -1.0 if mean < c else 0.0) for c in cnt.tolist()],
            dtype=torch.float64)
        ok &= torch.equal(moe.gate.bias(), want)
        moe.gate.bias().copy_(before)  # each layer's update checked alone
    print(f"design formulas (z-loss, sequence-wise loss, their logit gradients, bias update) "
          f"written as loops: worst relative difference {worst:.2e}, bias update "
          f"{'equal' if ok else 'DIFFERENT'}")
    ok &= worst <= TOL64
    if not ok:
        print("  FAIL: torch_moe's auxiliary losses or bias update differ from the design")
    return ok


def random_sd(s, seed, router_std=0.3):
    torch.manual_seed(seed)
    m = tm.MoeLM(s)
    names = tm.param_names(s)
    tm.init_weights(m, names, 0.1, lambda n: 0.2 if n.endswith(("q_proj.weight", "k_proj.weight"))
                    else router_std if n.endswith(".gate.weight") else 0.02)
    p = dict(m.named_parameters())
    return {n: p[n].detach().float().clone() for n in names}


def random_batch(s, seed, B=3):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, s.vocab_size, (B, s.seq_len + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def fixture(stem):
    w, _ = tc.read_safetensors(os.path.join(HERE, "fixtures", f"{stem}_weights.safetensors"))
    e, _ = tc.read_safetensors(os.path.join(HERE, "fixtures", f"{stem}_expect.safetensors"))
    return w, e


def main():
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    import make_moe_fixture as mf
    ok = True
    for stem in ("mixtral_tiny", "qwen3moe_tiny"):
        s = mf.FIXTURES[stem][0]
        w, e = fixture(stem)
        ok &= check_model(f"fixture {stem}", s, w, e["tokens"].long(), e["targets"].long(),
                          want=float(e["loss"][0]))
    base = dict(n_layer=3, n_embd=48, ffn_hidden=80, vocab_size=101, seq_len=24, n_head=6)
    cases = [
        ("Mixtral E8 top-2, NH 6 NKV 2, tied, theta 1e6",
         tm.MoeShape("mixtral", 8, 2, 40, n_kv_head=2, rope_theta=1e6, tie_embeddings=True,
                     **base)),
        ("Mixtral E6 top-3, NH 6 NKV 3", tm.MoeShape("mixtral", 6, 3, 40, n_kv_head=3, **base)),
        ("Qwen3-MoE E8 top-3 norm_topk, every layer MoE",
         tm.MoeShape("qwen3_moe", 8, 3, 40, moe_norm_topk=True, qk_norm=True, n_kv_head=2,
                     **base)),
        ("Qwen3-MoE E8 top-2 no norm_topk, moe_every 2, eps 1e-6",
         tm.MoeShape("qwen3_moe", 8, 2, 40, moe_norm_topk=False, qk_norm=True, moe_every=2,
                     n_kv_head=1, norm_eps=1e-6, **base)),
    ]
    for i, (name, s) in enumerate(cases):
        x, y = random_batch(s, 200 + i)
        ok &= check_model(name, s, random_sd(s, 100 + i), x, y)

    # DeepSeek-V3's MoE layer: the fixture's layer 1 with its trained bias, then random ones
    s = mf.FIXTURES["dsmoe_tiny"][0]
    w, e = fixture("dsmoe_tiny")
    pre = "model.layers.1.mlp."
    sd = {n[len(pre):]: t for n, t in w.items() if n.startswith(pre) and "bias" not in n}
    bias = e["final." + pre + "gate.e_score_correction_bias"].float()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 16, s.n_embd, generator=g, dtype=torch.float64)
    dy = torch.randn(4, 16, s.n_embd, generator=g, dtype=torch.float64)
    ok &= check_ds_layer("DeepseekV3MoE, dsmoe fixture's layer 1 (E16 top-4, 4 groups keep 2, "
                         "scale 2.5, 1 shared, its final bias)", s, sd, bias, x, dy)
    ok &= check_aux_formulas(s, w)
    ds_cases = [
        ("E16 top-4 groups 4/2, scale 2.5, 2 shared", dict(moe_experts=16, moe_top_k=4,
                                                          moe_groups=4, moe_topk_groups=2,
                                                          moe_shared_experts=2)),
        ("E32 top-8 groups 8/4, scale 1.5, 1 shared, no norm_topk",
         dict(moe_experts=32, moe_top_k=8, moe_groups=8, moe_topk_groups=4,
              moe_shared_experts=1, moe_route_scale=1.5, moe_norm_topk=False)),
        ("E8 top-2 no groups (topk 2 of 1 group), 1 shared",
         dict(moe_experts=8, moe_top_k=2, moe_groups=1, moe_topk_groups=1,
              moe_shared_experts=1)),
    ]
    for i, (name, kw) in enumerate(ds_cases):
        kw = dict(dict(moe_route_scale=2.5, moe_norm_topk=True), **kw)
        sh = tm.MoeShape("deepseek", moe_ffn_hidden=24, moe_router="sigmoid", n_layer=1,
                         n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=96,
                         seq_len=16, **kw)
        full = random_sd(sh, 300 + i, router_std=0.6)
        sd = {n[len("model.layers.0.mlp."):]: t for n, t in full.items()
              if n.startswith("model.layers.0.mlp.")}
        gb = torch.Generator().manual_seed(400 + i)
        bias = (torch.rand(sh.moe_experts, generator=gb) - 0.5) * 0.1
        x = torch.randn(3, 16, sh.n_embd, generator=gb, dtype=torch.float64)
        dy = torch.randn(3, 16, sh.n_embd, generator=gb, dtype=torch.float64)
        ok &= check_ds_layer(f"DeepseekV3MoE, {name}", sh, sd, bias, x, dy)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
