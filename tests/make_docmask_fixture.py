#!/usr/bin/python3
"""Generate Tessera's packed-documents fixture (data.document_mask) with a PyTorch
reference: each document of a packed window run ALONE.

Writes (deterministically; rerunning gives byte-identical files):
  tests/fixtures/docmask_llama_expect.safetensors  the tiny llama's (the weights of
                                                   tests/fixtures/llama_tiny_weights)
  tests/fixtures/docmask_gpt2_expect.safetensors   the tiny gpt2's (gpt2_tiny_weights)
each holding the batch (tokens, targets: 4 windows of 16), the document token, the loss
and every parameter's gradient (F32: the reference is computed in float64 from exactly the
stored float32 weights and rounded once; the files stay small).

The windows hold 2 to 4 documents each: a document starts at each DOC token and at the
window's first position (the first window's first document is cut by the window start and
has no DOC token; another window starts with DOC). The reference runs every document as
its own sequence (positions 0..L-1, its own causal mask) and sums its tokens' losses
against the window's targets (the last token of a document predicts the next document's
DOC, as packed training does); the loss is that sum over the 64 tokens / 64. Tessera's
packed windows with data.document_mask must give the same loss and gradients
(tests/test_docmask_fixture.c). The script also prints the packed windows' loss WITHOUT
masks, which must differ (the mask matters on this batch).

Run:  /root/.cache/tessera/peer-venv/bin/python tests/make_docmask_fixture.py
(torch only; Debian's python3-torch works too)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
import torch_llama as tl  # noqa: E402
import make_fixture as mf  # noqa: E402

B, T, VOCAB = 4, 16, 96
DOC = 95                                   # data.document_token of the tests
STARTS = [[5, 11], [0, 4, 9, 13], [3, 7, 12], [2, 8]]  # DOC positions of each window
LLAMA = tl.Shape(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, vocab_size=VOCAB,
                 seq_len=T, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False)


def batch():
    g = torch.Generator().manual_seed(4321)
    seq = torch.randint(0, DOC, (B, T + 1), generator=g, dtype=torch.long)  # no DOC by chance
    for b, ps in enumerate(STARTS):
        for p in ps:
            seq[b, p] = DOC
    seq[1, T] = DOC  # a target that is the next window's document token
    return seq[:, :T].contiguous(), seq[:, 1:].contiguous()


def documents(row):
    """[(start, end)] of one window's documents."""
    starts = sorted({0} | {p for p in range(T) if row[p].item() == DOC})
    return list(zip(starts, starts[1:] + [T]))


def per_document_loss(model, tokens, targets):
    total = 0.0
    for b in range(B):
        for s, e in documents(tokens[b]):
            L = e - s
            # the model's forward is a mean over its L tokens: times L is their sum
            total = total + model(tokens[b:b + 1, s:e], targets[b:b + 1, s:e]) * L
    return total / (B * T)


def write(stem, model, names, tokens, targets, meta):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = model.double()
    loss = per_document_loss(model, tokens, targets)
    loss.backward()
    params = dict(model.named_parameters())
    with torch.no_grad():
        packed = model(tokens, targets).item()
    out = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32)),
           ("doc_token", torch.tensor([DOC], dtype=torch.int32)),
           ("loss", torch.tensor([loss.item()], dtype=torch.float64))]
    out += [("grad." + n, params[n].grad.float()) for n in names]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                        f"{stem}_expect.safetensors")
    tc.write_safetensors(path, out, meta)
    print(f"{stem}: per-document loss {loss.item():.10f}, packed without masks {packed:.10f} "
          f"(differs by {abs(packed - loss.item()):.3g})")
    return abs(packed - loss.item()) > 1e-4


def main():
    tokens, targets = batch()
    fix = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    ok = True
    llama, _ = tl.load_model(LLAMA, os.path.join(fix, "llama_tiny_weights.safetensors"))
    ok &= write("docmask_llama", llama, tl.param_names(LLAMA), tokens, targets,
                {"weights": "llama_tiny_weights.safetensors", "doc_token": DOC})
    sd, _ = tc.read_safetensors(os.path.join(fix, "gpt2_tiny_weights.safetensors"))
    gpt = mf.GPT(mf.N_LAYER, mf.N_HEAD, mf.N_EMBD, mf.VOCAB, mf.SEQ_LEN)
    sd = dict(sd)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    gpt.load_state_dict(sd, strict=True)
    ok &= write("docmask_gpt2", gpt, mf.param_names(mf.N_LAYER), tokens, targets,
                {"weights": "gpt2_tiny_weights.safetensors", "doc_token": DOC})
    if not ok:
        print("the document masks do not change the loss of this batch", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
