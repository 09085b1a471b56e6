#!/usr/bin/env bash
# parallel.recompute = "auto" end to end on the tiny config (2 steps per run). The
# budget (parallel.memory_budget_mb) is computed here from `tessera plan --json`'s
# estimates of the same grid under recompute none and full, halfway between the most
# "full" needs on any rank and the least "none" needs where it does not fit:
#   pp 2, 1f1b: none is refused with the memory error, full fits, auto fits recomputing
#     only part (rank 0 all its micro-batches, rank 1 none), as plan shows per chunk and
#     the trainer logs; auto's and full's losses equal recompute none's without a budget
#     bit for bit (a recomputation replays the same forward); the trainer's activation_mb
#     per rank is within 5% of plan's activation_sets for the rank under auto;
#   pp 1, gpipe (all 4 micro-batches in flight): auto keeps some of one chunk's
#     micro-batches and recomputes the rest, the same three checks;
#   pp 1, 1f1b (one set in flight, nothing to recompute away) under a budget below
#     "full": auto is refused, saying even recomputing every micro-batch does not fit;
#   auto choosing selective per chunk (a chunk first drops attention's state, then its
#     cap comes down): pp 2 under a budget between "selective" and "none" (rank 0's
#     chunk goes selective and keeps every set, rank 1's stays as it was) and tp 2 gpipe
#     under one between "full" and "selective" (selective, then the cap: recomputed
#     micro-batches replay selective too). Each: the trainer names the selective chunks
#     in its log line, its losses equal the one-rank run's within 1e-4 (and the same
#     grid's recompute none bit for bit: selective recompute reruns the same kernel),
#     and its activation_mb per rank is plan's activation_sets under auto within 2%
#     and falls from recompute none's by what plan's estimates say within 2%.
# The grids' auto cases above go selective too (plan's line does not name it yet:
# compared without the word).
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
base=(train "$SRC/configs/tiny.cfg" --set train.steps=2 --set "data.train=\"$TMP/train.bin\""
      --set 'data.val=""' --set train.threads=1 --set log.progress=false)

# plan_json NAME SETS...: tessera plan --json of the tiny config into $TMP/NAME.json
# (uniform costs: the cut from the FLOP model, passed on to the trainer).
plan_json() {
  local name="$1"; shift
  "$TESSERA" plan "$SRC/configs/tiny.cfg" --cost uniform --set train.threads=1 "$@" --json \
    >"$TMP/$name.json" 2>"$TMP/err" && pass || { fail "plan $name: $*"; sed 's/^/    /' "$TMP/err" >&2; }
}

# budget_mb NONE FULL: whole MiB halfway between the most "full" needs on any rank (so
# full fits everywhere) and the most "none" needs (so none does not), needs being the
# estimates less their BLAS buffers; fails when full leaves no room below none.
budget_mb() {
  python3 - "$TMP/$1.json" "$TMP/$2.json" <<'PY'
import json, sys
need = lambda p: [r["memory_bytes"] - r["memory"]["blas"] for r in p["ranks"]]
none, full = (need(json.load(open(f))) for f in sys.argv[1:3])
lo, hi = max(full), max(none)
mb = int((lo + hi) / 2 / 1048576)
if not lo < mb * 1048576 < hi:
    sys.exit("no whole MiB between %d and %d bytes" % (lo, hi))
print(mb)
PY
}

# partition NAME: the plan's cut as a config list (the trainer cuts the same layers).
partition() {
  python3 -c 'import json, sys; print("[" + ",".join(map(str, json.load(open(sys.argv[1]))["partition"])) + "]")' "$TMP/$1.json"
}

