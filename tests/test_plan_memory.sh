#!/usr/bin/env bash
# The planner's memory predictions (tessera plan --cluster --json) against the trainer's
# own accounting (the metrics' last line) for every grid of up to 4 ranks of the tiny
# config and a 12-layer one (2 steps each, the planner's cut passed to the trainer so
# both hold the same layers), plus schedule, recompute and ZeRO variants. Compared per
# rank, within 10%:
#   activation_mb  vs  ranks[pp_rank].activation_sets  (the saved sets at the peak)
#   optimizer_mb   vs  ranks[pp_rank].optimizer        (AdamW moments, 1/dp with ZeRO-1)
#   peak_rss_mb    vs  memory_bytes - workspace + B    (B: the process's own baseline,
#                  RSS less the prediction of a 1-rank run; BLAS buffers are address
#                  space the trainer reserves, not resident); within 15% when dp > 1,
#                  where MPI's shared-memory buffers and the gradient buckets add
#                  resident memory pipeline/memory.c does not count (up to ~13% here);
#                  at least 5 MiB (the baseline moves that much with the rank count)
# Usage: test_plan_memory.sh TESSERA SOURCE_DIR
source "$(dirname "$0")/lib.sh" # TESSERA, SRC, TMP, make_corpus, fail, finish
cd "$SRC" || exit 2
command -v mpirun >/dev/null || { echo "no mpirun"; exit 1; }
CL=tests/fixtures/plan_cluster_cpu.cfg
RUNS=0
# The corpus (the config's data/train.bin exists only where scripts/prepare_data.sh has run).
make_corpus "$TMP/train.bin" || { echo "FAIL: tessera data" >&2; exit 1; }
COMMON=(--set train.steps=2 --set data.eval_every=0 --set log.progress=false --set train.threads=1
        --set checkpoint.dir='""' --set "data.train=\"$TMP/train.bin\"")

