#!/usr/bin/env python3
"""The PyTorch peer of bench/hellaswag.sh: the same HellaSwag scoring as `tessera eval`
(the rows built by tests/make_hellaswag_fixture.py's copy of lm-evaluation-harness's text
handling, tiktoken on the same ranks), nanoGPT's GPT-2 in float32 on the checkpoint's
weights, 4 rows (one item) per forward padded to seq_len as Tessera pads them, best of
REPS timed passes of the forwards and log-likelihood sums (the rows are built before
the clock starts, as Tessera encodes at start-up). Prints one JSON object: seconds,
items_per_s, the counts, and the largest |loglik - Tessera's| when --tessera-json is
given (the two must score the same numbers).

usage: hellaswag_peer.py WEIGHTS ITEMS L H C V T THREADS REPS [--tessera-json FILE]"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import make_hellaswag_fixture as hf  # noqa: E402
import torch_common as tc  # noqa: E402
from make_fixture import GPT  # noqa: E402


def main():
    weights, items = sys.argv[1], sys.argv[2]
    L, H, C, V, T, threads, reps = map(int, sys.argv[3:10])
    ref = json.load(open(sys.argv[11])) if len(sys.argv) > 11 else None
    torch.set_num_threads(threads)
    enc = hf.encoding()
    docs = [hf.process_doc(json.loads(l)) for l in open(items, encoding="utf-8") if l.strip()]
    batches = []
    for doc in docs:
        toks = torch.zeros(4, T, dtype=torch.long)
        spans = []
        for j, ch in enumerate(doc["choices"]):
            inp, cont = hf.row(*hf.encode_pair(enc, doc["query"], " " + ch), T)
            full = inp + [cont[-1]]
            toks[j, :len(inp)] = torch.tensor(inp)
            spans.append((len(inp) - len(cont), len(inp), torch.tensor(full[len(inp) - len(cont) + 1:])))
        batches.append((toks, spans, doc))
    sd, _ = tc.read_safetensors(weights)
    sd = dict(sd)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model = GPT(L, H, C, V, T)
    model.load_state_dict(sd, strict=True)
    model.eval()
    best, lls = None, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = []
        with torch.no_grad():
            for toks, spans, _doc in batches:
                pos = torch.arange(T)
                x = model.transformer.wte(toks) + model.transformer.wpe(pos)
                for blk in model.transformer.h:
                    x = blk(x)
                lp = F.log_softmax(model.lm_head(model.transformer.ln_f(x)), dim=-1)
                for j, (a, b, tgt) in enumerate(spans):
                    out.append(float(lp[j, a:b].gather(1, tgt[:, None]).sum()))
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
        lls = out
    acc = acc_norm = acc_tok = 0
    for i, (_t, spans, doc) in enumerate(batches):
        ll = np.array(lls[4 * i:4 * i + 4])
        nt = np.array([len(s[2]) for s in spans], dtype=float)
        nc = np.array([float(len(c)) for c in doc["choices"]])
        acc += int(np.argmax(ll) == doc["gold"])
        acc_norm += int(np.argmax(ll / nc) == doc["gold"])
        acc_tok += int(np.argmax(ll / nt) == doc["gold"])
    res = {"seconds": best, "items_per_s": len(docs) / best, "items": len(docs), "acc_count": acc,
           "acc_norm_count": acc_norm, "acc_norm_tokens_count": acc_tok, "torch": torch.__version__}
    if ref:
        res["max_abs_diff"] = max(abs(a - b) for it, k in zip(ref["per_item"], range(len(docs)))
                                  for a, b in zip(it["loglik"], lls[4 * k:4 * k + 4]))
        res["same_counts"] = all(ref[k] == res[k] for k in ("acc_count", "acc_norm_count",
                                                            "acc_norm_tokens_count"))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
