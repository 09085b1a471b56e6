#!/usr/bin/python3
"""PyTorch reference for Tessera's Llama: Hugging Face's LlamaForCausalLM written out in
plain torch (only torch; runs on Debian's python3-torch 1.13), under HF's parameter names,
loaded from safetensors with load_state_dict(strict=True) (docs/CONTRACT.md "Model",
"The batch rule", "Checkpoints").

The model: tokens -> model.embed_tokens [V, C] (no position embedding) -> n_layer blocks
    h   = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),
          n1 = input_layernorm(x)
    out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),  n2 = post_attention_layernorm(h)
-> model.norm -> lm_head [V, C] (tied to embed_tokens only with --tie) -> mean cross-entropy.
RMSNorm is x * rsqrt(mean(x^2) + eps) * weight; nothing has a bias. Grouped-query
attention: NH query heads, NKV key/value heads, query head h reads key/value head
h // (NH / NKV) (HF's repeat_kv); causal, scaled by 1/sqrt(HS), HS = C / NH. Rotary
embeddings in HF's rotate_half form: inv_freq[i] = theta^(-2i/HS) for i < HS/2 (with Llama
3.1's frequency scaling when --rope-scaling is given: HF's _compute_llama3_parameters),
angle = pos * inv_freq with pos = 0..T-1 in every sequence, cos/sin repeated over both
halves, x' = x cos + rotate_half(x) sin, rotate_half(x) = cat(-x[HS/2:], x[:HS/2]).

Unlike HF, which computes RMSNorm, the eager softmax and the rotary tables in float32 even
in a float64 model, every operation here runs in the model's dtype (the float64 fixture of
tests/make_llama_fixture.py needs it); tests/check_llama_hf.py compares the two.

Subcommands (run with /usr/bin/python3, the interpreter that has torch):

  init OUT.safetensors SHAPE [--seed S] [--norm-perturb STD] [--qk-std STD]
      random weights as Tessera's llama init (every matrix and the embedding normal(0,
      0.02), the RMSNorm weights 1), then every RMSNorm weight + normal(0, STD) (default
      0.1) so that they matter; --qk-std draws q_proj and k_proj wider (at 0.02 the
      attention is nearly uniform and the rotary embedding hardly changes the loss); F32,
      HF names (lm_head.weight left out with --tie).

  loss MODEL.safetensors SHAPE --data FILE [FILE...] --batch B --step S [--step S2 ...]
       [--optimizer OPTIMIZER.safetensors] [--replay INIT.safetensors --replay-steps K
       --lr ... --grad-clip ...]
      load_state_dict(strict=True) of the file (with --tie, an absent lm_head.weight is
      model.embed_tokens.weight, and a present one must equal it) and for every step S
      one line
          step S loss_f32 X loss_f64 Y
      the mean cross-entropy of step S's global batch (the batch rule) in float32 and in
      float64. --optimizer and --replay check optimizer.safetensors as tests/torch_gpt2.py
      does (names and shapes; with --replay, the moments against torch.optim.AdamW's after
      replaying K steps from INIT in float64): the command line, safetensors, the batch
      rule and those checks are tests/torch_common.py's.

SHAPE: --n-layer L --n-head H --n-kv-head KV --n-embd C --ffn-hidden F --vocab V
       --seq-len T [--rope-theta 10000] [--norm-eps 1e-5] [--tie]
       [--rope-scaling FACTOR --rope-low-freq-factor 1 --rope-high-freq-factor 4
        --rope-original-context 8192]

Several commands in one process (torch's import costs seconds, more than these models):
  [--out FILE] COMMAND ARGS... :: [--out FILE] COMMAND ARGS... ...
each command's output into its --out FILE when given (tests/torch_common.py run_commands).

Exits non-zero with a message on any mismatch.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402


# ---- the shape ----------------------------------------------------------------------------
class Shape:
    """A llama's hyperparameters (Tessera's model.* keys)."""

    def __init__(self, n_layer, n_head, n_kv_head, n_embd, ffn_hidden, vocab_size, seq_len,
                 rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False, rope_scaling=0.0,
                 rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                 rope_original_context=8192, head_dim=0):
        # head_dim 0: n_embd // n_head (model.head_dim's default); Qwen3's set another
        hd = head_dim or (n_embd // n_head if n_head else 0)
        if (not head_dim and n_embd % n_head) or n_head % n_kv_head or hd % 2:
            raise SystemExit(f"llama shape: n_embd {n_embd}, n_head {n_head}, n_kv_head "
                             f"{n_kv_head}: need n_head | n_embd, n_kv_head | n_head and an "
                             "even head dimension")
        self.n_layer, self.n_head, self.n_kv_head = n_layer, n_head, n_kv_head
        self.n_embd, self.ffn_hidden = n_embd, ffn_hidden
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.rope_theta, self.norm_eps, self.tie_embeddings = rope_theta, norm_eps, tie_embeddings
        self.rope_scaling = rope_scaling
        self.rope_low_freq_factor = rope_low_freq_factor
        self.rope_high_freq_factor = rope_high_freq_factor
        self.rope_original_context = rope_original_context
        self.head_dim = hd
        self.head_dim_key = head_dim  # 0 = the default, not written to the metadata

    @staticmethod
    def from_args(a):
        return Shape(a.n_layer, a.n_head, a.n_kv_head, a.n_embd, a.ffn_hidden, a.vocab,
                     a.seq_len, a.rope_theta, a.norm_eps, a.tie, a.rope_scaling,
                     a.rope_low_freq_factor, a.rope_high_freq_factor, a.rope_original_context)

    def meta(self):
        """The shape as safetensors metadata (Tessera's key names)."""
        return {"n_layer": self.n_layer, "n_head": self.n_head, "n_kv_head": self.n_kv_head,
                "n_embd": self.n_embd, "ffn_hidden": self.ffn_hidden,
                "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                "rope_theta": self.rope_theta, "norm_eps": self.norm_eps,
                "tie_embeddings": str(self.tie_embeddings).lower(),
                "rope_scaling": self.rope_scaling, "format": "llama (Hugging Face names)",
                **({"head_dim": self.head_dim_key} if self.head_dim_key else {})}


def add_shape_args(ap):
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-kv-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--ffn-hidden", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--tie", action="store_true", help="lm_head tied to embed_tokens")
    ap.add_argument("--rope-scaling", type=float, default=0.0,
                    help="Llama 3.1 frequency scaling factor (0 = none)")
    ap.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    ap.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    ap.add_argument("--rope-original-context", type=int, default=8192)


