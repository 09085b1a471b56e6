"""tests/torch_llama.py against Hugging Face transformers' LlamaForCausalLM. NOT a CI test:
it needs transformers, which no CI machine has; run it by hand after changing
torch_llama.py (its results are recorded in the commit that last changed it).

Needs a torch 2 python with transformers and safetensors, e.g. the benchmark peer's venv:
  PY=$(scripts/peer_venv.sh); $PY -m pip install transformers safetensors
  $PY tests/check_llama_hf.py

For each case (the committed fixture's weights and batch, then random weights of other
shapes: multi-head, multi-query, tied embeddings, Llama 3.1 rope scaling, an odd vocab)
the same F32 weights are loaded, strict, into torch_llama.Llama and into
LlamaForCausalLM (LlamaConfig: attention_bias False, mlp_bias False, hidden_act silu,
head_dim C/NH), both in float64, and the mean cross-entropy of one batch compared:
  hf        HF as shipped (eager attention), which computes RMSNorm, the softmax and the
            rotary tables in float32 even in a float64 model: agreement to ~1e-7 expected,
            1e-6 required;
  hf64      HF with those three float32 casts removed (RMSNorm in the input dtype, the
            rotary tables from a float64 inv_freq, sdpa attention): agreement to ~1e-14
            expected, 1e-12 required, and every gradient to relative L2 1e-10.
For the fixture it also checks the stored reference loss (tests/make_llama_fixture.py).
Exits non-zero on any mismatch.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_common import read_safetensors  # noqa: E402
import torch_llama as tl  # noqa: E402

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama
except ImportError as e:
    raise SystemExit(f"check_llama_hf.py needs transformers ({e}); see its docstring")


def hf_config(s):
    rope = {"rope_type": "default", "rope_theta": s.rope_theta}
    if s.rope_scaling > 0:
        rope = {"rope_type": "llama3", "rope_theta": s.rope_theta, "factor": s.rope_scaling,
                "low_freq_factor": s.rope_low_freq_factor,
                "high_freq_factor": s.rope_high_freq_factor,
                "original_max_position_embeddings": s.rope_original_context}
    return LlamaConfig(vocab_size=s.vocab_size, hidden_size=s.n_embd,
                       intermediate_size=s.ffn_hidden, num_hidden_layers=s.n_layer,
                       num_attention_heads=s.n_head, num_key_value_heads=s.n_kv_head,
                       head_dim=s.head_dim, hidden_act="silu",
                       max_position_embeddings=s.seq_len, rms_norm_eps=s.norm_eps,
                       rope_parameters=rope, tie_word_embeddings=s.tie_embeddings,
                       attention_bias=False, mlp_bias=False, attention_dropout=0.0)


def rmsnorm64(self, x):
    """LlamaRMSNorm.forward without its float32 cast."""
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def rotary64(self, x, position_ids):
    """LlamaRotaryEmbedding.forward in the input dtype (inv_freq set to float64)."""
    freqs = position_ids[..., None].to(self.inv_freq.dtype) * self.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * self.attention_scaling).to(x.dtype),
            (emb.sin() * self.attention_scaling).to(x.dtype))


def hf_model(s, sd, exact):
    cfg = hf_config(s)
    cfg._attn_implementation = "sdpa" if exact else "eager"
    m = LlamaForCausalLM(cfg)
    full = dict(sd)
    if s.tie_embeddings:
        full.setdefault("lm_head.weight", full["model.embed_tokens.weight"])
    m.load_state_dict(full, strict=True)
    m = m.double().eval()
    inv_hf = m.model.rotary_emb.inv_freq.clone()
    inv64 = tl.rope_inv_freq(s)
    err = float(((inv_hf - inv64).abs() / inv64).max())
    if err > 1e-6:
        raise SystemExit(f"HF inv_freq differs from torch_llama's by relative {err:.3g}")
    if exact:
        m.model.rotary_emb.inv_freq = inv64
    return m, err


def hf_loss(m, tokens, targets):
    logits = m(input_ids=tokens).logits
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def check(name, s, sd, tokens, targets, want=None):
    ok = True
    ours = tl.Llama(s)
    ours.load_state_dict(dict(sd, **({"lm_head.weight": sd["model.embed_tokens.weight"]}
                                     if s.tie_embeddings else {})), strict=True)
    ours = ours.double()
    lo = ours(tokens, targets)
    lo.backward()
    mine = lo.item()

    with torch.no_grad():
        hf, inv_err = hf_model(s, sd, exact=False)
        l_hf = hf_loss(hf, tokens, targets).item()
    orig_norm, orig_rot = modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaRotaryEmbedding.forward
    modeling_llama.LlamaRMSNorm.forward = rmsnorm64
    modeling_llama.LlamaRotaryEmbedding.forward = rotary64
    try:
        hf64, _ = hf_model(s, sd, exact=True)
        lh = hf_loss(hf64, tokens, targets)
        lh.backward()
        l_hf64 = lh.item()
    finally:
        modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaRotaryEmbedding.forward = \
            orig_norm, orig_rot
    pg = dict(hf64.named_parameters())
    worst, worst_name = 0.0, ""
    for n, p in ours.named_parameters():
        g, h = p.grad, pg[n].grad
        e = float((g - h).norm() / h.norm().clamp_min(1e-300))
        if e > worst:
            worst, worst_name = e, n
    d_hf, d_hf64 = abs(mine - l_hf) / abs(l_hf), abs(mine - l_hf64) / abs(l_hf64)
    print(f"{name}: torch_llama {mine:.15f}  hf {l_hf:.15f} (rel {d_hf:.2e})  "
          f"hf64 {l_hf64:.15f} (rel {d_hf64:.2e})  worst grad rel L2 {worst:.2e} "
          f"({worst_name})  HF f32 inv_freq rel {inv_err:.1e}")
    if not d_hf <= 1e-6:
        print(f"  FAIL: against HF as shipped {d_hf:.3g} > 1e-6")
        ok = False
    if not d_hf64 <= 1e-12 or not worst <= 1e-10:
        print(f"  FAIL: against HF in float64: loss {d_hf64:.3g} (1e-12), gradient {worst:.3g} "
              "(1e-10)")
        ok = False
    if want is not None:
        d = abs(mine - want) / abs(want)
        print(f"  fixture's stored loss {want:.15f} (rel {d:.2e})")
        ok = ok and d <= 1e-12
    return ok


def random_case(s, seed, B=3):
    torch.manual_seed(seed)
    m = tl.Llama(s)
    names = tl.param_names(s)
    tl.init_weights(m, names, 0.1, lambda n: 0.2 if n.endswith(("q_proj.weight", "k_proj.weight"))
                    else 0.02)
    p = dict(m.named_parameters())
    sd = {n: p[n].detach().float().clone() for n in names}
    g = torch.Generator().manual_seed(seed + 1)
    seq = torch.randint(0, s.vocab_size, (B, s.seq_len + 1), generator=g)
    return sd, seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    ok = True
    fx = os.path.join(HERE, "fixtures")
    w, _ = read_safetensors(os.path.join(fx, "llama_tiny_weights.safetensors"))
    e, _ = read_safetensors(os.path.join(fx, "llama_tiny_expect.safetensors"))
    import make_llama_fixture as mf
    ok &= check("fixture (L2 C32 NH4 NKV2 F48 V96 T16)", mf.SHAPE, w, e["tokens"].long(),
                e["targets"].long(), want=float(e["loss"][0]))
    base = dict(n_layer=2, n_embd=48, ffn_hidden=80, vocab_size=101, seq_len=24)
    cases = [
        ("multi-head (NKV = NH = 6)", tl.Shape(n_head=6, n_kv_head=6, **base)),
        ("multi-query (NKV 1, NH 6)", tl.Shape(n_head=6, n_kv_head=1, **base)),
        ("GQA NH 6 NKV 3, tied, theta 500000",
         tl.Shape(n_head=6, n_kv_head=3, rope_theta=500000.0, tie_embeddings=True, **base)),
        ("GQA NH 4 NKV 2, Llama 3.1 scaling (8, 1, 4, context 64), eps 1e-6",
         tl.Shape(n_head=4, n_kv_head=2, rope_scaling=8.0, rope_original_context=64,
                  norm_eps=1e-6, **base)),
    ]
    for i, (name, s) in enumerate(cases):
        sd, x, y = random_case(s, 100 + i)
        ok &= check(name, s, sd, x, y)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
