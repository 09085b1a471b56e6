#!/usr/bin/env bash
# The planner's memory predictions (tessera plan --cluster --json) against the trainer's
# own accounting (the metrics' last line) for every grid of up to 4 ranks of a 12-layer
# tiny config, an MoE llama-tiny on one rank and ep 2 (issue 40) (2 steps each, the planner's cut passed to the trainer so both hold the
# same layers), plus schedule, recompute and ZeRO-1 variants on it and on the 4-layer
# tiny config (ZeRO-2 and 3 on the 12-layer one: their chunk buffers are in
# memory_bytes). Compared per rank,
# within 10%:
#   activation_mb  vs  ranks[pp_rank].activation_sets  (the saved sets at the peak)
#   optimizer_mb   vs  ranks[pp_rank].optimizer        (AdamW moments, 1/dp with ZeRO-1)
#   peak_rss_mb    vs  memory_bytes - workspace + B    (B: the process's own baseline,
#                  RSS less the prediction of a 1-rank run; BLAS buffers are address
#                  space the trainer reserves, not resident); within 15% when dp > 1,
#                  where MPI's shared-memory buffers and the gradient buckets add
#                  resident memory pipeline/memory.c does not count (up to ~13% here);
#                  at least 5 MiB (the baseline moves that much with the rank count)
#   estimate_mb vs  the largest peak_rss_mb of the ranks of its pipeline rank: the
#                  trainer's own pre-flight estimate of the real peak, within 5% or 5 MiB
#                  (ZeRO-2/3 excepted: below)
# The 1-rank baseline is also the 1x1x1 grid's run (the same config: it ran twice). The
# plans are read and the runs compared by one python3 each, not one per run.
# Usage: test_plan_memory.sh TESSERA SOURCE_DIR
source "$(dirname "$0")/lib.sh" # TESSERA, SRC, TMP, make_corpus, fail, finish
cd "$SRC" || exit 2
command -v mpirun >/dev/null || { echo "no mpirun"; exit 1; }
# The corpus (the config's data/train.bin exists only where scripts/prepare_data.sh has run).
make_corpus "$TMP/train.bin" || { echo "FAIL: tessera data" >&2; exit 1; }
COMMON=(--set train.steps=2 --set data.eval_every=0 --set log.progress=false --set train.threads=1
        --set checkpoint.dir='""' --set "data.train=\"$TMP/train.bin\"")
BF16_CPU=0
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && BF16_CPU=1

