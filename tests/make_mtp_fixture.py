#!/usr/bin/python3
"""Generate Tessera's multi-token prediction fixture: DeepSeek-V3's MTP (report sec. 2.2)
written out in torch on the tiny llama of tests/make_llama_fixture.py (its blocks are
tests/torch_llama.py's DecoderLayer, Hugging Face's LlamaDecoderLayer written out).

Writes (deterministically; rerunning gives byte-identical files):
  tests/fixtures/mtp_tiny_weights.safetensors  float32 weights, HF / DeepSeek names
  tests/fixtures/mtp_tiny_expect.safetensors   float64 reference: loss, gradients, each
                                               depth's loss, 5 AdamW steps

The model: the llama (2 layers, C 32, 4 query heads on 2 key/value heads, SwiGLU 48,
vocabulary 96, T 16, lm_head untied) and D = 2 modules, lambda = 0.3. Module k (1..D),
named model.layers.{n_layer + k - 1}.* as DeepSeek-V3's checkpoint names layer 61:
    h'_i = eh_proj(cat[enorm(embed_tokens(t_{i+k})), hnorm(h^{k-1}_i)])   (embedding first,
           as DeepSeek's released eh_proj, Megatron and vLLM take it)
    h^k  = DecoderLayer_k(h')        (input_layernorm, self_attn, post_attention_layernorm,
                                      mlp: the model's block)
    loss_k = sum over i with i + k + 1 <= T of CE(lm_head(shared_head.norm(h^k_i)),
             t_{i+k+1}) / (B * T)     (the report's 1/T: every position of the batch)
h^0 is the last block's output before model.norm; embed_tokens and lm_head are the
model's (shared). t_0..t_T is the window: tokens then the last target; positions past it
read token 0 (they feed no loss: attention is causal). The objective is
    main + lambda / D * sum_k loss_k,
and the value the model returns is the main loss with the MTP term's gradient added
(main + (mtp - mtp.detach()), Megatron's MTPLossAutoScaler): the fixture's loss and
adamw_losses are the main loss, mtp_losses [D] and adamw_mtp_losses [5, D] each depth's.

Init: the llama fixture's (matrices and the embedding normal(0, 0.02), q_proj and k_proj
normal(0, 0.2), every RMSNorm weight 1 + normal(0, 0.1)), the MTP modules' tensors the same
way (eh_proj a matrix, enorm, hnorm and shared_head.norm norms) under
torch.manual_seed(42). The optimizer and batch: tests/torch_common.py's FIXTURE.

Run:  /root/.cache/tessera/peer-venv/bin/python tests/make_mtp_fixture.py  (torch only)
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
from torch_llama import DecoderLayer, Llama, RMSNorm, Shape, init_weights, param_names  # noqa: E402

SHAPE = Shape(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=96,
              seq_len=16, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)
DEPTHS = 2              # model.mtp_layers
LAMBDA = 0.3            # train.mtp_loss
QK_STD = 0.2
NORM_PERTURB = 0.1


class MTPLayer(DecoderLayer):
    """An MTP module: the block (DecoderLayer's tensors) and DeepSeek's four more."""

    def __init__(self, s):
        super().__init__(s)
        self.enorm = RMSNorm(s.n_embd, s.norm_eps)
        self.hnorm = RMSNorm(s.n_embd, s.norm_eps)
        self.eh_proj = nn.Linear(2 * s.n_embd, s.n_embd, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(s.n_embd, s.norm_eps)


class LlamaMTP(Llama):
    def __init__(self, s):
        super().__init__(s)
        for _ in range(DEPTHS):
            self.model.layers.append(MTPLayer(s))
        self.last_mtp = None

    def forward(self, idx, targets):
        s = self.shape
        B, T = idx.shape
        x = self.model.embed_tokens(idx)
        cos = self.rope_cos[:T].to(x.device, x.dtype)
        sin = self.rope_sin[:T].to(x.device, x.dtype)
        mask = self.mask[:T, :T]
        for layer in self.model.layers[:s.n_layer]:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.model.norm(x))
        main = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        window = torch.cat([idx, targets[:, -1:]], dim=1)  # t_0 .. t_T
        h, depth = x, []
        for k in range(1, DEPTHS + 1):
            layer = self.model.layers[s.n_layer + k - 1]
            inp = torch.zeros_like(idx)
            inp[:, :T + 1 - k] = window[:, k:]             # t_{i+k}, 0 past the window
            e = layer.enorm(self.model.embed_tokens(inp))
            h = layer(layer.eh_proj(torch.cat([e, layer.hnorm(h)], dim=-1)), cos, sin, mask)
            lg = self.lm_head(layer.shared_head.norm(h))[:, :T - k]
            tgt = window[:, k + 1:]                        # t_{i+k+1}, i < T - k
            ce = F.cross_entropy(lg.reshape(-1, lg.size(-1)), tgt.reshape(-1), reduction="sum")
            depth.append(ce / (B * T))
        mtp = LAMBDA / DEPTHS * sum(depth)
        self.last_mtp = torch.stack(depth).detach()
        return main + (mtp - mtp.detach())


def names_of(s):
    names = param_names(s)
    for k in range(1, DEPTHS + 1):
        p = f"model.layers.{s.n_layer + k - 1}."
        names += [p + n for n in (
            "input_layernorm.weight",
            "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")]
    return names


def qk_std(name):
    return QK_STD if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02


def main():
    names = names_of(SHAPE)
    meta = SHAPE.meta()
    meta.update({"mtp_layers": DEPTHS, "mtp_loss": LAMBDA})
    fx = tc.make_fixture(
        "mtp_tiny", lambda: LlamaMTP(SHAPE), names,
        lambda m: init_weights(m, names, NORM_PERTURB, qk_std), meta, SHAPE.vocab_size,
        "Tessera's llama init (matrices and embedding normal 0.02, norm weights 1) "
        f"except q_proj, k_proj normal {QK_STD}; then every norm weight perturbed by "
        f"+normal(0,{NORM_PERTURB}); the MTP modules' the same way",
        record=lambda m: {"mtp_losses": m.last_mtp.clone()},
        e_meta={"mtp": f"D = {DEPTHS}, lambda = {LAMBDA}; loss and adamw_losses: the main "
                       "loss (its value; the gradients are the whole objective's); "
                       "mtp_losses [D], adamw_mtp_losses [steps, D]: each depth's sum of "
                       "cross-entropies over B*T"})
    depths = fx.recorded["mtp_losses"].tolist()
    return tc.report_fixture(
        fx, SHAPE.vocab_size,
        ["mtp_losses " + " ".join(f"{x:.10f}" for x in depths)],
        all(abs(x - (SHAPE.seq_len - k - 1) / SHAPE.seq_len * fx.loss0) < 0.5
            for k, x in enumerate(depths)))


if __name__ == "__main__":
    sys.exit(main())
