# Shared helpers for the command-line tests (sourced). Each test is run by CTest as
#   bash tests/test_X.sh TESSERA_BINARY SOURCE_DIR
set -uo pipefail
TESSERA="$1"
SRC="$2"
TMP="$(mktemp -d)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Every test's ranks share one machine: Open MPI's ob1 point-to-point layer over shared
# memory (vader), unless the caller chose. Left to itself, Open MPI 4.1 starts UCX, whose
# probing of the machine's transports took 200 of the 340 ms of a 2-rank MPI_Init here;
# the release suite's ~480 training runs each start 1 to 8 ranks. The collectives
# (coll/tuned), and so every reduction's order and every number, are the same over
# either (the sweeps' snapshots are bit-identical: docs/CI.md).
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}" OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"

# Cases. Every check is one case that passes (pass) or fails (fail); the helpers below
# (expect_error, check, train_on, compare_runs, ...) each count theirs. A case this
# machine cannot run is skipped, saying why (skip_case); a test that can run none of its
# cases exits 77 (skip_test), which CTest reports as skipped (SKIP_RETURN_CODE), never as
# passed. finish ends every test: it fails a test in which no case ran.
PASSED=0
FAILED=0
SKIPPED=0
FINISHED=0

# grep_q ARGS...: `grep -q` for the reading end of a pipe. Under pipefail, grep -q's
# exit at its first match can kill the writer with SIGPIPE (ldd, tr of /proc/PID/environ,
# ls, --help), and the pipeline then fails although the line was there: seen under load
# (an ASan build taken for a release one, a rank's process not found). grep_q reads all
# of its input. tests/test_test_scripts.sh refuses `| grep -q` in tests/.
grep_q() { grep "$@" >/dev/null; }
# asan_build: whether $TESSERA is an AddressSanitizer build (its address space and
# resident memory are not a release build's: ulimit -v and RSS cases skip there).
asan_build() { ldd "$TESSERA" 2>/dev/null | grep_q libasan; }

# Waiting ranks sleep (docs/CI.md): Open MPI's ranks wait for messages by polling, and
# 2 tests of 2-8 ranks each share CI's 2 cores, so a rank that waits kept the rank it
# waited for off its core. mpi_yield_when_idle makes an idle poll call sched_yield(), and
# tests/yield_sleep.c (libts_yield_sleep.so, built next to tessera), preloaded into the
# test's processes, makes that a ~50 us sleep (nothing else there calls it on CPU runs).
# The ranks compute the same, every reduction keeps its order (coll/tuned): the same
# bits. Unless the caller set either variable. (Open MPI's mca_base_env_list would reach
# the ranks alone, but mpirun refuses it beside -x.) An ASan build's runtime must come
# first among the libraries unless told otherwise: the preloaded library only sleeps.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
YIELD_SLEEP="$(dirname "$TESSERA")/tests/libts_yield_sleep.so"
if [ -z "${LD_PRELOAD+set}" ] && [ -f "$YIELD_SLEEP" ]; then
  if asan_build; then export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"; fi
  export LD_PRELOAD="$YIELD_SLEEP"
fi

pass() { PASSED=$((PASSED + 1)); }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*" >&2; }
# skip_case WHAT: a case that cannot run here (no tmpfs mount, one GPU), said on stdout.
skip_case() { SKIPPED=$((SKIPPED + 1)); echo "SKIPPED: $*"; }
# skip_test WHY: nothing of this test can run here: exit 77 (skipped) now.
skip_test() { echo "SKIP: $*"; FINISHED=1; exit 77; }

# at_exit COMMAND: run COMMAND (eval'd) when the test exits, before $TMP is removed (a
# test's own EXIT trap would replace lib.sh's). A test that exits 0 without finish
# (an early `exit 0`) fails: its cases were never counted.
AT_EXIT=()
at_exit() { AT_EXIT+=("$1"); }
lib_exit() {
  local rc=$? c
  for c in "${AT_EXIT[@]}"; do eval "$c"; done
  snapshot_runs
  rm -rf "$TMP"
  if [ "$rc" -eq 0 ] && [ "$FINISHED" -ne 1 ]; then
    echo "FAIL: the test exited 0 without finish (no case was counted)" >&2
    exit 1
  fi
  exit "$rc"
}
trap lib_exit EXIT

