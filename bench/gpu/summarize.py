#!/usr/bin/env python3
"""Read the GPU benchmark's outputs and print its table (bench/gpu/bench_gpu.sh).

Inputs: gemm_curve's output (--gemm), one Tessera metrics JSONL per run (--tessera
LABEL=FILE, repeatable, in row order), the PyTorch script's JSON lines (--torch), and
the model's shape (--model L,H,C,V,T). Rows: each Tessera run, then PyTorch eager and
compile, with tokens/s, ms/step, MFU and the ratio to PyTorch compile (or, when compile
did not run, to eager: the header says which).

Tessera's steady state: the first 5 steps are set-up (allocations, cuBLASLt plans,
first-touch), so the median step_ms over the rest is used (over the second half when
a run has 10 steps or fewer); tokens/s = tokens per step / that median.

MFU as nanoGPT and llm.c estimate it (nanoGPT model.estimate_mfu):
  flops per token = 6*N + 12*L*H*Q*T, N = parameters without the position embedding
  (the tied token embedding counted once), L layers, H heads, Q = C/H, T = seq_len;
  MFU = flops per token * tokens/s / peak (989e12: H100/H200 SXM dense bf16, also for
  the fp32 row, so rows compare). The 12*L*H*Q*T term counts the full T x T attention
  products (no causal halving). "of GEMM best" divides by the best TFLOP/s gemm_curve
  measured instead of the datasheet peak.
Writes the table to stdout and, with --json FILE, one JSON object per row to FILE
(appended).
"""
import argparse
import json
import math
import re
import statistics
import sys