# ---- rotary embeddings ------------------------------------------------------------------------
def rope_inv_freq(s):
    """inv_freq [HS/2] in float64: theta^(-2i/HS), with Llama 3.1's scaling when
    s.rope_scaling > 0 (HF's _compute_llama3_parameters, written out)."""
    hs = s.head_dim
    inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    if s.rope_scaling > 0:
        factor, low, high = s.rope_scaling, s.rope_low_freq_factor, s.rope_high_freq_factor
        old = s.rope_original_context
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths (low frequencies) divided by the factor, short ones kept, the
        # ones between interpolated smoothly
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_tables(s, T):
    """cos, sin [T, HS] in float64 (each angle twice: both halves, HF's layout)."""
    ang = torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(s)[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, T, HS]; cos, sin [T, HS]."""
    return x * cos + rotate_half(x) * sin


# ---- the model -----------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    # F.scaled_dot_product_attention instead of the written-out softmax (torch 2 only; the
    # benchmark's peer sets it)
    sdpa = False

    def __init__(self, s):
        super().__init__()
        hs = s.head_dim
        self.nh, self.nkv, self.hs = s.n_head, s.n_kv_head, hs
        self.q_proj = nn.Linear(s.n_embd, s.n_head * hs, bias=False)
        self.k_proj = nn.Linear(s.n_embd, s.n_kv_head * hs, bias=False)
        self.v_proj = nn.Linear(s.n_embd, s.n_kv_head * hs, bias=False)
        self.o_proj = nn.Linear(s.n_head * hs, s.n_embd, bias=False)

    def heads(self, x):
        """q [B, NH, T, HS], k and v [B, NKV, T, HS], before the rotary embedding (a
        subclass may normalise them: tests/torch_moe.py's Qwen3 q/k norms)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        return q, k, v

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q, k, v = self.heads(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        if rep > 1:  # repeat_kv: query head h reads key/value head h // rep
            k = k[:, :, None].expand(B, self.nkv, rep, T, self.hs).reshape(B, self.nh, T, self.hs)
            v = v[:, :, None].expand(B, self.nkv, rep, T, self.hs).reshape(B, self.nh, T, self.hs)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
            att = att.masked_fill(~mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hs))


class MLP(nn.Module):
    """SwiGLU of width `width` (default s.ffn_hidden; an MoE's experts have their own)."""

    def __init__(self, s, width=None):
        super().__init__()
        width = s.ffn_hidden if width is None else width
        self.gate_proj = nn.Linear(s.n_embd, width, bias=False)
        self.up_proj = nn.Linear(s.n_embd, width, bias=False)
        self.down_proj = nn.Linear(width, s.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.input_layernorm = RMSNorm(s.n_embd, s.norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.n_embd, s.norm_eps)
        self.mlp = MLP(s)

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.n_embd)
        self.layers = nn.ModuleList([DecoderLayer(s) for _ in range(s.n_layer)])
        self.norm = RMSNorm(s.n_embd, s.norm_eps)


class Llama(nn.Module):
    """LlamaForCausalLM's module tree and names; forward(idx, targets) -> mean loss."""

    def __init__(self, s):
        super().__init__()
        self.shape = s
        self.model = LlamaModel(s)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        if s.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # the rotary tables in float64, not buffers (which .float() would round for
        # good): forward rounds them once to the activations' dtype
        self.rope_cos, self.rope_sin = rope_tables(s, s.seq_len)
        self.register_buffer("mask", torch.tril(torch.ones(s.seq_len, s.seq_len, dtype=torch.bool)),
                             persistent=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.model.embed_tokens(idx)
        cos = self.rope_cos[:T].to(x.device, x.dtype)
        sin = self.rope_sin[:T].to(x.device, x.dtype)
        mask = self.mask[:T, :T]
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.model.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def param_names(s):
    """Every parameter's HF name, in model order (lm_head.weight only when untied)."""
    names = ["model.embed_tokens.weight"]
    for i in range(s.n_layer):
        p = f"model.layers.{i}."
        names += [p + n for n in (
            "input_layernorm.weight",
            "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
    names.append("model.norm.weight")
    if not s.tie_embeddings:
        names.append("lm_head.weight")
    return names


def init_weights(model, names, norm_perturb, std_of=None):
    """Tessera's llama init in the order of `names` (matrices and the embedding
    normal(0, 0.02), norms 1), then every norm weight + normal(0, norm_perturb).
    std_of(name) may give a matrix another standard deviation (the fixture's q and k)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            p = params[n]
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std_of(n) if std_of else 0.02)
        for n in names:
            p = params[n]
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * norm_perturb)


def load_model(s, path):
    """Llama of shape s with the file's weights (strict); returns (model, tensors)."""
    tensors, _ = tc.read_safetensors(path)
    sd = dict(tensors)
    for name, t in sd.items():
        if t.dtype != torch.float32:
            raise SystemExit(f"{path}: {name} is {t.dtype}, expected float32")
    if s.tie_embeddings:
        if "model.embed_tokens.weight" not in sd:
            raise SystemExit(f"{path}: no model.embed_tokens.weight")
        emb = sd["model.embed_tokens.weight"]
        if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], emb):
            raise SystemExit(f"{path}: tied model, but lm_head.weight differs from "
                             "model.embed_tokens.weight")
        sd["lm_head.weight"] = emb  # the tied state_dict holds both names
        tensors = {n: t for n, t in tensors.items() if n != "lm_head.weight"}
    model = Llama(s)
    model.load_state_dict(sd, strict=True)  # every name and shape, nothing extra
    for name, p in model.named_parameters():
        if not torch.equal(p.detach(), sd[name]):
            raise SystemExit(f"{name} differs from the file after loading")
        if not torch.isfinite(p).all():
            raise SystemExit(f"{path}: {name} has non-finite values")
    return model, tensors


# ---- CLI ------------------------------------------------------------------------------------
def main(argv=None):
    ap, p_init = tc.parser(__doc__, add_shape_args, "llama")
    p_init.add_argument("--norm-perturb", type=float, default=0.1)
    p_init.add_argument("--qk-std", type=float, default=0.02,
                        help="q_proj and k_proj's standard deviation (larger: a peaked "
                             "attention, on which the rotary embedding matters)")
    args = ap.parse_args(argv)
    s = Shape.from_args(args)
    names = param_names(s)

    torch.set_num_threads(1)  # fixed reduction order; the models are tiny
    if args.cmd == "init":
        return tc.init_command(
            args, lambda: Llama(s), names,
            lambda m: init_weights(m, names, args.norm_perturb,
                                   lambda n: args.qk_std
                                   if n.endswith(("q_proj.weight", "k_proj.weight")) else 0.02),
            s.meta())
    return tc.loss_command(args, lambda path: load_model(s, path), names, s.seq_len,
                           s.vocab_size)


if __name__ == "__main__":
    sys.exit(tc.run_commands(main, sys.argv[1:]))
