#!/usr/bin/python3
"""PyTorch reference for Tessera's Mixture of Experts (issue 39's design): a
Llama-family model whose blocks' MLPs are MoE layers, written out in plain torch (only
torch; runs on Debian's python3-torch 1.13 and on torch 2) under Hugging Face's parameter
names: Mixtral's (MixtralForCausalLM), Qwen3-MoE's (Qwen3MoeForCausalLM), or
"deepseek", Qwen3-MoE's names plus DeepSeek-V3's mlp.shared_experts.* and
mlp.gate.e_score_correction_bias. tests/check_moe_hf.py compares it with transformers'
own classes; tests/make_moe_fixture.py writes the committed fixtures from it.

Everything not MoE is tests/torch_llama.py's (imported: embedding, RMSNorm, grouped-query
attention, rotary embedding, dense SwiGLU, lm_head), plus Qwen3's per-head RMSNorm of q
and k before the rotary embedding (--qk-norm: self_attn.q_norm / k_norm [HS], eps
norm_eps). Block l is an MoE block iff moe_experts > 0, l >= moe_first_dense and
(l + 1) % moe_every == 0; the others keep the dense MLP of ffn_hidden. An MoE block's MLP,
for the N = B*T rows x of its normalised input:
  logits = x @ gate.weight^T [N, E]; scores = softmax(logits) or sigmoid(logits);
  selection: top-K of sel = scores + bias (the aux-loss-free bias, a buffer, no gradient;
    absent = 0), group-limited when moe_groups G > 1 (a group's score is the sum of its
    top K/moe_topk_groups sel values; the moe_topk_groups best groups are kept, the other
    experts masked to -inf). Ties go to the lower index, always: the sort is stable (with
    random float weights an exact tie practically never happens, but the rule is fixed);
  weights w_k = scores[idx_k], / (sum_k w_k + 1e-20) when moe_norm_topk, * moe_route_scale;
  dispatch: the N*K assignments sorted by expert (stable: by token, then k), each expert a
    SwiGLU of width moe_ffn_hidden over its rows (run even on none, so that every expert
    has a gradient, zero when unused, as Tessera steps every parameter);
  out[n] = sum_k w_k y_k (+ the shared experts: a dense SwiGLU of width
    moe_shared_experts * moe_ffn_hidden, always applied).
Auxiliary losses (coefficients moe_z_loss cz, moe_aux_loss a; B sequences of T tokens, the
whole global batch in one forward here), per MoE layer, summed over the layers:
  z-loss   cz * sum_n logsumexp(logits_n)^2 / (B*T)
  sequence-wise balance loss (DeepSeek-V3): per sequence p = scores / sum(scores) (softmax:
    scores), f_i = E / (K*T) * (its tokens whose top-K holds i), P_i = mean_n p_{n,i},
    L_s = a * sum_i f_i P_i; the loss sum_s L_s / B.
The model's forward returns the mean cross-entropy (the reported "loss", comparable with
dense runs and with HF) whose gradient is that of cross-entropy + the auxiliary losses:
ce + (aux - aux.detach()), which has exactly ce's value. The forward keeps, for the
caller: moe_aux_loss, moe_z_loss (floats, summed over layers) and, per MoE layer,
last_counts [E] (tokens routed to each expert over the batch), last_idx, last_sel and
last_logits (the selection, the values it was made from, the router logits),
last_margin (the smallest gap in sel at a selection boundary: how far the fixture is
from a near-tie that float32 could flip) and last_bias_changed (tokens whose top-K
differs from the bias-free one).
update_bias(model) is the aux-loss-free balancing step that follows every optimizer step
when moe_bias_rate r > 0: bias += r * sign(N*K/E - counts) per MoE layer (sign(0) = 0).

Subcommands (as tests/torch_llama.py's; run with a python that has torch):
  init OUT.safetensors SHAPE [--seed S] [--norm-perturb STD] [--qk-std STD]
       [--router-std STD]
      random weights (matrices normal(0, 0.02), norms 1 then + normal(0, STD); q/k and the
      routers at their own std), F32, HF names; the bias (zeros) written when r > 0.
  loss MODEL.safetensors SHAPE --data FILE... --batch B --step S ... [--optimizer ...
       --replay INIT --replay-steps K ...]
      the cross-entropy of each step's global batch in float32 and float64 (replay: AdamW
      with the auxiliary losses and the bias update).
SHAPE: torch_llama's (--n-layer ... --seq-len) and --naming mixtral|qwen3_moe|deepseek
       --moe-experts E --moe-top-k K --moe-ffn-hidden F [--moe-shared-experts S]
       [--moe-router softmax|sigmoid] [--moe-norm-topk|--no-moe-norm-topk]
       [--moe-route-scale X] [--moe-groups G] [--moe-topk-groups TG]
       [--moe-first-dense D] [--moe-every M] [--qk-norm] [--moe-aux-loss A]
       [--moe-z-loss Z] [--moe-bias-rate R]
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
import torch_llama as tl  # noqa: E402

NAMINGS = ("mixtral", "qwen3_moe", "deepseek")
FORMATS = {"mixtral": "mixtral (Hugging Face MixtralForCausalLM names)",
           "qwen3_moe": "qwen3_moe (Hugging Face Qwen3MoeForCausalLM names)",
           "deepseek": "deepseek-style (Qwen3-MoE names + mlp.shared_experts.*, "
                       "mlp.gate.e_score_correction_bias)"}


# ---- the shape ------------------------------------------------------------------------------
class MoeShape(tl.Shape):
    """A llama's shape plus the MoE keys (Tessera's model.moe_* and train.moe_* names)."""

    def __init__(self, naming, moe_experts, moe_top_k, moe_ffn_hidden, moe_shared_experts=0,
                 moe_router="softmax", moe_norm_topk=True, moe_route_scale=1.0, moe_groups=1,
                 moe_topk_groups=1, moe_first_dense=0, moe_every=1, qk_norm=False,
                 moe_aux_loss=0.0, moe_z_loss=0.0, moe_bias_rate=0.0, **llama):
        super().__init__(**llama)
        E, K, G, TG = moe_experts, moe_top_k, moe_groups, moe_topk_groups
        errors = []
        if naming not in NAMINGS:
            errors.append(f"naming {naming!r} is not one of {NAMINGS}")
        if moe_router not in ("softmax", "sigmoid"):
            errors.append(f"moe_router {moe_router!r} is not softmax or sigmoid")
        if E < 1:
            errors.append(f"moe_experts {E} < 1 (a dense model is torch_llama's)")
        if not 1 <= K <= E:
            errors.append(f"moe_top_k {K} not in [1, moe_experts {E}]")
        if moe_ffn_hidden < 1:
            errors.append(f"moe_ffn_hidden {moe_ffn_hidden} < 1")
        if G < 1 or E % G:
            errors.append(f"moe_groups {G} does not divide moe_experts {E}")
        elif not 1 <= TG <= G or K % TG or K // TG > E // G:
            errors.append(f"moe_topk_groups {TG}: need 1 <= it <= moe_groups {G}, dividing "
                          f"moe_top_k {K}, and K/TG <= the {E // max(G, 1)} experts of a group")
        if moe_shared_experts < 0 or (moe_shared_experts and naming == "mixtral"):
            errors.append(f"moe_shared_experts {moe_shared_experts}: >= 0, and Mixtral's "
                          "names have none")
        if moe_first_dense < 0 or moe_every < 1:
            errors.append(f"moe_first_dense {moe_first_dense} >= 0, moe_every {moe_every} >= 1")
        if min(moe_aux_loss, moe_z_loss, moe_bias_rate) < 0:
            errors.append("moe_aux_loss, moe_z_loss, moe_bias_rate must be >= 0")
        if errors:
            raise SystemExit("moe shape: " + "; ".join(errors))
        self.naming = naming
        self.moe_experts, self.moe_top_k, self.moe_ffn_hidden = E, K, moe_ffn_hidden
        self.moe_shared_experts, self.moe_router = moe_shared_experts, moe_router
        self.moe_norm_topk, self.moe_route_scale = moe_norm_topk, moe_route_scale
        self.moe_groups, self.moe_topk_groups = G, TG
        self.moe_first_dense, self.moe_every, self.qk_norm = moe_first_dense, moe_every, qk_norm
        self.moe_aux_loss, self.moe_z_loss = moe_aux_loss, moe_z_loss
        self.moe_bias_rate = moe_bias_rate

    def is_moe(self, layer):
        return layer >= self.moe_first_dense and (layer + 1) % self.moe_every == 0

    def moe_layers(self):
        return [i for i in range(self.n_layer) if self.is_moe(i)]

    @property
    def has_bias(self):
        """The aux-loss-free bias exists (is trained) when moe_bias_rate > 0."""
        return self.moe_bias_rate > 0

    def mlp_prefix(self):
        return "block_sparse_moe." if self.naming == "mixtral" else "mlp."

    @staticmethod
    def from_args(a):
        return MoeShape(
            a.naming, a.moe_experts, a.moe_top_k, a.moe_ffn_hidden, a.moe_shared_experts,
            a.moe_router, a.moe_norm_topk, a.moe_route_scale, a.moe_groups,
            a.moe_topk_groups, a.moe_first_dense, a.moe_every, a.qk_norm, a.moe_aux_loss,
            a.moe_z_loss, a.moe_bias_rate, **tl_shape_kwargs(a))

    def meta(self):
        """The shape as safetensors metadata: tests/torch_llama.py's keys plus every MoE key
        by its Tessera name (bools "true"/"false"), the MoE layers and the naming."""
        m = super().meta()
        b = lambda v: str(bool(v)).lower()  # noqa: E731
        m.update({
            "moe_experts": self.moe_experts, "moe_top_k": self.moe_top_k,
            "moe_ffn_hidden": self.moe_ffn_hidden,
            "moe_shared_experts": self.moe_shared_experts, "moe_router": self.moe_router,
            "moe_norm_topk": b(self.moe_norm_topk), "moe_route_scale": self.moe_route_scale,
            "moe_groups": self.moe_groups, "moe_topk_groups": self.moe_topk_groups,
            "moe_first_dense": self.moe_first_dense, "moe_every": self.moe_every,
            "qk_norm": b(self.qk_norm), "moe_aux_loss": self.moe_aux_loss,
            "moe_z_loss": self.moe_z_loss, "moe_bias_rate": self.moe_bias_rate,
            "moe_layers": ",".join(str(i) for i in self.moe_layers()),
            "hf_naming": self.naming, "format": FORMATS[self.naming]})
        return m


def tl_shape_kwargs(a):
    return dict(n_layer=a.n_layer, n_head=a.n_head, n_kv_head=a.n_kv_head, n_embd=a.n_embd,
                ffn_hidden=a.ffn_hidden, vocab_size=a.vocab, seq_len=a.seq_len,
                rope_theta=a.rope_theta, norm_eps=a.norm_eps, tie_embeddings=a.tie,
                rope_scaling=a.rope_scaling, rope_low_freq_factor=a.rope_low_freq_factor,
                rope_high_freq_factor=a.rope_high_freq_factor,
                rope_original_context=a.rope_original_context)


def add_shape_args(ap):
    tl.add_shape_args(ap)
    ap.add_argument("--naming", choices=NAMINGS, required=True)
    ap.add_argument("--moe-experts", type=int, required=True)
    ap.add_argument("--moe-top-k", type=int, required=True)
    ap.add_argument("--moe-ffn-hidden", type=int, required=True)
    ap.add_argument("--moe-shared-experts", type=int, default=0)
    ap.add_argument("--moe-router", choices=("softmax", "sigmoid"), default="softmax")
    ap.add_argument("--moe-norm-topk", action="store_true", default=True)
    ap.add_argument("--no-moe-norm-topk", dest="moe_norm_topk", action="store_false")
    ap.add_argument("--moe-route-scale", type=float, default=1.0)
    ap.add_argument("--moe-groups", type=int, default=1)
    ap.add_argument("--moe-topk-groups", type=int, default=1)
    ap.add_argument("--moe-first-dense", type=int, default=0)
    ap.add_argument("--moe-every", type=int, default=1)
    ap.add_argument("--qk-norm", action="store_true")
    ap.add_argument("--moe-aux-loss", type=float, default=0.0)
    ap.add_argument("--moe-z-loss", type=float, default=0.0)
    ap.add_argument("--moe-bias-rate", type=float, default=0.0)


# ---- routing --------------------------------------------------------------------------------
def _sorted_desc(x):
    """Indices of x's last dimension in descending order, equal values by lower index
    (a stable sort: torch.topk promises no order among ties)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def select(sel, K, G=1, TG=1):
    """topk_idx [N, K] of sel [N, E] (descending, ties by lower index), group-limited when
    G > 1: a group's score is the sum of its top K/TG values, the TG best groups kept (ties:
    lower group), the others' experts masked to -inf. Also returns the margin: the smallest
    gap between a selected and an unselected value (of sel, and of the group scores), the
    distance from a near-tie that a float32 rounding could flip."""
    N, E = sel.shape
    margin = float("inf")
    if G > 1:
        grouped = sel.reshape(N, G, E // G)
        gscore = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :K // TG]
        gscore = gscore.sum(-1)
        gorder = _sorted_desc(gscore)
        if TG < G:
            gs = gscore.gather(1, gorder)
            margin = min(margin, float((gs[:, TG - 1] - gs[:, TG]).min()))
        keep = torch.zeros(N, G, dtype=torch.bool).scatter_(1, gorder[:, :TG], True)
        sel = sel.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    order = _sorted_desc(sel)
    if K < E:
        v = sel.gather(1, order[:, K - 1:K + 1])
        gap = v[:, 0] - v[:, 1]  # inf where the next one is masked
        margin = min(margin, float(gap.min()))
    return order[:, :K], margin


def route(s, logits, bias=None):
    """(scores [N, E], topk_idx [N, K], topk_w [N, K], margin, bias_changed) for router
    logits [N, E]: design steps 2-4. The selection has no gradient; the weights have,
    through the scores."""
    scores = F.softmax(logits, dim=-1) if s.moe_router == "softmax" else torch.sigmoid(logits)
    K, G, TG = s.moe_top_k, s.moe_groups, s.moe_topk_groups
    with torch.no_grad():
        plain = scores.detach()
        idx, margin = select(plain if bias is None else plain + bias, K, G, TG)
        changed = 0
        if bias is not None:
            idx0, _ = select(plain, K, G, TG)
            changed = int((idx.sort(dim=-1).values != idx0.sort(dim=-1).values)
                          .any(dim=-1).sum())
    w = scores.gather(1, idx)
    if s.moe_norm_topk:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    w = w * s.moe_route_scale
    return scores, idx, w, margin, changed


def aux_losses(s, logits, scores, idx, B, T):
    """(z-loss, sequence-wise balance loss) of one MoE layer for B sequences of T tokens,
    each with its coefficient and normalised by the batch (None where the coefficient is
    0). The counts f carry no gradient."""
    E, K = s.moe_experts, s.moe_top_k
    z = aux = None
    if s.moe_z_loss > 0:
        z = s.moe_z_loss * (torch.logsumexp(logits, dim=-1) ** 2).sum() / (B * T)
    if s.moe_aux_loss > 0:
        p = scores if s.moe_router == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
        hits = torch.zeros(B * T, E, dtype=scores.dtype).scatter_(1, idx, 1.0)
        f = hits.view(B, T, E).sum(dim=1) * (E / (K * T))  # [B, E]
        P = p.view(B, T, E).mean(dim=1)                     # [B, E]
        aux = s.moe_aux_loss * (f * P).sum() / B
    return z, aux


# ---- the model ------------------------------------------------------------------------------
class QKNormAttention(tl.Attention):
    """Qwen3's attention: RMSNorm over each head's q and k (weights [HS]) before RoPE."""

    def __init__(self, s):
        super().__init__(s)
        self.q_norm = tl.RMSNorm(s.head_dim, s.norm_eps)
        self.k_norm = tl.RMSNorm(s.head_dim, s.norm_eps)

    def heads(self, x):
        q, k, v = super().heads(x)
        return self.q_norm(q), self.k_norm(k), v


class MixtralExpert(nn.Module):
    """Mixtral's expert names: w1 gate [F, C], w3 up [F, C], w2 down [C, F]."""

    def __init__(self, s):
        super().__init__()
        self.w1 = nn.Linear(s.n_embd, s.moe_ffn_hidden, bias=False)
        self.w2 = nn.Linear(s.moe_ffn_hidden, s.n_embd, bias=False)
        self.w3 = nn.Linear(s.n_embd, s.moe_ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """gate.weight [E, C]; the aux-loss-free bias e_score_correction_bias [E] (a buffer:
    no gradient, not the optimizer's) when moe_bias_rate > 0 or asked for."""

    def __init__(self, s, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(s.moe_experts, s.n_embd))
        if bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(s.moe_experts))

    def bias(self):
        return getattr(self, "e_score_correction_bias", None)


class MoE(nn.Module):
    """An MoE block's MLP: gate, experts.{j}, shared_experts (HF's module names)."""

    def __init__(self, s, bias=None):
        super().__init__()
        self.s = s
        self.gate = Router(s, s.has_bias if bias is None else bias)
        expert = MixtralExpert if s.naming == "mixtral" else (lambda s: tl.MLP(s, s.moe_ffn_hidden))
        self.experts = nn.ModuleList([expert(s) for _ in range(s.moe_experts)])
        if s.moe_shared_experts:
            self.shared_experts = tl.MLP(s, s.moe_shared_experts * s.moe_ffn_hidden)

    def forward(self, x):
        s = self.s
        B, T, C = x.shape
        E, K = s.moe_experts, s.moe_top_k
        xf = x.reshape(B * T, C)
        logits = F.linear(xf, self.gate.weight)
        scores, idx, w, margin, changed = route(s, logits, self.gate.bias())
        # dispatch: the assignments a = n*K + k sorted by expert, stable (by n, then k)
        flat = idx.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        counts = torch.bincount(flat, minlength=E)
        xp = xf[order // K]
        ys, off = [], 0
        for e in range(E):  # every expert, also one without rows (a zero gradient)
            c = int(counts[e])
            ys.append(self.experts[e](xp[off:off + c]))
            off += c
        yp = torch.cat(ys)
        row_of = torch.empty_like(order)
        row_of[order] = torch.arange(B * T * K)
        y = yp[row_of].view(B * T, K, C)
        out = (w.unsqueeze(-1) * y).sum(dim=1)
        if s.moe_shared_experts:
            out = out + self.shared_experts(xf)
        self.last_z, self.last_aux = aux_losses(s, logits, scores, idx, B, T)
        self.last_counts, self.last_margin, self.last_bias_changed = counts, margin, changed
        self.last_idx, self.last_logits = idx, logits.detach()
        b = self.gate.bias()
        self.last_sel = scores.detach() if b is None else scores.detach() + b
        return out.view(B, T, C)


class DecoderLayer(nn.Module):
    def __init__(self, s, layer):
        super().__init__()
        self.input_layernorm = tl.RMSNorm(s.n_embd, s.norm_eps)
        self.self_attn = QKNormAttention(s) if s.qk_norm else tl.Attention(s)
        self.post_attention_layernorm = tl.RMSNorm(s.n_embd, s.norm_eps)
        self.is_moe = s.is_moe(layer)
        if self.is_moe and s.naming == "mixtral":
            self.block_sparse_moe = MoE(s)
        else:
            self.mlp = MoE(s) if self.is_moe else tl.MLP(s)

    def moe(self):
        return (self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp) \
            if self.is_moe else None

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        mlp = self.moe() if self.is_moe else self.mlp
        return h + mlp(self.post_attention_layernorm(h))


class MoeModel(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.n_embd)
        self.layers = nn.ModuleList([DecoderLayer(s, i) for i in range(s.n_layer)])
        self.norm = tl.RMSNorm(s.n_embd, s.norm_eps)


class MoeLM(nn.Module):
    """XForCausalLM's module tree and names; forward(idx, targets) -> the mean
    cross-entropy, carrying the auxiliary losses' gradient (see the module's docstring)."""

    def __init__(self, s):
        super().__init__()
        self.shape = s
        self.model = MoeModel(s)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        if s.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_cos, self.rope_sin = tl.rope_tables(s, s.seq_len)  # float64, as torch_llama
        self.register_buffer("mask", torch.tril(torch.ones(s.seq_len, s.seq_len, dtype=torch.bool)),
                             persistent=False)
        self.moe_aux_loss = self.moe_z_loss = 0.0

    def moes(self):
        """{layer index: its MoE module}."""
        return {i: l.moe() for i, l in enumerate(self.model.layers) if l.is_moe}

    def logits(self, idx):
        """[B, T, V]; each MoE layer keeps its last_* records and auxiliary losses."""
        T = idx.size(1)
        x = self.model.embed_tokens(idx)
        cos = self.rope_cos[:T].to(x.device, x.dtype)
        sin = self.rope_sin[:T].to(x.device, x.dtype)
        mask = self.mask[:T, :T]
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))

    def forward(self, idx, targets):
        logits = self.logits(idx)
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        extra, z_sum, aux_sum = [], 0.0, 0.0
        for moe in self.moes().values():
            if moe.last_z is not None:
                extra.append(moe.last_z)
                z_sum += moe.last_z.item()
            if moe.last_aux is not None:
                extra.append(moe.last_aux)
                aux_sum += moe.last_aux.item()
        self.moe_z_loss, self.moe_aux_loss = z_sum, aux_sum
        if not extra:
            return ce
        total = extra[0]
        for t in extra[1:]:
            total = total + t
        # the value is ce's exactly (v - v == 0); the gradient is of ce + the aux losses
        return ce + (total - total.detach())


