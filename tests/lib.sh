# Shared helpers for the command-line tests (sourced). Each test is run by CTest as
#   bash tests/test_X.sh TESSERA_BINARY SOURCE_DIR
set -uo pipefail
TESSERA="$1"
SRC="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*" >&2; }

# The strict device mode (CTest label "strict"): TS_TEST_DEVICE names the compute
# backend every training run of the test uses (train.device), e.g. "cpu-strict", whose
# device memory faults when host code touches it. Empty: the config's own ("cpu").
DEVICE_SETS=()
if [ -n "${TS_TEST_DEVICE:-}" ]; then DEVICE_SETS=(--set "train.device=\"$TS_TEST_DEVICE\""); fi

# run_np N ARGS...: tessera under mpirun with N ranks (oversubscribed, one BLAS thread
# per rank unless the test says otherwise). Output goes to $TMP/out, $TMP/err. A
# training run (ARGS start with "train") gets DEVICE_SETS last.
run_np() {
  local np="$1"; shift
  local extra=()
  if [ "${1:-}" = train ]; then extra=("${DEVICE_SETS[@]}"); fi
  timeout 120 mpirun --oversubscribe -np "$np" "$TESSERA" "$@" "${extra[@]}" >"$TMP/out" 2>"$TMP/err"
}

# expect_error NP PATTERN ARGS...: the run fails on every rank (non-zero exit), prints
# PATTERN (a grep -E regex) exactly once, and does not crash.
expect_error() {
  local np="$1" pattern="$2"; shift 2
  if run_np "$np" "$@"; then
    fail "expected failure ($pattern): tessera $*"
    return
  fi
  local rc=$?
  if [ "$rc" -eq 124 ]; then fail "timed out (hang?): tessera $*"; return; fi
  local count
  count=$(grep -cE -- "$pattern" "$TMP/err" || true)
  if [ "$count" -ne 1 ]; then
    fail "expected '$pattern' once in stderr, found $count times: tessera $*"
    sed 's/^/    /' "$TMP/err" >&2
    return
  fi
  if grep -qE "Segmentation|Aborted|core dumped|AddressSanitizer|runtime error" "$TMP/err"; then
    fail "crashed: tessera $*"
    sed 's/^/    /' "$TMP/err" >&2
    return
  fi
  pass
}

# A small byte-level corpus for tests: Debian's fortunes texts (installed by setup).
make_corpus() {
  local out="$1"
  cat /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature > "$TMP/corpus.txt"
  "$TESSERA" data "$TMP/corpus.txt" "$out" >/dev/null
}

# losses FILE: the "loss" of every step line of a metrics file, one per line.
losses() {
  grep -o '"loss":[^,]*' "$1" | cut -d: -f2
}

# finish: the counts (and, in a GPU test, how many parts were skipped: gpu_skip,
# gpu_has_nccl); the test's exit status, 0 when nothing failed.
finish() {
  echo "$PASSED passed, $FAILED failed$([ "${GPU_SKIPPED:-0}" -gt 0 ] && echo ", parts skipped: $GPU_SKIPPED")"
  [ "$FAILED" -eq 0 ]
}

# norms FILE: the "grad_norm" of every step line of a metrics file, one per line.
norms() {
  grep -o '"grad_norm":[^,]*' "$1" | cut -d: -f2
}

# same_losses A B TOL: close_runs with TOL for both the loss and the gradient norm (the
# same steps in both files, every one within relative TOL). Silent on success; on failure
# prints close_runs' worst differences (callers put them in their fail message).
same_losses() {
  local out
  if out=$(close_runs "$1" "$2" "$3" "$3"); then return 0; fi
  echo "$out"
  return 1
}

# check NAME NP SETS...: run "${common[@]}" (the caller's array) on NP ranks with
# metrics to $TMP/NAME.jsonl; unless NAME is "ref", compare with $TMP/ref.jsonl
# (the one-rank run) to relative 1e-4.
check() {
  local name="$1" np="$2"; shift 2
  if run_np "$np" "${common[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
    if [ "$name" != ref ]; then
      if out=$(same_losses "$TMP/$name.jsonl" "$TMP/ref.jsonl" 1e-4); then pass; else fail "$name vs one rank: $out"; fi
    fi
  else
    fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2
  fi
}