# each_run FN: FN GROUP CLUSTER NAME SETS... for every run, in order. A group's first run
# is its 1-rank baseline (B above); its 1x1x1 grid is that run, so the grid loop skips it.
each_run() {
  local fn=$1 layers pp dp tp L
  for layers in 4 12; do
    L=(--set model.n_layer=$layers)
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers 1 rank (baseline)" "${L[@]}"
    # The grids on the 12-layer config only: it checks the same accounting (activation
    # sets, optimizer, RSS) on every grid, with activations large enough for the RSS
    # check, which on 4 layers (2 MiB of them) was inside its 5 MiB floor. The 4-layer
    # grids cost a third of the test; the 4-layer config keeps its schedule, recompute
    # and ZeRO-1 variants below (a stage of one layer, pp2's cut of four).
    # Three-rank grids left out (CI time, docs/CI.md): pp 3's uneven cut and dp 3's
    # third replica are the same accounting as pp 2 and 4, dp 2 and 4.
    for pp in 1 2 4; do for dp in 1 2 4; do for tp in 1 2 4; do
      [ "$layers" = 12 ] || continue
      [ $((pp * dp * tp)) -le 4 ] && [ $((pp * dp * tp)) -gt 1 ] || continue
      $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp $pp dp $dp tp $tp" "${L[@]}" \
        --set parallel.pp=$pp --set parallel.dp=$dp --set parallel.tp=$tp
    done; done; done
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 gpipe" "${L[@]}" --set parallel.pp=2 \
      --set parallel.schedule=gpipe
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 zb-h1" "${L[@]}" --set parallel.pp=2 \
      --set parallel.schedule=zb-h1
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 v2 interleaved" "${L[@]}" --set parallel.pp=2 \
      --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=2
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 recompute full" "${L[@]}" --set parallel.pp=2 \
      --set parallel.recompute=full
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers dp2 zero 1" "${L[@]}" --set parallel.dp=2 \
      --set parallel.zero=1
    $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 dp2 zero 1" "${L[@]}" --set parallel.pp=2 \
      --set parallel.dp=2 --set parallel.zero=1
    # ZeRO-2/3: the per-chunk gradient and gathered-weight buffers at their residency peak.
    if [ "$layers" = 12 ]; then
      $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers dp2 zero 2" "${L[@]}" --set parallel.dp=2 \
        --set parallel.zero=2
      $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 dp2 v2 looped-bfs zero 3" "${L[@]}" \
        --set parallel.pp=2 --set parallel.dp=2 --set parallel.virtual_stages=2 \
        --set parallel.schedule=looped-bfs --set parallel.micro_batch=2 --set parallel.zero=3
      $fn "$layers" plan_cluster_cpu.cfg "n_layer $layers pp2 dp2 1f1b zero 3" "${L[@]}" \
        --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3
    fi
  done
  # Mixture of Experts (issue 40): the llama-tiny MoE of test_moe_grids on one rank and on
  # ep 2 folded over dp 2 (the rank's 4 of 8 experts, edp 1, the worst-case exchange
  # buffers); etp and more expert grids: test_plan_model's exact comparison.
  L=(--set model.moe_experts=8 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64
     --set model.moe_shared_experts=1 --set model.moe_first_dense=1)
  $fn moe plan_cluster_cpu.cfg "moe 1 rank (baseline)" "${L[@]}"
  $fn moe plan_cluster_cpu.cfg "moe dp2 ep2" "${L[@]}" --set parallel.dp=2 --set parallel.ep=2
  # bf16 (where the CPU has BF16 instructions): bf16 activations and compute weights
  # beside fp32 master weights, by a bf16 cluster file, against the bf16 trainer.
  if [ "$BF16_CPU" = 1 ]; then
    L=(--set model.n_layer=4 --set 'train.precision="bf16"')
    local cl=plan_cluster_cpu_bf16.cfg
    $fn bf16 $cl "bf16 1 rank (baseline)" "${L[@]}"
    $fn bf16 $cl "bf16 pp 2" "${L[@]}" --set parallel.pp=2
    $fn bf16 $cl "bf16 dp 2 zero 1" "${L[@]}" --set parallel.dp=2 --set parallel.zero=1
    $fn bf16 $cl "bf16 tp 2" "${L[@]}" --set parallel.tp=2
    $fn bf16 $cl "bf16 pp2 zb-h1" "${L[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1
    $fn bf16 $cl "bf16 pp2 recompute full" "${L[@]}" --set parallel.pp=2 --set parallel.recompute=full
  fi
}

# 1. Every run's plan (run I's in $TMP/plan_I.json; an invalid grid is said and left out),
#    then one python3 for all their grids ($TMP/grid_I: world pp dp tp [partition]).
#    (A python3 per run cost more than the 2-step trainings' start-ups.)
I=0
plan_one() {
  local group=$1 cl=$2 name=$3; shift 3
  local i=$((I++)) cfg=configs/tiny.cfg
  [ "$group" = moe ] && cfg=configs/llama-tiny.cfg
  if "$TESSERA" plan "$cfg" "$@" --cluster "tests/fixtures/$cl" --json >"$TMP/plan_$i.json" \
       2>"$TMP/err"; then
    printf '%s\t%s\t%s\n' "$i" "$group" "$name" >>"$TMP/runs.tsv"
  else
    echo "  $name: not a valid grid ($(head -c 120 "$TMP/err"))"; rm -f "$TMP/plan_$i.json"
  fi
}
: >"$TMP/runs.tsv"
each_run plan_one
python3 - "$TMP" <<'PY' || fail "the plans' JSON lacks the grid"
import json, os, sys
tmp = sys.argv[1]
for line in open(os.path.join(tmp, "runs.tsv")):
    i = line.split("\t")[0]
    p = json.load(open(os.path.join(tmp, "plan_%s.json" % i)))
    with open(os.path.join(tmp, "grid_%s" % i), "w") as f:
        print(p["world"], p["pp"], p["dp"], p["tp"], "[" + ",".join(map(str, p["partition"])) + "]", file=f)
PY

# 2. Every valid grid trained with the plan's cut (metrics in $TMP/m_I.jsonl).
I=0
train_one() {
  local group=$1 cl=$2 name=$3; shift 3
  local i=$((I++)) world pp dp tp part cfg=configs/tiny.cfg
  [ "$group" = moe ] && cfg=configs/llama-tiny.cfg
  [ -f "$TMP/grid_$i" ] || return 0
  read -r world pp dp tp part <"$TMP/grid_$i"
  mpirun --oversubscribe -np "$world" -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 \
    "$TESSERA" train "$cfg" "$@" "${COMMON[@]}" --set "parallel.partition=$part" \
    --set log.metrics="$TMP/m_$i.jsonl" >"$TMP/train.log" 2>&1 || {
    fail "$name: training failed"; tail -5 "$TMP/train.log" >&2; rm -f "$TMP/m_$i.jsonl"; }
}
each_run train_one

