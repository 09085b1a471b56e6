#!/usr/bin/env python3
"""Tessera's reliability probe, rerunnable: the hostile cases and kill tests of
../shared/reviews/2026-12-01-reliability.md (and the newcomer report's lock case),
one line per case (PASS/FAIL/SKIP, why) and a summary; exit 1 if any case fails.

  tests/probe/probe.py BUILD/tessera [--full] [--only CATS] [--work DIR] [--asan]

See README.md. Python 3 standard library only; strace (for 1d) is optional."""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
import kills  # noqa: E402
from lib import Probe  # noqa: E402

CATS = ["1-ckpt", "1b-tworuns", "1c-killrand", "1d-inject", "2-signals", "3-nonreg", "4-numeric",
        "5-files", "6-ranks", "7-careless", "repro"]
KILL_CATS = ["1b-tworuns", "1c-killrand", "1d-inject", "2-signals"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tessera", help="the tessera binary (a release or an ASan build)")
    ap.add_argument("--src", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    help="the source tree (configs/, tests/schedules/); default: this checkout")
    ap.add_argument("--full", action="store_true", help="every case and the report's trial counts")
    ap.add_argument("--only", default="", help="comma-separated categories: " + ",".join(CATS)
                    + ", or 'kills' for the kill and signal tests")
    ap.add_argument("--work", help="scratch directory (default: a new one under $TMPDIR, removed on success)")
    ap.add_argument("--asan", action="store_true", help="set the report's ASAN_OPTIONS/LSAN_OPTIONS")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every command")
    a = ap.parse_args()
    only = set()
    for c in filter(None, a.only.split(",")):
        only |= set(KILL_CATS) if c == "kills" else {c}
    unknown = only - set(CATS)
    if unknown:
        ap.error(f"unknown categories {sorted(unknown)}")
    work = a.work or tempfile.mkdtemp(prefix="tessera-probe-")
    P = Probe(a.tessera, a.src, work, "full" if a.full else "quick", asan=a.asan, verbose=a.verbose)
    want = (lambda c: not only or c in only)
    t0 = time.time()
    print(f"probe: {P.mode} mode, tessera {P.T}, scratch {work}", flush=True)
    base = hostile.setup(P)
    steps = [
        ("1-ckpt", lambda: hostile.ckpt_cases(P, base)),
        ("3-nonreg", lambda: hostile.nonreg_cases(P, base)),
        ("4-numeric", lambda: hostile.numeric_cases(P)),
        ("5-files", lambda: (hostile.safetensors_cases(P, base), hostile.shard_cases(P), hostile.csv_cases(P),
                             hostile.cluster_cases(P), hostile.trace_cases(P), hostile.sample_cases(P, base),
                             hostile.data_cases(P))),
        ("6-ranks", lambda: hostile.ranks_cases(P)),
        ("7-careless", lambda: hostile.careless_cases(P, base)),
        ("repro", lambda: hostile.repro_cases(P, base)),
        ("1b-tworuns", lambda: kills.two_runs(P)),
        ("2-signals", lambda: kills.signals(P)),
        ("1d-inject", lambda: kills.injected(P)),
        ("1c-killrand", lambda: kills.random_kills(P)),
    ]
    for cat, fn in steps:
        if not want(cat):
            continue
        if cat == "repro" and not os.path.exists(P.path("nr", "fifo")):
            os.makedirs(P.path("nr"), exist_ok=True)
            os.mkfifo(P.path("nr", "fifo"))
        t = time.time()
        try:
            fn()
        except Exception as ex:  # a probe bug must not hide the other categories
            import traceback
            traceback.print_exc()
            P.record(cat, "probe-error", False, f"the probe itself failed: {ex!r}")
        print(f"    ({cat}: {time.time() - t:.0f} s)", flush=True)
    rc = P.summary()
    print(f"\nprobe: {P.mode} mode took {time.time() - t0:.0f} s; scratch {work}")
    if rc == 0 and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
