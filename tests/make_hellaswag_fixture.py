#!/usr/bin/env python3
"""Writes tests/fixtures/hellaswag/expected.json: HellaSwag's three scores and every
completion's log-likelihood for tests/fixtures/hellaswag/items.jsonl, computed by a
PyTorch reference (nanoGPT's GPT-2 of tests/make_fixture.py, float64) on the weights of
the tiny checkpoint tests/test_eval_hellaswag.sh trains, with the text handled as
lm-evaluation-harness does (the functions below are copied from its
lm_eval/tasks/hellaswag/utils.py, api/model.py _encode_pair, models/huggingface.py
_loglikelihood_tokens and api/task.py process_results) and llm.c's acc_norm_tokens
(dev/data/hellaswag.py: argmin of the ending's mean token loss).

Run with the peer venv (torch, tiktoken: scripts/peer_venv.sh, then pip install tiktoken):
  ~/.cache/tessera/peer-venv/bin/python tests/make_hellaswag_fixture.py build/tessera

The file also keeps every row (its input token ids and its continuation's length), so
that the test can recompute the log-likelihoods with torch alone on the checkpoint it
trains (another build's 12 training steps move the weights, and the log-likelihoods by
~1e-4):
  python3 tests/make_hellaswag_fixture.py --score MODEL.safetensors   (prints JSON)

It makes the checkpoint with the given tessera exactly as the test does (TRAIN below;
the test keeps the same command), reads its model.safetensors, and writes the file. The
tokenizer is tests/fixtures/bpe/small.tiktoken under gpt2's pattern (<|endoftext|> = 3000),
as tiktoken builds it (tests/make_bpe_fixture.py)."""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402
from make_fixture import GPT  # noqa: E402

SRC = os.path.dirname(HERE)
RANKS = os.path.join(SRC, "tests/fixtures/bpe/small.tiktoken")
ITEMS = os.path.join(SRC, "tests/fixtures/hellaswag/items.jsonl")
OUT = os.path.join(SRC, "tests/fixtures/hellaswag/expected.json")
L, H, C, V, T = 2, 2, 32, 3008, 64
STEPS = 12
# The training the test runs (tests/test_eval_hellaswag.sh): keep the two identical.
TRAIN = ["--set", f"model.n_layer={L}", "--set", f"model.n_head={H}", "--set", f"model.n_embd={C}",
         "--set", f"model.seq_len={T}", "--set", f"model.vocab_size={V}",
         "--set", "model.tokenizer=gpt2", "--set", "train.threads=1", "--set", f"train.steps={STEPS}",
         "--set", "train.lr=1e-2", "--set", "train.warmup=0", "--set", "data.val=\"\""]
GPT2_PAT = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


# ---- lm-evaluation-harness, verbatim ---------------------------------------------------
def preprocess(text):
    text = text.strip()
    # NOTE: Brackets are artifacts of the WikiHow dataset portion of HellaSwag.
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def process_doc(doc):
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return {"query": preprocess(doc["activity_label"] + ": " + ctx),
            "choices": [preprocess(ending) for ending in doc["endings"]],
            "gold": int(doc["label"])}


def encode_pair(enc, context, continuation):
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole_enc = enc.encode_ordinary(context + continuation)
    context_enc = enc.encode_ordinary(context)
    return context_enc, whole_enc[len(context_enc):]


def row(context_enc, continuation_enc, max_length):
    assert len(context_enc) > 0 and 0 < len(continuation_enc) <= max_length
    inp = (context_enc + continuation_enc)[-(max_length + 1):][:-1]
    return inp, continuation_enc