def model_flops_per_token(L, H, C, V, T):
    n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    n_nonemb = n_params - T * C  # nanoGPT's get_num_params(non_embedding=True)
    return n_params, n_nonemb, 6 * n_nonemb + 12 * L * H * (C // H) * T


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut short by a timeout
    except OSError as e:
        return None, f"{path}: {e.strerror}"
    return rows, None


def tessera_row(label, path):
    rows, err = read_jsonl(path)
    if err:
        return {"name": label, "error": "no metrics: the run was skipped for time, failed "
                "before its first step, or timed out (see bench_gpu.log)"}
    steps = [r for r in rows if "step_ms" in r and "tokens" in r]
    if not steps:
        return {"name": label, "error": f"{path}: no step lines (the run failed or timed out)"}
    skip = 5 if len(steps) > 10 else len(steps) // 2
    steady = steps[skip:]
    med = statistics.median(r["step_ms"] for r in steady)
    tokens = steady[-1]["tokens"]
    losses = [r.get("loss") for r in steps if isinstance(r.get("loss"), (int, float))]
    row = {"name": label, "steps": len(steps), "steady_steps": len(steady),
           "tokens_per_step": tokens, "median_step_ms": med,
           "tokens_per_s": tokens / (med / 1000.0),
           "loss_first": losses[0] if losses else None,
           "loss_last": losses[-1] if losses else None}
    if losses and not all(math.isfinite(x) for x in losses):
        row["error"] = "non-finite loss"
    return row


def torch_rows(path):
    rows, err = read_jsonl(path)
    if err or not rows:
        return [{"name": "PyTorch", "error": "no output: skipped for time, crashed or timed "
                 "out (see bench_gpu.log)"}]
    out = []
    for r in rows:
        name = f"PyTorch {r['mode']}" if "mode" in r else "PyTorch"
        if "skipped" in r or "error" in r:
            out.append({"name": name, "error": r.get("skipped") or r.get("error"),
                        "skipped": "skipped" in r})
            continue
        out.append({"name": name, "tokens_per_step": r["tokens_per_step"],
                    "median_step_ms": r["median_step_ms"], "tokens_per_s": r["tokens_per_s"],
                    "compile_s": r.get("compile_s"), "peak_mem_gb": r.get("peak_mem_gb"),
                    "loss_first": r.get("loss_first"), "loss_last": r.get("loss_last")})
    return out


def gemm_best(path):
    """(best TFLOP/s, gemm_efficiency line, bandwidth GB/s) from gemm_curve's output."""
    best, eff, bw = None, None, None
    try:
        text = open(path).read()
    except OSError:
        return best, eff, bw
    m = re.search(r"best_tflops=([0-9.]+)", text)
    if m:
        best = float(m.group(1))
    m = re.search(r"^gemm_efficiency = .*$", text, re.M)
    if m:
        eff = m.group(0)
    m = re.search(r"bandwidth kind=copy_kernel .*gbs=([0-9.]+)", text)
    if m:
        bw = float(m.group(1))
    return best, eff, bw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm", default="")
    ap.add_argument("--tessera", action="append", default=[], metavar="LABEL=FILE")
    ap.add_argument("--torch", default="")
    ap.add_argument("--model", default="12,12,768,50257,1024", metavar="L,H,C,V,T")
    ap.add_argument("--peak", type=float, default=989.0, help="TFLOP/s")
    ap.add_argument("--json", default="", help="append the rows as JSON lines here")
    a = ap.parse_args()
    try:
        L, H, C, V, T = (int(x) for x in a.model.split(","))
    except ValueError:
        ap.error(f"--model '{a.model}': give five integers L,H,C,V,T")
    n_params, n_nonemb, fpt = model_flops_per_token(L, H, C, V, T)

    rows = []
    for spec in a.tessera:
        label, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"--tessera '{spec}': write LABEL=FILE")
        rows.append(tessera_row(label, path))
    if a.torch:
        rows.extend(torch_rows(a.torch))
    best, eff_line, bw = gemm_best(a.gemm) if a.gemm else (None, None, None)

    ref = next((r for r in rows if r["name"] == "PyTorch compile" and "tokens_per_s" in r),
               None) or next((r for r in rows if r["name"] == "PyTorch eager"
                              and "tokens_per_s" in r), None)
    for r in rows:
        if "tokens_per_s" in r:
            tflops = fpt * r["tokens_per_s"] / 1e12
            r["model_tflops"] = tflops
            r["mfu"] = tflops / a.peak
            r["of_gemm_best"] = tflops / best if best else None
            r["vs_ref"] = r["tokens_per_s"] / ref["tokens_per_s"] if ref else None

    print(f"GPT-2 L={L} H={H} C={C} V={V} T={T}: {n_params:,} parameters, N = {n_nonemb:,} "
          f"without wpe; flops/token = 6N + 12*L*H*Q*T = {fpt / 1e6:.1f} M (nanoGPT/llm.c); "
          f"MFU of {a.peak:g} TFLOP/s")
    if best:
        print(f"measured ceilings: best cuBLASLt bf16 GEMM {best:.1f} TFLOP/s"
              + (f", copy bandwidth {bw:.0f} GB/s" if bw else ""))
    ref_name = ref["name"] if ref else "PyTorch compile (none)"
    hdr = (f"{'run':<22} {'tokens/s':>12} {'ms/step':>10} {'TFLOP/s':>9} {'MFU':>7} "
           f"{'of GEMM best':>13} {'vs ' + ref_name:>24}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"{r['name']:<22} {'skipped' if r.get('skipped') else 'FAILED'}: {r['error']}")
            continue
        gb = f"{r['of_gemm_best']:.3f}" if r.get("of_gemm_best") else "-"
        vs = f"{r['vs_ref']:.3f}" if r.get("vs_ref") else "-"
        err = f"   ({r['error']})" if "error" in r else ""
        if r.get("compile_s"):
            err += f"   (compile {r['compile_s']:.0f} s, excluded)"
        print(f"{r['name']:<22} {r['tokens_per_s']:>12,.0f} {r['median_step_ms']:>10.2f} "
              f"{r['model_tflops']:>9.1f} {r['mfu']:>7.3f} {gb:>13} {vs:>24}{err}")
    if eff_line:
        print("cluster-file line (configs/clusters/h200-node.cfg, device):")
        print("  " + eff_line)
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, kind="bench_row")) + "\n")
    return 0 if rows and all("tokens_per_s" in r or r.get("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
