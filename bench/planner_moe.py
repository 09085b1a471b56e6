#!/usr/bin/env python3
# The planner against the published MoE rows (bench/RESULTS.md 4.7, 4.8): each row of the
# table planned as a GPU run (the CUDA kernel table, flash attention) on its cluster file
# (the DGX H100 file unless the row names another: DeepSeek-V3 and Kimi K2 on their H800
# nodes) and printed as docs/planner_moe.tsv, which tests/test_docs_drift.sh replans.
# published_mfu and published_step_s are the papers' (DeepSeek-V3: its 180K H800
# GPU-hours per trillion tokens as a step of 15360 x 4096 tokens on 2048 GPUs, and as MFU
# with the planner's FLOPs count at the row's cluster peak: RESULTS 4.8).
# Usage (repository root): bench/planner_moe.py > docs/planner_moe.tsv   (BUILD=dir: build/)
import json, os, subprocess, sys
T = os.path.join(os.environ.get("BUILD", "build"), "tessera")
H = "configs/clusters/dgx-h100.cfg"
H800 = "configs/clusters/h800-node.cfg"
FP8 = "bench/h800-fp8-gemm.cfg"
G = ['train.device="cuda"', 'train.attention="flash"']
rows = [
 ("folding-mixtral-8x22b", "configs/mixtral-8x22b-folding.cfg", G, "49.3", "4.067"),
 ("folding-mixtral-8x22b-auto", "configs/mixtral-8x22b-folding.cfg", G + ['parallel.recompute="auto"'], "49.3", "4.067"),
 ("folding-qwen2-57b-a14b", "configs/qwen2-57b-a14b.cfg", G, "39.0", "3.594"),
 ("folding-qwen2-57b-a14b-full", "configs/qwen2-57b-a14b.cfg", G + ['parallel.recompute="full"'], "39.0", "3.594"),
 ("guide-mixtral-8x7b", "configs/mixtral-8x7b.cfg", G, "-", "-"),
 ("guide-mixtral-8x7b-auto", "configs/mixtral-8x7b.cfg", G + ['parallel.recompute="auto"'], "-", "-"),
 ("guide-mixtral-8x22b", "configs/mixtral-8x22b.cfg", G, "-", "-"),
 ("guide-mixtral-8x22b-auto", "configs/mixtral-8x22b.cfg", G + ['parallel.recompute="auto"'], "-", "-"),
 ("zoo-qwen3-30b-a3b", "configs/qwen3-30b-a3b.cfg", G, "-", "-"),
 ("zoo-qwen3-235b-a22b", "configs/qwen3-235b-a22b.cfg", G, "24.8", "19.7"),
 ("deepseek-v3-671b", "configs/deepseek-v3-671b.cfg", G, "45.5", "19.91", H800),
 ("deepseek-v3-671b-fp8gemm", "configs/deepseek-v3-671b.cfg", G, "22.8", "19.91", FP8),
 ("kimi-k2", "configs/kimi-k2.cfg", G, "-", "-", H800),
]
cols = ["row", "config", "sets", "gpus", "published_mfu", "published_step_s", "step_ms", "mfu",
        "mem_gb", "fits", "a2a_share", "a2a_hidden_share", "bubble", "cluster"]
print("\t".join(cols))
for name, cfg, sets, pm, ps, *cluster in rows:
    cl = cluster[0] if cluster else H
    args = [T, "plan", cfg, "--cluster", cl, "--json"]
    for s in sets: args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode: print(name, p.stderr, file=sys.stderr); continue
    d = json.loads(p.stdout); m = d["moe"]
    print("\t".join([name, cfg, ";".join(sets), str(d["world"]), pm, ps, "%.3f" % d["step_ms"],
                     "%.6f" % d["mfu"], "%.3f" % (d["memory_bytes"] / 1e9), str(int(d["fits"])),
                     "%.4f" % m["a2a_share"], "%.4f" % m["a2a_hidden_share"], "%.4f" % d["bubble"],
                     cl]))