# snapshot_runs: with TS_TEST_SNAPSHOT set to a folder, keep what every run of this test
# computed (each metrics file's losses, gradient norms and validation losses, and the
# sha256 of each saved model) under FOLDER/TEST/, so that two builds' whole-suite runs can
# be compared bit for bit (scripts/compare_snapshots.sh): how a refactoring shows it
# changed no grid's numbers. Off (unset) in CI.
snapshot_runs() {
  [ -n "${TS_TEST_SNAPSHOT:-}" ] || return 0
  local dir f rel
  # The CTest copies of a script (_strict, _dry) run other step counts than the script's
  # own test: each keeps its runs under its own name (TS_TEST_SNAPSHOT_NAME).
  dir="$TS_TEST_SNAPSHOT/${TS_TEST_SNAPSHOT_NAME:-$(basename "$0" .sh)}"
  mkdir -p "$dir"
  while IFS= read -r f; do
    rel="${f#"$TMP"/}"
    mkdir -p "$dir/$(dirname "$rel")"
    grep -o '"\(loss\|grad_norm\|val_loss\)":[^,}]*' "$f" >"$dir/$rel.numbers" 2>/dev/null || true
  done < <(find "$TMP" -name '*.jsonl' -type f 2>/dev/null)
  while IFS= read -r f; do
    rel="${f#"$TMP"/}"
    mkdir -p "$dir/$(dirname "$rel")"
    sha256sum <"$f" | cut -d' ' -f1 >"$dir/$rel.sha256"
  done < <(find "$TMP" -name 'model.safetensors' -type f 2>/dev/null)
}

# release_only WHAT: under the sanitizers (TS_TEST_SANITIZERS=1, tests/CMakeLists.txt)
# say that WHAT is left to the release build and return 0; elsewhere return 1. For the
# cases that can find no memory error their neighbours do not: a rerun of a run that
# already ran there (the same code on the same shapes; its bit-for-bit comparison is a
# property of the numbers, which the release build checks). Usage:
#   release_only "the rerun" || { check again ...; cmp ...; }
# The strict copies (TS_TEST_DEVICE set) leave them to their default copy likewise: a
# host access to device memory faults in the first run, on the same code and shapes.
release_only() {
  if [ "${TS_TEST_SANITIZERS:-0}" = 1 ]; then
    skip_case "$1 (the release build runs it; under the sanitizers it repeats a run above)"
    return 0
  fi
  if [ -n "${TS_TEST_DEVICE:-}" ]; then
    skip_case "$1 (the default copy runs it; on $TS_TEST_DEVICE it repeats a run above)"
    return 0
  fi
  return 1
}

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

# FAIL_FAST COMMAND...: COMMAND with mpirun ending a failed job at once. Once a rank exits
# non-zero, Open MPI 4.1's mpirun ends the job's processes with SIGCONT, a 1 s wait,
# SIGTERM, another 1 s wait and SIGKILL, and it waits even when every process has already
# exited (the kills find none): 2 s of idle time per failing run, about 2 minutes of CI's.
# For a run that must fail by itself (expect_error) the grace period protects nothing: a
# rank that fails reaches MPI_Finalize, which waits for every rank, after its message,
# and one that crashes or hangs is what the judge looks for, not what the grace period
# spares. Runs whose ranks must get time to handle mpirun's SIGTERM (test_ckpt_preempt,
# test_watchdog) keep the default.
FAIL_FAST() { OMPI_MCA_odls_base_sigkill_timeout=0 "$@"; }

# run_one ARGS...: tessera as one process, without mpirun (its exit status is tessera's
# own), killed after 120 s; output and DEVICE_SETS as run_np.
run_one() {
  local extra=()
  if [ "${1:-}" = train ]; then extra=("${DEVICE_SETS[@]}"); fi
  timeout 120 "$TESSERA" "$@" "${extra[@]}" >"$TMP/out" 2>"$TMP/err"
}

# The signs of a crash where an error was due: a signal, an abort, a sanitizer's report,
# a failed internal check ("tessera: internal error at FILE:LINE").
CRASH_RE='Segmentation|Aborted|core dumped|AddressSanitizer|runtime error|internal error'