# run NAME SETS...: plan, train with the plan's cut, compare; prints one line per rank.
run() {
  local name=$1; shift
  "$TESSERA" plan configs/tiny.cfg "$@" --cluster $CL --json >"$TMP/plan.json" 2>"$TMP/err" || {
    echo "  $name: not a valid grid ($(head -c 120 "$TMP/err"))"; return; }
  python3 - "$TMP/plan.json" >"$TMP/grid" <<'PY' || { fail "$name: the plan's JSON lacks the grid"; return; }
import json, sys
p = json.load(open(sys.argv[1]))
print(p["world"], p["pp"], p["dp"], p["tp"], "[" + ",".join(map(str, p["partition"])) + "]")
PY
  read -r world pp dp tp part <"$TMP/grid"
  mpirun --oversubscribe -np "$world" -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 \
    "$TESSERA" train configs/tiny.cfg "$@" "${COMMON[@]}" --set "parallel.partition=$part" \
    --set log.metrics="$TMP/m.jsonl" >"$TMP/train.log" 2>&1 || {
    fail "$name: training failed"; tail -5 "$TMP/train.log" >&2; return; }
  RUNS=$((RUNS + 1))
  python3 - "$TMP/plan.json" "$TMP/m.jsonl" "$name" "${BASE:-}" <<'PY' && pass || fail "$name: a prediction missed (<-- MISS above)"
import json, sys
plan = json.load(open(sys.argv[1]))
last = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
name, base = sys.argv[3], sys.argv[4]
MiB = 1048576.0
tpdp = plan["tp"] * plan["dp"]
bad = 0
def close(a, b):  # within 10%, or both within the metric's 0.1 MiB rounding
    return abs(a - b) <= max(0.1 * max(a, b), 0.06)
for r in range(plan["world"]):
    q = plan["ranks"][r // tpdp]
    act, opt = q["activation_sets"] / MiB, q["optimizer"] / MiB
    res = (q["memory_bytes"] - plan["memory"]["workspace"]) / MiB
    ok = close(act, last["activation_mb"][r]) and close(opt, last["optimizer_mb"][r])
    rss = ""
    if base:
        want = res + float(base)
        rss = " rss %.1f/%.1f" % (want, last["peak_rss_mb"][r])
        # dp > 1: MPI's per-peer shared-memory buffers and the gradient-sync bucket
        # copies are resident but outside pipeline/memory.c's accounting: 15% there.
        tol = 0.1 if plan["dp"] == 1 else 0.15
        # and 5 MiB at least: the baseline itself moves by a few MiB with the number of
        # ranks (MPI's transports), which decides small runs of the 4-layer model.
        ok = ok and abs(want - last["peak_rss_mb"][r]) <= max(tol * last["peak_rss_mb"][r], 5.0)
    print("  %-34s rank %d: activations %.2f/%.1f optimizer %.2f/%.1f%s MiB (planner/trainer)%s"
          % (name, r, act, last["activation_mb"][r], opt, last["optimizer_mb"][r], rss,
             "" if ok else "  <-- MISS"))
    bad += not ok
if plan["world"] == 1 and not base:  # the baseline run
    open(sys.argv[2] + ".base", "w").write("%.3f" % (last["peak_rss_mb"][0] - (plan["memory_bytes"] - plan["memory"]["workspace"]) / MiB))
sys.exit(1 if bad else 0)
PY
  [ -f "$TMP/m.jsonl.base" ] && [ -z "${BASE:-}" ] && BASE=$(cat "$TMP/m.jsonl.base") && echo "  baseline RSS: $BASE MiB"
}

for layers in 4 12; do
  L=(--set model.n_layer=$layers)
  BASE=""; rm -f "$TMP/m.jsonl.base"
  run "n_layer $layers 1 rank (baseline)" "${L[@]}"
  [ -n "$BASE" ] || fail "n_layer $layers: no baseline RSS (the 1-rank run failed), so no peak RSS would be checked"
  for pp in 1 2 3 4; do for dp in 1 2 3 4; do for tp in 1 2 3 4; do
    w=$((pp * dp * tp)); [ $w -le 4 ] || continue
    run "n_layer $layers pp $pp dp $dp tp $tp" "${L[@]}" --set parallel.pp=$pp --set parallel.dp=$dp --set parallel.tp=$tp
  done; done; done
  run "n_layer $layers pp2 gpipe" "${L[@]}" --set parallel.pp=2 --set parallel.schedule=gpipe
  run "n_layer $layers pp2 zb-h1" "${L[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1
  run "n_layer $layers pp2 v2 interleaved" "${L[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2 \
    --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=2
  run "n_layer $layers pp2 recompute full" "${L[@]}" --set parallel.pp=2 --set parallel.recompute=full
  run "n_layer $layers dp2 zero 1" "${L[@]}" --set parallel.dp=2 --set parallel.zero=1
  run "n_layer $layers pp2 dp2 zero 1" "${L[@]}" --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1
done
# bf16 (where the CPU has BF16 instructions): bf16 activations and compute weights
# beside fp32 master weights, by a bf16 cluster file, against the bf16 trainer.
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  CL=tests/fixtures/plan_cluster_cpu_bf16.cfg
  L=(--set model.n_layer=4 --set 'train.precision="bf16"')
  BASE=""; rm -f "$TMP/m.jsonl.base"
  run "bf16 1 rank (baseline)" "${L[@]}"
  [ -n "$BASE" ] || fail "bf16: no baseline RSS (the 1-rank run failed)"
  run "bf16 pp 2" "${L[@]}" --set parallel.pp=2
  run "bf16 dp 2 zero 1" "${L[@]}" --set parallel.dp=2 --set parallel.zero=1
  run "bf16 tp 2" "${L[@]}" --set parallel.tp=2
  run "bf16 pp2 zb-h1" "${L[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1
  run "bf16 pp2 recompute full" "${L[@]}" --set parallel.pp=2 --set parallel.recompute=full
else
  skip_case "bf16 memory: this CPU has no BF16 instructions"
fi
echo "$RUNS runs compared"
[ $RUNS -ge 20 ] || fail "only $RUNS runs"
finish