# ---- The GPU tests (tests/test_gpu_*.sh, CTest label "gpu") ----------------------------
# gpu_setup: the device those tests train on, in GPU_DEVICE. "cuda" where
# tests/gpu_present (built next to tessera) finds a CUDA device; with TS_GPU_TEST_DEVICE
# set, that device instead, a dry run on the CPU (e.g. "cpu-strict", whose memory the
# host cannot touch: the same staging paths a GPU takes), where GPU_DRY = 1 and the parts
# that need a real GPU (bf16, NCCL) are skipped, each with a line saying so (gpu_skip).
# Neither: exit 77, skipped. Each run names its own device, so TS_TEST_DEVICE is ignored.
gpu_setup() {
  DEVICE_SETS=()
  GPU_SKIPPED=0
  if [ -n "${TS_GPU_TEST_DEVICE:-}" ]; then
    GPU_DEVICE="$TS_GPU_TEST_DEVICE"
    GPU_DRY=1
    [ "$GPU_DEVICE" = cuda ] && GPU_DRY=0
    echo "TS_GPU_TEST_DEVICE: training on train.device = \"$GPU_DEVICE\"$([ "$GPU_DRY" = 1 ] && echo ' (a dry run)')"
    return 0
  fi
  local probe rc
  probe="$(dirname "$TESSERA")/tests/gpu_present"
  if [ ! -x "$probe" ]; then
    echo "FAIL: $probe is not built (tests/CMakeLists.txt builds it next to tessera)" >&2
    exit 1
  fi
  "$probe"
  rc=$?
  case "$rc" in
    0) GPU_DEVICE=cuda; GPU_DRY=0 ;;
    77) echo "SKIP: no CUDA device (set TS_GPU_TEST_DEVICE=cpu-strict for a dry run on the CPU)"; exit 77 ;;
    *) echo "FAIL: $probe exited $rc" >&2; exit 1 ;;
  esac
}

# gpu_skip WHAT: a part of a GPU test that this dry run cannot check, said on stdout.
gpu_skip() {
  GPU_SKIPPED=$((GPU_SKIPPED + 1))
  echo "SKIPPED (dry run on train.device = \"$GPU_DEVICE\"): $*"
}

# train_on NAME NP DEVICE SETS...: "${common[@]}" (the caller's array) on NP ranks with
# train.device = DEVICE and metrics in $TMP/NAME.jsonl; passes, or fails the test with
# its stderr (and returns 1).
train_on() {
  local name="$1" np="$2" dev="$3"; shift 3
  if run_np "$np" "${common[@]}" --set "train.device=\"$dev\"" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass; return 0
  fi
  fail "run $name ($np ranks, train.device = \"$dev\"): $*"; sed 's/^/    /' "$TMP/err" >&2
  return 1
}

# close_runs A B LOSS_TOL NORM_TOL: metrics files A and B have the same steps (the same
# number of step lines, and the same step numbers), every step's loss within relative
# LOSS_TOL and grad_norm within relative NORM_TOL ("-": not compared). Prints the worst
# differences (on success too: a GPU log shows how close it came).
close_runs() {
  local a="$1" b="$2" lt="$3" nt="$4"
  paste <(grep -o '"step":[0-9]*,"loss"' "$a" | tr -dc '0-9\n') <(grep -o '"step":[0-9]*,"loss"' "$b" | tr -dc '0-9\n') \
        <(losses "$a") <(losses "$b") <(norms "$a") <(norms "$b") | awk -v lt="$lt" -v nt="$nt" '
    NF != 6 || $1 != $2 { bad = 1; next }
    function rel(x, y,   d) { d = x - y; if (d < 0) d = -d; if (y < 0) y = -y; return d / (y > 1e-30 ? y : 1e-30) }
    { r = rel($3, $4); if (r > wl) { wl = r; sl = $1 } r = rel($5, $6); if (r > wn) { wn = r; sn = $1 } n++ }
    END {
      printf "%d steps: worst relative loss difference %.3g (step %d), grad_norm %.3g (step %d)%s\n", n, wl, sl, wn, sn, bad ? "; the step lines differ" : ""
      exit !(!bad && n > 0 && wl <= lt && (nt == "-" || wn <= nt))
    }'
}

