#!/usr/bin/env bash
# The planner numbers the docs quote against today's planner (issue 37): README's
# `tessera plan ... --search` example, the data behind docs/scaling_gpt3_*.svg
# (docs/scaling_gpt3.tsv, written by bench/scaling.sh) and the MoE rows of bench/RESULTS.md
# 4.7 (docs/planner_moe.tsv, written by bench/planner_moe.py). The searches themselves take
# minutes on CI's 2 cores, so the README's top rows and every row of the plots' table are
# replanned as single grids (the search simulates its top rows with the same model: the
# same numbers), and only a few small models' searches are rerun (the grid they pick). Fails naming the row, the number
# that moved and the command that regenerates the docs.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip_test "needs python3"
[ -f "$SRC/docs/scaling_gpt3.tsv" ] || { fail "docs/scaling_gpt3.tsv is missing"; finish; exit; }

out=$(python3 - "$TESSERA" "$SRC" <<'EOF'
import json, os, re, subprocess, sys
tessera, src = os.path.abspath(sys.argv[1]), sys.argv[2]
H = "configs/clusters/dgx-h100.cfg"
TOL = 2e-3  # relative: the docs print 3-4 significant digits
bad = []

def plan(*args):
    p = subprocess.run([tessera, "plan", *args, "--json"], cwd=src, capture_output=True,
                       text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
    return json.loads(p.stdout), ""

def near(a, b, tol=TOL):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)

# 1. README: the rows of the --search example, each replanned as one grid
readme = open(src + "/README.md").read()
m = re.search(r"\$ build/tessera plan (configs/gpt3-175b\.cfg) --cluster (\S+) --gpus (\d+) "
              r"--search --top \d+\n(.*?)\n```", readme, re.S)
rows = 0
if not m:
    bad.append("README: the gpt3-175b --search example was not found")
else:
    cfg, cluster, gpus, body = m.groups()
    head = next((l.split() for l in body.splitlines() if l.startswith("rank ")), None)
    for line in body.splitlines():
        f = line.split()
        if not head or len(f) != len(head) or not f[0].isdigit():
            continue
        r = dict(zip(head, f))
        sets = []
        for k, key in (("pp", "pp"), ("dp", "dp"), ("tp", "tp"), ("cp", "cp"),
                       ("v", "virtual_stages"), ("mb", "micro_batch"), ("zero", "zero")):
            sets += ["--set", "parallel.%s=%s" % (key, r[k])]
        sets += ["--set", 'parallel.schedule="%s"' % r["schedule"],
                 "--set", 'parallel.recompute="%s"' % r["rc"],
                 "--set", "parallel.sequence_parallel=%s" % ("true" if r["sp"] == "on" else "false")]
        d, err = plan(cfg, "--cluster", cluster, *sets)
        rows += 1
        what = "README search row %s (%s)" % (r["rank"], " ".join(f[1:12]))
        if d is None:
            bad.append("%s: %s" % (what, err)); continue
        for key, got in (("mem_GB", d["memory_bytes"] / 1e9), ("step_ms", d["step_ms"]),
                         ("MFU", 100 * d["mfu"]), ("bubble", d["bubble"])):
            want = float(r[key].rstrip("%"))
            if not near(want, got, 5e-3 if key == "bubble" else TOL):
                bad.append("%s: %s %s in README, %.4f today" % (what, key, r[key], got))
    if rows == 0:
        bad.append("README: no rows under the --search example's header")

# 2. docs/scaling_gpt3.tsv: every row's grid replanned as one grid (its numbers), and the
# small models' searches at a few counts (the grid the search picks)
SEARCHED = {("125M", "8"), ("125M", "64"), ("125M", "512"), ("350M", "8"), ("350M", "64"),
            ("1.3B", "8"), ("1.3B", "1024")}
KEYS = ("pp", "dp", "cp", "tp", "v", "schedule", "micro_batch", "recompute", "zero", "sp")
lines = open(src + "/docs/scaling_gpt3.tsv").read().splitlines()
cols = lines[0].split("\t")
checked = searched = 0
for line in lines[1:]:
    r = dict(zip(cols, line.split("\t")))
    cfg = "configs/%s-%s.cfg" % (r["family"], r["model"].lower())
    what = "docs/scaling_gpt3.tsv %s %s on %s GPUs" % (r["family"], r["model"], r["gpus"])
    search = r["family"] == "gpt3" and (r["model"], r["gpus"]) in SEARCHED
    if search:
        searched += 1
        d, err = plan(cfg, "--cluster", H, "--gpus", r["gpus"], "--search", "--top", "1")
        if d is None:
            if r["step_ms"] != "-":
                bad.append("%s: no grid today (%s)" % (what, err))
            continue
        if r["step_ms"] == "-":
            bad.append("%s: a grid today, none in the file" % what); continue
        b = d["best"]
        b["sp"] = int(bool(b["sequence_parallel"]))
        grid, want = [str(b[k]) for k in KEYS], [r[k] for k in KEYS]
        if grid != want:
            bad.append("%s: grid %s in the file, %s today" % (what, " ".join(want),
                                                               " ".join(grid)))
            continue
    elif r["step_ms"] == "-":
        continue
    else:
        sets = []
        for k, key in (("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("tp", "tp"),
                       ("v", "virtual_stages"), ("micro_batch", "micro_batch"),
                       ("zero", "zero")):
            sets += ["--set", "parallel.%s=%s" % (key, r[k])]
        sets += ["--set", 'parallel.schedule="%s"' % r["schedule"],
                 "--set", 'parallel.recompute="%s"' % r["recompute"],
                 "--set", "parallel.sequence_parallel=%s" % ("true" if r["sp"] == "1" else "false")]
        b, err = plan(cfg, "--cluster", H, *sets)
        if b is None:
            bad.append("%s: its grid fails today (%s)" % (what, err)); continue
        if not b["fits"]:
            bad.append("%s: its grid no longer fits" % what)
    checked += 1
    for key, got in (("step_ms", b["step_ms"]), ("mfu", b["mfu"]),
                     ("mem_gb", b["memory_bytes"] / 1e9), ("bubble", b["bubble"])):
        if not near(float(r[key]), got, 1e-3 if key != "bubble" else 5e-3):
            bad.append("%s: %s %s in the file, %.6g today" % (what, key, r[key], got))
if searched == 0:
    bad.append("docs/scaling_gpt3.tsv: none of the rows this test searches")
# 3. docs/planner_moe.tsv (bench/RESULTS.md 4.7, 4.8): the MoE rows against the published ones,
# each replanned with its own --set list on its cluster file (column "cluster")
moe_rows = 0
lines = open(src + "/docs/planner_moe.tsv").read().splitlines()
cols = lines[0].split("\t")
for line in lines[1:]:
    r = dict(zip(cols, line.split("\t")))
    sets = []
    for s in r["sets"].split(";") if r["sets"] else []:
        sets += ["--set", s]
    d, err = plan(r["config"], "--cluster", r.get("cluster") or H, *sets)
    what = "docs/planner_moe.tsv %s" % r["row"]
    moe_rows += 1
    if d is None:
        bad.append("%s: fails today (%s)" % (what, err)); continue
    for key, got in (("step_ms", d["step_ms"]), ("mfu", d["mfu"]),
                     ("mem_gb", d["memory_bytes"] / 1e9), ("a2a_share", d["moe"]["a2a_share"])):
        if not near(float(r[key]), got, 1e-3 if key != "a2a_share" else 5e-3):
            bad.append("%s: %s %s in the file, %.6g today" % (what, key, r[key], got))
    if int(r["fits"]) != int(d["fits"]):
        bad.append("%s: fits %s in the file, %s today" % (what, r["fits"], d["fits"]))
if moe_rows == 0:
    bad.append("docs/planner_moe.tsv: no rows")
print("README search rows %d; docs/scaling_gpt3.tsv: %d rows replanned, %d of them searched; "
      "docs/planner_moe.tsv: %d MoE rows" % (rows, checked, searched, moe_rows))
for b in bad:
    print("DRIFT: " + b)
EOF
)
prc=$?
echo "$out"
if [ "$prc" -ne 0 ] || [ -z "$out" ]; then
  fail "the drift check failed to run (exit $prc)"
elif grep -q '^DRIFT' <<<"$out"; then
  fail "the docs quote planner numbers today's planner no longer gives; regenerate:
  MEASURE=0 CLUSTERS=dgx-h100 bench/scaling.sh   (docs/scaling_gpt3.tsv and the plots)
  build/tessera plan configs/gpt3-175b.cfg --cluster configs/clusters/dgx-h100.cfg --gpus 1024 --search --top 5   (README)
  bench/planner_moe.py > docs/planner_moe.tsv   (bench/RESULTS.md 4.7)
and rerun the commands of bench/RESULTS.md section 4"
else
  pass
fi
finish