# ---- the reference --------------------------------------------------------------------
def encoding():
    import tiktoken  # only the generator needs it (the test's --score reads the rows)
    ranks = {}
    for line in open(RANKS, "rb"):
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return tiktoken.Encoding("small_gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


def make_checkpoint(tessera, tmp):
    env = dict(os.environ, TS_TEST_TOKENIZER_ANY_SIZE="1", TS_TOKENIZER_DIR=os.path.join(tmp, "none"))
    text = open("/usr/share/games/fortunes/fortunes", "rb").read()
    open(os.path.join(tmp, "small.txt"), "wb").write(text)
    subprocess.run([tessera, "data", "--encoding", "gpt2", "--ranks", RANKS, "--val-tokens", "2000",
                    os.path.join(tmp, "small.txt"), "--out", os.path.join(tmp, "bpe")],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([tessera, "train", os.path.join(SRC, "configs/tiny.cfg"), *TRAIN,
                    "--set", f"model.tokenizer_file=\"{RANKS}\"",
                    "--set", f"data.train=\"{tmp}/bpe_train_*.bin\"",
                    "--set", f"checkpoint.dir=\"{tmp}/ck\"", "--set", "log.metrics=\"\"",
                    "--set", "log.progress=false"], check=True, env=env)
    return os.path.join(tmp, "ck", f"step_{STEPS:08d}", "model.safetensors")


def logliks(model, rows):
    out = []
    with torch.no_grad():
        for inp, cont in rows:
            idx = torch.tensor([inp])
            pos = torch.arange(idx.size(1))
            x = model.transformer.wte(idx) + model.transformer.wpe(pos)
            for blk in model.transformer.h:
                x = blk(x)
            logits = model.lm_head(model.transformer.ln_f(x))
            lp = F.log_softmax(logits, dim=-1)[0, -len(cont):, :]
            out.append(float(lp.gather(1, torch.tensor(cont)[:, None]).sum()))
    return out


def load(weights):
    sd, _ = tc.read_safetensors(weights)
    sd = dict(sd)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model = GPT(L, H, C, V, T)
    model.load_state_dict(sd, strict=True)
    return model.double().eval()


def score(weights):
    exp = json.load(open(OUT))
    model = load(weights)
    rows = [(r["input"], r["input"][len(r["input"]) - r["cont"] + 1:] + [r["last"]])
            for it in exp["per_item"] for r in it["rows"]]
    ll = logliks(model, rows)
    print(json.dumps({"loglik": [ll[4 * i:4 * i + 4] for i in range(len(exp["per_item"]))]}))


def main():
    if sys.argv[1] == "--score":
        return score(sys.argv[2])
    import tiktoken
    tessera = os.path.abspath(sys.argv[1])
    enc = encoding()
    docs = [json.loads(l) for l in open(ITEMS, encoding="utf-8") if l.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        weights = make_checkpoint(tessera, tmp)
        model = load(weights)
    items, acc, acc_norm, acc_tok, truncated = [], 0, 0, 0, 0
    margins = []
    for d in docs:
        doc = process_doc(d)
        rows = []
        for ch in doc["choices"]:
            ce, co = encode_pair(enc, doc["query"], " " + ch)
            truncated += len(ce) + len(co) > T + 1
            rows.append(row(ce, co, T))
        ll = np.array(logliks(model, rows))
        ntok = np.array([len(r[1]) for r in rows], dtype=float)
        nchar = np.array([float(len(c)) for c in doc["choices"]])
        gold = doc["gold"]
        s = [ll, ll / nchar, -(-ll / ntok)]  # loglik, per character, minus mean token loss
        acc += int(np.argmax(s[0]) == gold)
        acc_norm += int(np.argmax(s[1]) == gold)
        acc_tok += int(np.argmax(s[2]) == gold)
        for v in s:  # how far the winner is from the runner-up: the test's 1e-4 must not flip it
            top = np.sort(v)[::-1]
            margins.append(float(top[0] - top[1]))
        items.append({"label": gold, "loglik": [float(x) for x in ll],
                      "tokens": [len(r[1]) for r in rows], "chars": [len(c) for c in doc["choices"]],
                      "rows": [{"input": r[0], "cont": len(r[1]), "last": r[1][-1]} for r in rows]})
    n = len(items)
    res = {"generator": "tests/make_hellaswag_fixture.py", "torch": torch.__version__,
           "tiktoken": tiktoken.__version__, "items": n, "acc_count": acc, "acc_norm_count": acc_norm,
           "acc_norm_tokens_count": acc_tok, "acc": acc / n, "acc_norm": acc_norm / n,
           "acc_norm_tokens": acc_tok / n, "truncated": truncated, "min_margin": min(margins),
           "per_item": items}
    if min(margins) < 1e-3:
        raise SystemExit(f"an item's winner is within {min(margins):.2e} of its runner-up: the "
                         "test's tolerance could flip it; change the training")
    json.dump(res, open(OUT, "w"), indent=1)
    print(f"{OUT}: {n} items, acc {acc}, acc_norm {acc_norm}, acc_norm_tokens {acc_tok}, "
          f"{truncated} rows truncated, smallest margin {min(margins):.3g}")


if __name__ == "__main__":
    main()