# compare_runs NAME A B LOSS_TOL NORM_TOL: close_runs as one pass or fail, named NAME.
compare_runs() {
  local name="$1" out; shift
  if out=$(close_runs "$@"); then pass; echo "$name: $out"; else fail "$name: $out"; fi
}

# expect_fail_every_rank NP PATTERN ARGS...: tessera ARGS on NP ranks fails on every
# rank by itself (each rank's own exit status is non-zero: mpirun is told not to kill the
# others when one fails), within 90 s (no hang), printing PATTERN (grep -iE) at least once
# and at most once per rank, without a crash.
expect_fail_every_rank() {
  local np="$1" pattern="$2"; shift 2
  rm -f "$TMP"/rank_rc.*
  # shellcheck disable=SC2016 # expanded by each rank's shell
  TS_RC_DIR="$TMP" OMPI_MCA_orte_abort_on_non_zero_status=0 timeout 90 mpirun --oversubscribe -np "$np" \
    bash -c '"$@"; r=$?; echo "$r" > "$TS_RC_DIR/rank_rc.${OMPI_COMM_WORLD_RANK:-x}"; exit "$r"' \
    rank "$TESSERA" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? r bad=0 count
  if [ "$rc" -eq 124 ]; then fail "timed out after 90 s (hang?): tessera $*"; return; fi
  for ((r = 0; r < np; r++)); do
    if [ ! -f "$TMP/rank_rc.$r" ]; then bad=1; echo "    rank $r: no exit status (killed?)" >&2
    elif [ "$(cat "$TMP/rank_rc.$r")" = 0 ]; then bad=1; echo "    rank $r: exit 0" >&2; fi
  done
  count=$(grep -ciE -- "$pattern" "$TMP/err" || true)
  if [ "$bad" = 1 ]; then fail "not every rank failed: tessera $*"; sed 's/^/    /' "$TMP/err" >&2; return; fi
  if [ "$count" -lt 1 ] || [ "$count" -gt "$np" ]; then
    fail "expected '$pattern' 1 to $np times in stderr, found $count: tessera $*"
    sed 's/^/    /' "$TMP/err" >&2; return
  fi
  if grep -qE "Segmentation|Aborted|core dumped|AddressSanitizer|runtime error" "$TMP/err"; then
    fail "crashed: tessera $*"; sed 's/^/    /' "$TMP/err" >&2; return
  fi
  pass
}

# gpu_has_nccl: this tessera takes parallel.comm = "nccl" (a CUDA build with NCCL);
# otherwise says so on stdout and returns 1 (the NCCL parts are then skipped: a build
# without NCCL is a valid build, and its refusal is test_config's to check).
gpu_has_nccl() {
  if "$TESSERA" plan "$SRC/configs/tiny.cfg" --cost uniform --set 'train.device="cuda"' \
       --set 'parallel.comm="nccl"' >/dev/null 2>"$TMP/nccl_probe"; then return 0; fi
  if grep -q "built without NCCL" "$TMP/nccl_probe"; then
    GPU_SKIPPED=$((${GPU_SKIPPED:-0} + 1))
    echo "SKIPPED: this tessera was built without NCCL"; return 1
  fi
  fail "tessera plan with parallel.comm = \"nccl\" failed"; sed 's/^/    /' "$TMP/nccl_probe" >&2
  return 1
}

# gpu_common: the corpus and the run every GPU test trains (in "${common[@]}"): the tiny
# config, 20 steps, one thread, no validation, at train.lr = 3e-4. Its 1e-3 spikes at
# step 16 (grad norm 7 -> 68), where a 1% change of lr moves that step's loss by 3.4% and
# its norm by 30%: comparisons there would measure the spike's amplification, not the
# device's arithmetic. At 3e-4 the 20 steps are smooth (the same 1% moves no loss by
# more than 0.1% and no norm by more than 0.7%) and the loss still falls by 1.0.
gpu_common() {
  make_corpus "$TMP/train.bin"
  common=(train "$SRC/configs/tiny.cfg" --set train.steps=20 --set train.lr=3e-4
          --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
          --set log.progress=false)
}