# judge_error [OPTIONS] WHAT RC PATTERN: one case, a run that must fail (named WHAT in
# the messages), judged from its exit status RC and its stderr ($TMP/err): it exited
# non-zero, not by a timeout (124, or 137 when killed) or a signal (125 and up: timeout
# itself, a command that could not run, 128 + a signal), printed PATTERN (a grep -E
# regex) exactly once, and did not crash (CRASH_RE). For runs a test launches itself
# (through a wrapper, in the background, with stdout elsewhere); expect_error runs
# tessera and calls it. Returns 0 when the case passed, 1 when it failed. OPTIONS:
#   --rc N        the exit status is exactly N
#   --quiet       nothing on stdout ($TMP/out)
#   --one-error   stderr holds exactly one "tessera: error:" line
#   --only-line   the message is stderr's only line
#   --stderr FILE judge FILE instead of $TMP/err
judge_error() {
  local want_rc="" quiet=0 one_error=0 only_line=0 err="$TMP/err"
  while [ $# -gt 0 ]; do
    case "$1" in
      --rc) want_rc="$2"; shift 2 ;;
      --quiet) quiet=1; shift ;;
      --one-error) one_error=1; shift ;;
      --only-line) only_line=1; shift ;;
      --stderr) err="$2"; shift 2 ;;
      --*) echo "lib.sh: judge_error: unknown option '$1'" >&2; exit 2 ;;
      *) break ;;
    esac
  done
  local what="$1" rc="$2" pattern="$3" count
  if [ "$rc" -eq 0 ]; then fail "expected failure ($pattern): $what"; return 1; fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "timed out (hang?), exit status $rc: $what"; sed 's/^/    /' "$err" >&2; return 1
  fi
  if [ "$rc" -ge 125 ]; then
    fail "exit status $rc (a signal, or it could not run), not an error exit: $what"
    sed 's/^/    /' "$err" >&2; return 1
  fi
  if grep -qE -- "$CRASH_RE" "$err"; then
    fail "crashed: $what"; sed 's/^/    /' "$err" >&2; return 1
  fi
  count=$(grep -cE -- "$pattern" "$err" || true)
  if [ "$count" -ne 1 ]; then
    fail "expected '$pattern' once in stderr, found $count times: $what"
    sed 's/^/    /' "$err" >&2; return 1
  fi
  if [ -n "$want_rc" ] && [ "$rc" -ne "$want_rc" ]; then
    fail "exit status $rc, expected $want_rc: $what"; sed 's/^/    /' "$err" >&2; return 1
  fi
  if [ "$quiet" = 1 ] && [ -s "$TMP/out" ]; then
    fail "printed on stdout: $what"; sed 's/^/    /' "$TMP/out" >&2; return 1
  fi
  if [ "$one_error" = 1 ] && [ "$(grep -c 'tessera: error:' "$err")" -ne 1 ]; then
    fail "expected one 'tessera: error:' line in stderr: $what"; sed 's/^/    /' "$err" >&2; return 1
  fi
  if [ "$only_line" = 1 ] && [ "$(wc -l < "$err")" -ne 1 ]; then
    fail "expected the message alone in stderr: $what"; sed 's/^/    /' "$err" >&2; return 1
  fi
  pass
}

# expect_error [OPTIONS] NP PATTERN ARGS...: tessera ARGS fails on NP ranks (under
# mpirun, every rank exiting non-zero), or with NP = 0 as one process without mpirun
# (run_one: its exit status is tessera's own, its stdout its own), as judge_error decides
# with OPTIONS (--rc N, --quiet, --one-error, --only-line): non-zero, within run_np's
# time limit, PATTERN (grep -E) printed exactly once, no crash. Returns 0 when it passed.
expect_error() {
  local opts=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --rc) opts+=("$1" "$2"); shift 2 ;;
      --stderr) opts+=("$1" "$2"); shift 2 ;;
      --*) opts+=("$1"); shift ;;
      *) break ;;
    esac
  done
  local np="$1" pattern="$2" rc; shift 2
  if [ "$np" -eq 0 ]; then run_one "$@"; else FAIL_FAST run_np "$np" "$@"; fi
  rc=$?
  judge_error "${opts[@]}" "tessera $*" "$rc" "$pattern"
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

# loss_at FILE STEP: the "loss" of step STEP's line of a metrics file.
loss_at() {
  grep "\"step\":$2," "$1" | grep -o '"loss":[^,]*' | head -n 1 | cut -d: -f2
}