def update_bias(model):
    """The aux-loss-free balancing step (after an optimizer step): per MoE layer with a
    bias, bias += rate * sign(N*K/E - counts), counts of the last forward (the batch)."""
    s = model.shape
    with torch.no_grad():
        for moe in model.moes().values():
            b = moe.gate.bias()
            if b is None:
                continue
            counts = moe.last_counts.to(b.dtype)
            mean = float(counts.sum()) / s.moe_experts  # N*K/E
            b.add_(s.moe_bias_rate * torch.sign(mean - counts))


def param_names(s):
    """Every parameter's HF name, in model order (lm_head.weight only when untied)."""
    names = ["model.embed_tokens.weight"]
    for i in range(s.n_layer):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"]
        names += [p + "self_attn." + n + ".weight"
                  for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        if s.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "post_attention_layernorm.weight"]
        if not s.is_moe(i):
            names += [p + "mlp." + n + ".weight" for n in ("gate_proj", "up_proj", "down_proj")]
            continue
        m = p + s.mlp_prefix()
        names += [m + "gate.weight"]
        trio = (("w1", "w3", "w2") if s.naming == "mixtral"
                else ("gate_proj", "up_proj", "down_proj"))
        for j in range(s.moe_experts):
            names += [f"{m}experts.{j}.{n}.weight" for n in trio]
        if s.moe_shared_experts:
            names += [m + "shared_experts." + n + ".weight"
                      for n in ("gate_proj", "up_proj", "down_proj")]
    names.append("model.norm.weight")
    if not s.tie_embeddings:
        names.append("lm_head.weight")
    return names