# 3. One python3 compares them all, in order; prints one line per rank, then per run
#    "RESULT ok|MISS NAME" and per group without a baseline "NOBASE GROUP".
python3 - "$TMP" >"$TMP/results" <<'PY' || fail "the comparison did not run"
import json, os, sys
tmp = sys.argv[1]
MiB = 1048576.0
def close(a, b):  # within 10%, or both within the metric's 0.1 MiB rounding
    return abs(a - b) <= max(0.1 * max(a, b), 0.06)
base, seen = {}, set()
for line in open(os.path.join(tmp, "runs.tsv")):
    i, group, name = line.rstrip("\n").split("\t")
    first = group not in seen
    seen.add(group)
    metrics = os.path.join(tmp, "m_%s.jsonl" % i)
    if not os.path.exists(metrics):
        continue  # training failed: already a failure
    plan = json.load(open(os.path.join(tmp, "plan_%s.json" % i)))
    last = json.loads(open(metrics).read().strip().splitlines()[-1])
    tpdp = plan["tp"] * plan["dp"]
    bad = 0
    for r in range(plan["world"]):
        q = plan["ranks"][r // tpdp]
        act, opt = q["activation_sets"] / MiB, q["optimizer"] / MiB
        res = (q["memory_bytes"] - plan["memory"]["workspace"]) / MiB
        ok = close(act, last["activation_mb"][r]) and close(opt, last["optimizer_mb"][r])
        rss = ""
        if group in base:
            want = res + base[group]
            rss = " rss %.1f/%.1f" % (want, last["peak_rss_mb"][r])
            # dp > 1: MPI's per-peer shared-memory buffers and the gradient-sync bucket
            # copies are resident but outside pipeline/memory.c's accounting: 15% there.
            tol = 0.1 if plan["dp"] == 1 else 0.15
            # and 5 MiB at least: the baseline itself moves by a few MiB with the number of
            # ranks (MPI's transports), which decides small runs of the 4-layer model.
            ok = ok and abs(want - last["peak_rss_mb"][r]) <= max(tol * last["peak_rss_mb"][r], 5.0)
        # The trainer's own pre-flight estimate against the real peak (issue 37): the
        # estimate is its pipeline rank's most (Open MPI keeps a reduction's root copy on
        # the replica group's first rank only), so against the largest peak of the ranks
        # of that pipeline rank; within 5%, or 5 MiB for these 20-100 MiB processes
        # (Open MPI's per-peer shared-memory segments and OpenBLAS's touched buffers are
        # a few MiB nothing models). ZeRO-2/3: the per-chunk reduce-scatters' root copies,
        # which Open MPI keeps for small chunks (11 MiB at 10 MiB chunks here) and not for
        # large ones (none at 475 MiB, RESULTS 4.1), are not modelled: not held to it.
        est = last["estimate_mb"][r]
        q0 = (r // tpdp) * tpdp
        peak = max(last["peak_rss_mb"][q0:q0 + tpdp])
        ok_est = plan.get("zero", 0) >= 2 and plan["dp"] > 1 or abs(est - peak) <= max(0.05 * peak, 5.0)
        ok = ok and ok_est
        print("  %-34s rank %d: activations %.2f/%.1f optimizer %.2f/%.1f%s MiB (planner/trainer)"
              " estimate %.1f/%.1f MiB (trainer/its pipeline rank's peak)%s"
              % (name, r, act, last["activation_mb"][r], opt, last["optimizer_mb"][r], rss,
                 est, peak, "" if ok else "  <-- MISS"))
        bad += not ok
    print("RESULT %s %s" % ("MISS" if bad else "ok", name))
    if first and plan["world"] == 1:  # the group's baseline run
        base[group] = last["peak_rss_mb"][0] - res
        print("  baseline RSS: %.3f MiB" % base[group])
for group in sorted(seen - set(base)):
    print("NOBASE %s" % group)
PY
grep -v '^RESULT \|^NOBASE ' "$TMP/results"
RUNS=0
while read -r tag result name; do
  if [ "$tag" = NOBASE ]; then
    fail "$result: no baseline RSS (the 1-rank run failed), so no peak RSS would be checked"
    continue
  fi
  RUNS=$((RUNS + 1))
  [ "$result" = ok ] && pass || fail "$name: a prediction missed (<-- MISS above)"
done < <(grep '^RESULT \|^NOBASE ' "$TMP/results")
[ "$BF16_CPU" = 1 ] || skip_case "bf16 memory: this CPU has no BF16 instructions"
echo "$RUNS runs compared"
[ $RUNS -ge 20 ] || fail "only $RUNS runs"
finish
