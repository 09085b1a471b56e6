#!/usr/bin/env python3
"""Helpers for bench/scaling.sh: parse the runs' metrics and the planner's JSON into the
tables and the gnuplot data files. Subcommands:

  timeshare CLUSTER.cfg CORES RANKS OUT.cfg
      write a variant of a measured cluster file for RANKS ranks time-sharing CORES
      cores: devices_per_node = RANKS, each device's peak FLOP/s, memory bandwidth and
      memory scaled by CORES / RANKS (each rank gets that share of a core), its
      elementwise times per element by RANKS / CORES
  measured MANIFEST.tsv OUTDIR
      one row per run (label, config, kind, mode, ranks, grid, metrics file, plan JSON
      files, CPU share of other processes): OUTDIR/measured.csv, measured.md and one
      gnuplot data file per (config, mode): here_<config>_<mode>.dat
  curves MANIFEST.tsv OUTDIR
      one row per (cluster file's tag, cluster name, model, gpus, search JSON file,
      error file, family: gpt3 or llama3; gpt3 when absent): OUTDIR/curves.csv,
      curves.md, curves_<tag>.tsv (per cluster) and <family>_<tag>.dat (one gnuplot block
      per model of the family)
"""
import csv
import json
import re
import statistics
import sys


def die(msg):
    print("scaling.py: " + msg, file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- timeshare


def timeshare(src, cores, ranks, out):
    cores, ranks = int(cores), int(ranks)
    if cores < 1 or ranks < 1:
        die("cores and ranks must be positive")
    share = cores / ranks
    text = open(src).read()

    def scale(key, text, factor, fmt):
        pat = re.compile(r"(\b%s\s*=\s*)([0-9.eE+-]+)" % key)
        if not pat.search(text):
            die("%s: no %s = NUMBER to scale" % (src, key))
        return pat.sub(lambda m: m.group(1) + fmt % (float(m.group(2)) * factor), text, count=1)

    # keys at the start of a line: `source` quotes some of them ("devices_per_node = 2.")
    m = re.search(r"^\s*devices_per_node\s*=\s*([0-9]+)", text, re.M)
    if not m:
        die("%s: no devices_per_node" % src)
    if int(m.group(1)) != cores:
        die("%s has devices_per_node = %s, expected one device per core (%d)"
            % (src, m.group(1), cores))
    text = re.sub(r"^(\s*devices_per_node\s*=\s*)[0-9]+", r"\g<1>%d" % ranks, text, count=1,
                  flags=re.M)
    text = scale("memory_gb", text, share, "%.3f")
    text = scale("memory_bandwidth_gbs", text, share, "%.3f")
    text = scale("fp32", text, share, "%.6f")
    # elementwise kernels' times per element (if any) grow as the core's share shrinks
    em = re.search(r"\belementwise_ns\s*=\s*\{[^}]*\}", text)
    if em:
        block = re.sub(r"[0-9][0-9.eE+-]*",
                       lambda m: "%.4f" % (float(m.group(0)) / share), em.group(0))
        text = text[:em.start()] + block + text[em.end():]
    note = ("%d ranks time-sharing %d cores: a variant of %s written by "
            "bench/scaling/scaling.py timeshare, with devices_per_node = %d, each "
            "device's fp32 peak, memory bandwidth and memory scaled by %d/%d and its "
            "elementwise times per element by %d/%d. " %
            (ranks, cores, src, ranks, cores, ranks, ranks, cores))
    text = re.sub(r'(\bsource\s*=\s*)"', lambda m: m.group(1) + '"' + note, text, count=1)
    text = re.sub(r'(\bname\s*=\s*")', r"\g<1>%d ranks on %d cores: " % (ranks, cores), text,
                  count=1)
    open(out, "w").write(text)


# ---------------------------------------------------------------- measured


def metrics(path, skip):
    """Medians over steps >= skip of step_ms, tp_comm_ms, dp_wait_ms and bubble, the
    step count, and the last memory line."""
    keys = ("step_ms", "tp_comm_ms", "dp_wait_ms", "bubble")
    vals, mem = {k: [] for k in keys}, None
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        o = json.loads(line)
        if "step" in o and "step_ms" in o:
            if o["step"] >= skip:
                for k in keys:
                    vals[k].append(o.get(k, 0.0))
        elif "peak_rss_mb" in o:
            mem = o
    if not vals["step_ms"]:
        die("%s: no steps at or after %d" % (path, skip))
    return {k: statistics.median(v) for k, v in vals.items()}, len(vals["step_ms"]), mem


def plan(path):
    if not path or path == "-":
        return None
    with open(path) as f:
        return json.load(f)


def err(pred, meas):
    return 100.0 * (pred - meas) / meas


def measured(manifest, outdir):
    rows, one = [], {}
    with open(manifest) as f:
        for rec in csv.reader(f, delimiter="\t"):
            (label, cfg, kind, mode, ranks, grid, batch, mfile, p1, p2, others, skip) = rec
            m, n, mem = metrics(mfile, int(skip))
            ms = m["step_ms"]
            a, b = plan(p1), plan(p2)
            if int(ranks) == 1:
                one[cfg] = (ms, a["step_ms"])
            if cfg not in one:
                die("%s: the 1-rank run of %s must come first" % (manifest, cfg))
            # the prediction scaled by the 1-rank run's measured / predicted: what is
            # left is the error in how the step scales, not in the single device's speed
            cal = one[cfg][0] / one[cfg][1]
            best = b if b else a
            row = dict(config=cfg, kind=kind, mode=mode, ranks=int(ranks), grid=grid,
                       global_batch=int(batch), measured_ms=ms, steps=n,
                       predicted_ms=a["step_ms"], error_pct=err(a["step_ms"], ms),
                       pred_timeshare_ms=b["step_ms"] if b else "",
                       error_timeshare_pct=err(b["step_ms"], ms) if b else "",
                       calibrated_error_pct=err(best["step_ms"] * cal, ms),
                       tp_comm_ms=m["tp_comm_ms"], pred_tp_comm_ms=best["terms_ms"]["tp_comm"],
                       dp_wait_ms=m["dp_wait_ms"],
                       pred_dp_exposed_ms=best["terms_ms"]["dp_exposed"],
                       bubble=m["bubble"], pred_bubble=best["bubble"],
                       rss_mb=max(mem["peak_rss_mb"]) if mem else "",
                       act_mb=max(mem["activation_mb"]) if mem else "",
                       opt_mb=max(mem.get("optimizer_mb", [0])) if mem else "",
                       pred_act_mb=a["memory"]["activations"] / 2**20,
                       pred_opt_mb=a["memory"]["optimizer"] / 2**20,
                       pred_mem_mb=a["memory_bytes"] / 2**20,
                       others_pct=int(others), label=label)
            rows.append(row)
    keys = list(rows[0].keys())
    with open(outdir + "/measured.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("%.3f" % v if isinstance(v, float) else v) for k, v in r.items()})

    def f1(v, fmt="%.1f"):
        return fmt % v if v != "" else "-"

    with open(outdir + "/measured.md", "w") as f:
        f.write("| config | mode | kind | ranks | grid pp x dp x tp | global batch | "
                "measured ms | predicted ms | error | time-shared prediction ms | error | "
                "error after 1-rank calibration | tp comm ms meas / pred | dp wait ms meas / "
                "pred exposed | bubble meas / pred | activations MB meas / pred | "
                "optimizer MB meas / pred | peak RSS MB | others' CPU |\n")
        f.write("|" + "---|" * 19 + "\n")
        for r in rows:
            f.write("| %s | %s | %s | %d | %s | %d | %.1f | %.1f | %+.0f%% | %s | %s | %+.0f%% "
                    "| %.1f / %.1f | %.1f / %.1f | %.2f / %.2f | %s / %.1f | %s / %.1f | %s "
                    "| %d%% |\n" % (
                        r["config"], r["mode"], r["kind"], r["ranks"], r["grid"],
                        r["global_batch"], r["measured_ms"], r["predicted_ms"],
                        r["error_pct"], f1(r["pred_timeshare_ms"]),
                        f1(r["error_timeshare_pct"], "%+.0f%%"), r["calibrated_error_pct"],
                        r["tp_comm_ms"], r["pred_tp_comm_ms"], r["dp_wait_ms"],
                        r["pred_dp_exposed_ms"], r["bubble"], r["pred_bubble"],
                        f1(r["act_mb"]), r["pred_act_mb"], f1(r["opt_mb"]), r["pred_opt_mb"],
                        f1(r["rss_mb"], "%.0f"), r["others_pct"]))
    # gnuplot: one file per (config, mode), one block per kind (index 0 dp, 1 pp, 2 tp);
    # the 1-rank run belongs to every kind's curve
    for cfg in sorted({r["config"] for r in rows}):
        for mode in ("strong", "weak"):
            with open("%s/here_%s_%s.dat" % (outdir, cfg, mode), "w") as f:
                for kind in ("dp", "pp", "tp"):
                    f.write("# %s %s %s: ranks measured_ms predicted_ms timeshare_ms\n"
                            % (cfg, mode, kind))
                    sel = [r for r in rows if r["config"] == cfg and r["mode"] == mode
                           and (r["kind"] == kind or r["ranks"] == 1)]
                    for r in sorted(sel, key=lambda r: r["ranks"]):
                        ts = r["pred_timeshare_ms"]
                        f.write("%d %.3f %.3f %s\n" % (r["ranks"], r["measured_ms"],
                                                       r["predicted_ms"],
                                                       "%.3f" % ts if ts != "" else "NaN"))
                    f.write("\n\n")


# ---------------------------------------------------------------- curves


def curves(manifest, outdir):
    rows, order, clusters = [], [], {}
    names = {"gpt3": "GPT-3", "llama3": "Llama 3"}
    with open(manifest) as f:
        for fields in csv.reader(f, delimiter="\t"):
            tag, cluster, model, gpus, path, errpath = fields[:6]
            family = fields[6] if len(fields) > 6 else "gpt3"
            if (family, model) not in order:
                order.append((family, model))
            clusters[cluster] = tag
            row = dict(cluster=cluster, family=family, model=model, gpus=int(gpus),
                       label="%s %s" % (names.get(family, family), model))
            try:
                s = json.load(open(path))
                b = s["best"]
                row.update(step_ms=b["step_ms"], mfu=b["mfu"], bubble=b["bubble"],
                           mem_gb=b["memory_bytes"] / 1e9, tokens_per_s=b["tokens_per_s"],
                           pp=b["pp"], dp=b["dp"], cp=b.get("cp", 1), tp=b["tp"],
                           v=b["v"], sp=int(bool(b.get("sequence_parallel"))),
                           schedule=b["schedule"], micro_batch=b["micro_batch"],
                           recompute=b["recompute"], zero=b["zero"],
                           search_s=s["seconds"], note="")
            except (OSError, ValueError, KeyError):
                msg = open(errpath).read().strip().replace("tessera: error: ", "")
                row.update(note=msg or "no result")
            rows.append(row)
    keys = ["cluster", "family", "model", "gpus", "step_ms", "mfu", "bubble", "mem_gb",
            "tokens_per_s", "pp", "dp", "cp", "tp", "v", "schedule", "micro_batch",
            "recompute", "zero", "sp", "search_s", "note"]
    with open(outdir + "/curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("%.4g" % r[k] if isinstance(r.get(k), float) else r.get(k, ""))
                        for k in keys})
    with open(outdir + "/curves.md", "w") as f:
        for cl in clusters:
            f.write("\n%s (configs/clusters/%s.cfg)\n\n" % (cl, clusters[cl]))
            f.write("| model | GPUs | step s | MFU | bubble | GB/device | pp x dp x cp x tp | "
                    "schedule (v) | mb | recompute | zero | sp |\n")
            f.write("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                if r["cluster"] != cl:
                    continue
                if "step_ms" not in r:
                    f.write("| %s | %d | - | - | - | - | %s | | | | | |\n"
                            % (r["label"], r["gpus"], short(r["note"])))
                    continue
                f.write("| %s | %d | %.3g | %.1f%% | %.3f | %.1f | %d x %d x %d x %d | %s (%d) | "
                        "%d | %s | %d | %s |\n" % (
                            r["label"], r["gpus"], r["step_ms"] / 1e3, 100 * r["mfu"],
                            r["bubble"], r["mem_gb"], r["pp"], r["dp"], r["cp"], r["tp"],
                            r["schedule"], r["v"], r["micro_batch"], r["recompute"],
                            r["zero"], "on" if r["sp"] else "off"))
    # one TSV per cluster (bench/scaling.sh copies the DGX H100's to docs/scaling_gpt3.tsv,
    # the numbers behind the plots, which tests/test_docs_drift.sh replans in part)
    tsv = ["family", "model", "gpus", "step_ms", "mfu", "bubble", "mem_gb", "pp", "dp", "cp",
           "tp", "v", "schedule", "micro_batch", "recompute", "zero", "sp"]
    for cl, tag in clusters.items():
        with open("%s/curves_%s.tsv" % (outdir, tag), "w") as f:
            f.write("\t".join(tsv) + "\n")
            for r in rows:
                if r["cluster"] != cl:
                    continue
                if "step_ms" not in r:  # no grid fits: the rest of the row is "-"
                    f.write("\t".join([r["family"], r["model"], str(r["gpus"])]
                                      + ["-"] * (len(tsv) - 3)) + "\n")
                    continue
                f.write("\t".join(("%.6g" % r[k]) if isinstance(r[k], float) else str(r[k])
                                  for k in tsv) + "\n")
    for cl, tag in clusters.items():
        for family in sorted({fam for fam, _ in order}):
            with open("%s/%s_%s.dat" % (outdir, family, tag), "w") as f:
                for fam, m in order:
                    if fam != family:
                        continue
                    f.write("# %s %s on %s: gpus step_s mfu_pct bubble mem_gb pp dp tp\n"
                            % (names.get(fam, fam), m, cl))
                    for r in rows:
                        if (r["cluster"] == cl and r["family"] == fam and r["model"] == m
                                and "step_ms" in r):
                            f.write("%d %.4f %.2f %.4f %.2f %d %d %d\n" % (
                                r["gpus"], r["step_ms"] / 1e3, 100 * r["mfu"], r["bubble"],
                                r["mem_gb"], r["pp"], r["dp"], r["tp"]))
                    f.write("\n\n")


def short(note):
    m = re.search(r"at least (\d+)", note)
    return "no grid fits (needs >= %s GPUs)" % m.group(1) if m else note[:60]


def main():
    if len(sys.argv) < 2:
        die("usage: scaling.py timeshare|measured|curves ...")
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "timeshare" and len(args) == 4:
        timeshare(*args)
    elif cmd == "measured" and len(args) == 2:
        measured(*args)
    elif cmd == "curves" and len(args) == 2:
        curves(*args)
    else:
        die("bad arguments for %s (see the docstring)" % cmd)


if __name__ == "__main__":
    main()