def buffer_names(s):
    """The state that is no parameter: each MoE layer's bias when it has one."""
    if not s.has_bias:
        return []
    return [f"model.layers.{i}.{s.mlp_prefix()}gate.e_score_correction_bias"
            for i in s.moe_layers()]


def init_weights(model, names, norm_perturb, std_of=None):
    """torch_llama's init (matrices normal(0, 0.02) or std_of(name), norms 1, then every
    norm + normal(0, norm_perturb)); the expert tensors are matrices like any other."""
    tl.init_weights(model, names, norm_perturb, std_of)


def load_model(s, path):
    """MoeLM of shape s with the file's weights and buffers (strict); (model, tensors)."""
    tensors, _ = tc.read_safetensors(path)
    sd = dict(tensors)
    for name, t in sd.items():
        if t.dtype != torch.float32:
            raise SystemExit(f"{path}: {name} is {t.dtype}, expected float32")
    if s.tie_embeddings:
        emb = sd.get("model.embed_tokens.weight")
        if emb is None:
            raise SystemExit(f"{path}: no model.embed_tokens.weight")
        if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], emb):
            raise SystemExit(f"{path}: tied model, but lm_head.weight differs")
        sd["lm_head.weight"] = emb
    model = MoeLM(s)
    model.load_state_dict(sd, strict=True)  # every name and shape, nothing extra
    state = dict(model.state_dict())
    for name in sd:
        if not torch.isfinite(state[name]).all():
            raise SystemExit(f"{path}: {name} has non-finite values")
    bufs = set(buffer_names(s))
    return model, {n: t for n, t in tensors.items()
                   if n not in bufs and not (s.tie_embeddings and n == "lm_head.weight")}