# check_auto NAME NP PLAN_JSON: the auto run's activation_mb per rank within 5% of the
# plan's activation_sets of its pipeline rank, and it recomputes only part (0 < total
# recomputed micro-batch passes < all; WITHIN=1: also inside one chunk, 0 < r < m).
check_auto() {
  python3 - "$TMP/$1.jsonl" "$TMP/$3.json" "${WITHIN:-0}" <<'PY' && pass || fail "$1: auto's memory or choice is off"
import json, sys
last = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
plan = json.load(open(sys.argv[2]))
m, bad = plan["microbatches"], 0
for r, got in enumerate(last["activation_mb"]):
    want = plan["ranks"][r]["memory"]["activation_sets"] / 1048576.0
    ok = abs(got - want) <= 0.05 * want
    print("  rank %d: activation_mb %.1f, estimate %.2f MiB%s" % (r, got, want, "" if ok else "  <-- MISS"))
    bad += not ok
chunks = [c for q in plan["ranks"] for c in q["recompute"]]
total = sum(c["recomputed"] for c in chunks)
print("  recomputed", [(c["chunk"], c["keep"], c["in_flight"], c["recomputed"]) for c in chunks])
if not 0 < total < m * len(chunks): bad += 1; print("  recomputes all or nothing")
if sys.argv[3] == "1" and not any(0 < c["recomputed"] < m for c in chunks):
    bad += 1; print("  no chunk recomputes only part of its micro-batches")
sys.exit(bad)
PY
}

# same_as NAME REF: NAME's losses are REF's bit for bit.
same_as() {
  if [ -n "$(losses "$TMP/$2.jsonl")" ] && cmp -s <(losses "$TMP/$1.jsonl") <(losses "$TMP/$2.jsonl"); then pass
  else fail "$1: losses differ from $2's"; paste <(losses "$TMP/$1.jsonl") <(losses "$TMP/$2.jsonl") >&2; fi
}

# grid_case NAME NP SETS...: the whole check of one grid (see the top).
grid_case() {
  local name="$1" np="$2"; shift 2
  plan_json "${name}_none" "$@" --set parallel.recompute=none
  plan_json "${name}_full" "$@" --set parallel.recompute=full
  local mb part
  mb=$(budget_mb "${name}_none" "${name}_full") || { fail "$name: no budget between full and none"; return; }
  part=$(partition "${name}_none")
  echo "$name: parallel.memory_budget_mb = $mb, partition $part"
  local g=("$@" --set "parallel.partition=$part")
  plan_json "${name}_auto" "${g[@]}" --set parallel.recompute=auto --set parallel.memory_budget_mb="$mb"
  run_base "${name}_ref" "$np" "${g[@]}" || return
  expect_error "$np" "not enough memory: pipeline rank [0-9]+ needs .* over parallel.memory_budget_mb = $mb" \
    "${base[@]}" "${g[@]}" --set parallel.memory_budget_mb="$mb"
  run_base "${name}_full" "$np" "${g[@]}" --set parallel.recompute=full --set parallel.memory_budget_mb="$mb" &&
    same_as "${name}_full" "${name}_ref"
  # progress on: the start-up lines, the choice among them, go to stderr.
  run_base "${name}_auto" "$np" "${g[@]}" --set parallel.recompute=auto \
    --set parallel.memory_budget_mb="$mb" --set log.progress=true || return
  same_as "${name}_auto" "${name}_ref"
  check_auto "${name}_auto" "$np" "${name}_auto"
  grep -Eq "recompute auto: pipeline rank 0: chunk 0 keeps [0-9]* of [0-9]* in flight(, selective)? \(recomputes" "$TMP/err" && pass ||
    fail "$name: the trainer did not log its choice"
  same_plan_line "$name" "${g[@]}" --set parallel.memory_budget_mb="$mb"
}

# same_plan_line NAME SETS...: plan's text under recompute auto shows the same caps and
# selective chunks as the trainer logged in $TMP/err.
same_plan_line() {
  local name="$1"; shift
  "$TESSERA" plan "$SRC/configs/tiny.cfg" --cost uniform --set train.threads=1 "$@" \
    --set parallel.recompute=auto >"$TMP/plan.txt" 2>&1
  if cmp -s <(grep -o 'chunk [0-9]* keeps.*' "$TMP/plan.txt") \
            <(grep -o 'chunk [0-9]* keeps.*' "$TMP/err"); then pass
  else fail "$name: plan's choice differs from the trainer's"; grep -h keeps "$TMP/plan.txt" "$TMP/err" >&2; fi
}

# The one-rank run every grid's losses are compared with (relative 1e-4).
run_base one 1 || true
grid_case pp2_1f1b 2 --set parallel.pp=2 --set parallel.schedule=1f1b
WITHIN=1 grid_case pp1_gpipe 1 --set parallel.schedule=gpipe

