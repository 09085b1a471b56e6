#!/usr/bin/env python3
"""`tessera data`'s side of bench/tokenize.sh: run the whole corpus tool (reading the
files, encoding on THREADS threads, writing shards) on the listed documents, best of
REPS wall-clock passes, then read the shards back and print bench_tokenize's line: the
ids without the document token (which starts every document, and which
encode_ordinary never yields) hashed as little-endian uint32 in document order, so the
line compares with tiktoken's.
Usage: tokenize_data.py TESSERA LIST ENCODING RANKS THREADS REPS"""
import array
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import time

DOC_TOKEN = {"gpt2": 50256, "llama3": 128000}


def main():
    tessera, lst, enc, ranks, threads, reps = sys.argv[1:7]
    paths = [p for p in open(lst).read().split("\n") if p]
    nbytes = sum(os.path.getsize(p) for p in paths)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "bench")
        cmd = [tessera, "data", "--encoding", enc, "--ranks", ranks, "--threads", threads,
               "--overwrite", "--out", prefix] + paths
        best = 1e300
        for _ in range(int(reps)):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            best = min(best, time.perf_counter() - t0)
        h = hashlib.sha256()
        n = docs = 0
        for shard in sorted(glob.glob(prefix + "_*.bin")):
            raw = open(shard, "rb").read()
            head = array.array("i", raw[:1024])
            width = 2 if head[0] == 20240520 else 4
            ids = array.array("H" if width == 2 else "I", raw[1024:])
            if sys.byteorder != "little":
                ids.byteswap()
            assert len(ids) == head[2] and len(raw) == 1024 + width * head[2], shard
            kept = array.array("I", (i for i in ids if i != DOC_TOKEN[enc]))
            docs += len(ids) - len(kept)
            if sys.byteorder != "little":
                kept.byteswap()
            h.update(kept.tobytes())
            n += len(kept)
    assert docs == len(paths), (docs, len(paths))
    print(f"docs={docs} bytes={nbytes} tokens={n} seconds={best:.4f} load_ms=— "
          f"sha256={h.hexdigest()}")


if __name__ == "__main__":
    main()