# ---- CLI --------------------------------------------------------------------------------------
def main(argv=None):
    ap, p_init = tc.parser(__doc__, add_shape_args, "MoE")
    p_init.add_argument("--norm-perturb", type=float, default=0.1)
    p_init.add_argument("--qk-std", type=float, default=0.02)
    p_init.add_argument("--router-std", type=float, default=0.02)
    args = ap.parse_args(argv)
    s = MoeShape.from_args(args)
    names = param_names(s)

    torch.set_num_threads(1)  # fixed reduction order; the models are tiny
    if args.cmd == "init":
        def std_of(n):
            if n.endswith(("q_proj.weight", "k_proj.weight")):
                return args.qk_std
            return args.router_std if n.endswith(".gate.weight") else 0.02
        model = tc.init_weights_seeded(args.seed, lambda: MoeLM(s),
                                       lambda m: init_weights(m, names, args.norm_perturb, std_of))
        tc.write_weights(args.out, model, names, s.meta(), buffer_names(s))
        print(f"wrote {args.out}: {len(names)} parameters, {len(buffer_names(s))} buffers")
        return 0
    return tc.loss_command(args, lambda path: load_model(s, path), names, s.seq_len,
                           s.vocab_size, after_step=lambda m, _: update_bias(m))


if __name__ == "__main__":
    sys.exit(tc.run_commands(main, sys.argv[1:]))