# finish: the counts (and how many cases were skipped: skip_case, gpu_skip,
# gpu_has_nccl); the test's exit status: 1 when a case failed or none ran, 77 (skipped)
# when every case was skipped, else 0.
finish() {
  FINISHED=1
  echo "$PASSED passed, $FAILED failed$([ "$SKIPPED" -gt 0 ] && echo ", $SKIPPED skipped")"
  [ "$FAILED" -eq 0 ] || return 1
  if [ "$PASSED" -eq 0 ]; then
    if [ "$SKIPPED" -gt 0 ]; then echo "SKIP: every case of this test was skipped"; return 77; fi
    echo "FAIL: no checks ran: the test counted no case (pass, fail or a helper)" >&2
    return 1
  fi
  return 0
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
# (the one-rank run; $CHECK_REF instead when set) to relative 1e-4.
check() {
  local name="$1" np="$2"; shift 2
  # Under the sanitizers and in the strict copies (TS_TEST_MAX_RANKS=4) a grid of more
  # ranks is the release build's: its axes run there in pairs on 2-4 ranks, the same
  # code and collectives on smaller groups, and 8 sanitized processes on 2 cores cost
  # what four smaller grids do (docs/CI.md).
  if [ "$np" -gt "${TS_TEST_MAX_RANKS:-1000}" ]; then
    skip_case "$name on $np ranks (the release build runs it; here grids of at most ${TS_TEST_MAX_RANKS} ranks)"
    return 0
  fi
  if run_np "$np" "${common[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
    if [ "$name" != ref ]; then
      if out=$(same_losses "$TMP/$name.jsonl" "${CHECK_REF:-$TMP/ref.jsonl}" 1e-4); then pass
      else fail "$name vs one rank: $out"; fi
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
    77) skip_test "no CUDA device (set TS_GPU_TEST_DEVICE=cpu-strict for a dry run on the CPU)" ;;
    *) echo "FAIL: $probe exited $rc" >&2; exit 1 ;;
  esac
}

# gpu_skip WHAT: a part of a GPU test that this dry run cannot check, said on stdout.
gpu_skip() {
  skip_case "(dry run on train.device = \"$GPU_DEVICE\"): $*"
}

# grid PP DP TP: the --set flags of that parallel grid.
grid() { echo --set parallel.pp="$1" --set parallel.dp="$2" --set parallel.tp="$3"; }

# run_base NAME NP ARGS...: tessera "${base[@]}" (the caller's array) ARGS on NP ranks
# with metrics in $TMP/NAME.jsonl; passes, or fails the test (with its stderr) and
# returns 1.
run_base() {
  local name="$1" np="$2"; shift 2
  if run_np "$np" "${base[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then pass; return 0; fi
  fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2; return 1
}

# same_files A B WHAT FILES...: one case, each of FILES is the same bytes in directories
# A and B. same_ckpt A B WHAT: so are the model and optimizer files of two step directories.
same_files() {
  local a="$1" b="$2" what="$3" f ok=1; shift 3
  for f in "$@"; do cmp -s "$a/$f" "$b/$f" || { ok=0; fail "$what: $f differs ($a vs $b)"; }; done
  [ "$ok" = 1 ] && pass
}
same_ckpt() { same_files "$1" "$2" "$3" model.safetensors optimizer.safetensors; }

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
  if grep -qE -- "$CRASH_RE" "$TMP/err"; then
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
    skip_case "this tessera was built without NCCL"; return 1
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
# GPU_STEPS is that 20; a dry run with TS_TEST_SWEEP_STEPS set (CTest's _dry copies: 4)
# trains that many instead: it checks the script and that host code never touches device
# memory (cpu-strict faults at the first touch), which the first steps meet.
gpu_common() {
  make_corpus "$TMP/train.bin"
  GPU_STEPS=20
  if [ "${GPU_DRY:-0}" = 1 ] && [ -n "${TS_TEST_SWEEP_STEPS:-}" ]; then GPU_STEPS=$TS_TEST_SWEEP_STEPS; fi
  common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$GPU_STEPS" --set train.lr=3e-4
          --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set train.threads=1
          --set log.progress=false)
}

# ---- the PyTorch references (tests/torch_gpt2.py, tests/torch_llama.py) ----------------
# require_torch: PY is /usr/bin/python3, the interpreter with Debian's torch (or
# $TS_TEST_TORCH_PYTHON: a PyTorch 2 venv's, scripts/peer_venv.sh); the test is skipped
# (77) when it cannot import torch. CI has no torch: run these where one is.
require_torch() {
  PY="${TS_TEST_TORCH_PYTHON:-/usr/bin/python3}"
  if ! [ -x "$PY" ] || ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    skip_test "$PY cannot import torch"
  fi
}

