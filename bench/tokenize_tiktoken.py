#!/usr/bin/env python3
"""tiktoken's side of bench/tokenize.sh: the same documents, the same ranks file, timed
encode_ordinary_batch(docs, num_threads=N), best of R passes; prints the line
bench_tokenize prints (ids' sha256 as little-endian uint32 in document order).
Usage: tokenize_tiktoken.py LIST ENCODING RANKS THREADS REPS"""
import array
import hashlib
import sys
import time

import tiktoken
import tiktoken.load

PATS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def main():
    lst, name, ranks_path, threads, reps = sys.argv[1:6]
    t0 = time.perf_counter()
    ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    enc = tiktoken.Encoding(name, pat_str=PATS[name], mergeable_ranks=ranks,
                            special_tokens={})
    load_ms = (time.perf_counter() - t0) * 1e3
    paths = [p for p in open(lst).read().split("\n") if p]
    raw = [open(p, "rb").read() for p in paths]
    docs = [b.decode("utf-8") for b in raw]  # tokenize.sh lists valid UTF-8 files only
    best, ids = 1e300, None
    for _ in range(int(reps)):
        s = time.perf_counter()
        ids = enc.encode_ordinary_batch(docs, num_threads=int(threads))
        best = min(best, time.perf_counter() - s)
    h = hashlib.sha256()
    n = 0
    for d in ids:
        a = array.array("I", d)
        if sys.byteorder != "little":
            a.byteswap()
        h.update(a.tobytes())
        n += len(d)
    print(f"docs={len(docs)} bytes={sum(map(len, raw))} tokens={n} seconds={best:.4f} "
          f"load_ms={load_ms:.1f} sha256={h.hexdigest()}")


if __name__ == "__main__":
    main()