# pp 1, 1f1b: one set in flight, so full saves nothing; a budget below it is refused.
plan_json pp1_full --set parallel.recompute=full
mb=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["ranks"][0]; print(int((r["memory_bytes"] - r["memory"]["blas"]) / 1048576) - 1)' "$TMP/pp1_full.json")
expect_error 1 "not enough memory for parallel.recompute = \"auto\": pipeline rank 0 needs .* even recomputing every micro-batch" \
  "${base[@]}" --set parallel.recompute=auto --set parallel.memory_budget_mb="$mb"

# check_selective NAME: the auto run's activation_mb per rank within 2% of plan's
# activation_sets under auto, and its fall from recompute none's run within 2% of what
# plan's estimates (none less auto) say.
check_selective() {
  python3 - "$TMP/$1_auto.jsonl" "$TMP/$1_ref.jsonl" "$TMP/$1_auto.json" "$TMP/$1_none.json" <<'PY' && pass || fail "$1: activation_mb is not what the estimate says"
import json, sys
last = lambda f: json.loads(open(f).read().strip().splitlines()[-1])
auto, none = last(sys.argv[1])["activation_mb"], last(sys.argv[2])["activation_mb"]
plan = [[r["memory"]["activation_sets"] / 1048576.0 for r in json.load(open(f))["ranks"]]
        for f in sys.argv[3:5]]
bad = 0
for r, (a, n, pa, pn) in enumerate(zip(auto, none, *plan)):
    ok = abs(a - pa) <= 0.02 * pa and abs((n - a) - (pn - pa)) <= 0.02 * pn
    print("  rank %d: activation_mb none %.3f auto %.3f, estimate none %.3f auto %.3f%s"
          % (r, n, a, pn, pa, "" if ok else "  <-- MISS"))
    bad += not ok
sys.exit(bad)
PY
}

# selective_case NAME NP LOW SETS...: recompute auto under a budget halfway between the
# most recompute LOW (selective or full) needs on any rank and the most none needs (plan's
# estimates): the checks at the top; SELECTIVE: the log lines' pattern that must match.
selective_case() {
  local name="$1" np="$2" low="$3"; shift 3
  plan_json "${name}_none" "$@" --set parallel.recompute=none
  plan_json "${name}_low" "$@" --set parallel.recompute="$low"
  local mb part
  if [ "$low" = full ]; then plan_json "${name}_sel" "$@" --set parallel.recompute=selective
    mb=$(budget_mb "${name}_sel" "${name}_low")
  else mb=$(budget_mb "${name}_none" "${name}_low"); fi ||
    { fail "$name: no budget between $low and the next"; return; }
  part=$(partition "${name}_none")
  echo "$name: parallel.memory_budget_mb = $mb, partition $part"
  local g=("$@" --set "parallel.partition=$part" --set parallel.memory_budget_mb="$mb")
  plan_json "${name}_auto" "${g[@]}" --set parallel.recompute=auto
  run_base "${name}_ref" "$np" "$@" --set "parallel.partition=$part" || return
  run_base "${name}_auto" "$np" "${g[@]}" --set parallel.recompute=auto --set log.progress=true || return
  same_as "${name}_auto" "${name}_ref"
  if out=$(same_losses "$TMP/${name}_auto.jsonl" "$TMP/one.jsonl" 1e-4); then pass
  else fail "$name vs one rank: $out"; fi
  grep -o 'recompute auto: pipeline rank.*' "$TMP/err" | sed 's/^/  /'
  grep -Eq "$SELECTIVE" "$TMP/err" && pass || fail "$name: the log does not name the selective chunks as expected"
  check_selective "$name"
  same_plan_line "$name" "${g[@]}"
}

# pp 2: rank 0's chunk (two sets in flight) selective and keeping both, rank 1's as it was.
SELECTIVE='pipeline rank 0: chunk 0 keeps 2 of 2 in flight, selective \(recomputes 0 of' \
  selective_case sel_pp2 2 selective --set parallel.pp=2 --set parallel.schedule=1f1b
grep -q 'pipeline rank 1: chunk 1 keeps 1 of 1 in flight (recomputes 0 of' "$TMP/err" && pass ||
  fail "sel_pp2: rank 1's chunk is not as it was"
# tp 2, gpipe (four sets in flight): selective, and then its cap below the peak.
SELECTIVE='pipeline rank 0: chunk 0 keeps [0-3] of 4 in flight, selective \(recomputes [1-4] of' \
  selective_case sel_tp2 2 full --set parallel.tp=2 --set parallel.schedule=gpipe
finish