# torch_loss OUT STEP: the float32 loss a reference's `loss` printed for STEP in file OUT
# ("step S loss_f32 X loss_f64 Y").
torch_loss() {
  awk -v s="$2" '$1 == "step" && $2 == s { print $4 }' "$1"
}

# torch_replay_loss OUT STEP: the float64 loss of step STEP of a reference's --replay
# ("replay step S loss_f64 X").
torch_replay_loss() {
  awk -v s="$2" '$1 == "replay" && $3 == s { print $5 }' "$1"
}

# close_to_torch WHAT GOT WANT: one case, GOT (Tessera's loss) within relative
# $TORCH_TOL (default 1e-5) of WANT (torch's); prints the difference.
close_to_torch() {
  local what="$1" got="$2" want="$3" tol="${TORCH_TOL:-1e-5}"
  if [ -z "$got" ] || [ -z "$want" ]; then fail "$what: missing loss (got '$got', torch '$want')"; return; fi
  if awk -v a="$got" -v b="$want" -v tol="$tol" -v what="$what" 'BEGIN {
         d = a - b; if (d < 0) d = -d; r = d / (b < 0 ? -b : b)
         printf "%s: tessera %s torch %s relative difference %.3g\n", what, a, b, r
         exit !(r <= tol) }'; then pass
  else fail "$what: loss differs from torch by more than $tol"; fi
}

# torch_replay_ckpt WHAT STEP_DIR INIT K METRICS ARGS...: the reference $REF (run by $PY)
# loads STEP_DIR's model.safetensors (strict), checks its optimizer.safetensors's names
# and shapes, replays K steps with torch.optim.AdamW from INIT and compares the moments
# (ARGS: the shape, --data, --batch, --step and the hyperparameters; its output in
# $TMP/torch_b.out, printed); then one case per replayed step: Tessera's loss of that
# step in METRICS within $TORCH_TOL of torch's.
torch_replay_ckpt() {
  local what="$1" step_dir="$2" init="$3" k="$4" metrics="$5" s; shift 5
  if "$PY" "$REF" loss "$step_dir/model.safetensors" --optimizer "$step_dir/optimizer.safetensors" \
      --replay "$init" --replay-steps "$k" "$@" >"$TMP/torch_b.out" 2>&1; then
    pass
  else
    fail "torch could not load $step_dir, or its optimizer state is not torch's"
  fi
  sed 's/^/    /' "$TMP/torch_b.out"
  for ((s = 0; s < k; s++)); do
    close_to_torch "$what step $s vs torch's AdamW" "$(loss_at "$metrics" $s)" \
      "$(torch_replay_loss "$TMP/torch_b.out" $s)"
  done
}

# expect_step_files DIR: one case per file a checkpoint step directory holds
# (model.safetensors, optimizer.safetensors, state.json), each there and not empty.
expect_step_files() {
  local f
  for f in model.safetensors optimizer.safetensors state.json; do
    if [ -s "$1/$f" ]; then pass; else fail "no $1/$f"; ls -la "$(dirname "$1")" "$1" >&2; fi
  done
}

# mtp_same NAME [LINES [KEY]]: multi-token prediction's depth losses (the metrics' KEY,
# default "mtp_loss"; "val_mtp_loss" the validation's; two depths) of $TMP/NAME.jsonl
# against the one-rank run's ($CHECK_REF, else $TMP/ref.jsonl), relative 1e-4 on each
# of LINES (default 4) lines.
mtp_same() {
  local out ref="${CHECK_REF:-$TMP/ref.jsonl}" lines="${2:-4}" key="${3:-mtp_loss}"
  out=$(paste <(grep -o "\"$key\":\\[[^]]*\\]" "$ref" | sed 's/.*\[//; s/\]//') \
              <(grep -o "\"$key\":\\[[^]]*\\]" "$TMP/$1.jsonl" | sed 's/.*\[//; s/\]//') | awk -v lines="$lines" '
    { n = split($1, a, ","); m = split($2, b, ","); if (n != 2 || m != 2) bad = 1
      for (i = 1; i <= n; i++) { d = a[i] - b[i]; if (d < 0) d = -d; r = d / a[i]; if (r > w) w = r } }
    END { printf "%d lines: worst relative depth-loss difference %.3g\n", NR, w
          exit !(!bad && NR == lines && w <= 1e-4) }')
  if [ $? -eq 0 ]; then pass; else fail "$1's $key vs one rank: $out"; fi
}
