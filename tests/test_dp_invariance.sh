# Grid invariance for data parallelism: dp = 1, 2, 4 and several micro-batch splits of
# the same global batch give the one-rank losses within relative 1e-4 for 16 steps (8
# for the runs that change only the work inside a step, below); the same multi-rank run
# twice is bit-identical.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 16 steps; 4 under the sanitizers (TS_TEST_SWEEP_STEPS, tests/CMakeLists.txt).
steps=${TS_TEST_SWEEP_STEPS:-16}
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)

check ref 1 --set parallel.micro_batch=4
# check_short NAME NP SETS...: check with $short steps, against the reference's first
# $short steps: for the runs that change only how a step's work is split or synchronised
# (the micro-batch count, the reduction without overlap or in 1 MiB buckets), on a layout
# whose 16 steps are checked here (one rank, dp 2, dp 4): every step runs that whole step
# again, so 8 steps check it as 16 do. The communication thread's runs, which a race
# could upset in any step, and the rerun keep 16. The 16 steps are all warm-up, whose
# learning rate does not depend on train.steps: an 8-step run's steps are the 16-step
# run's first 8, bit for bit.
short=$((steps < 8 ? steps : 8))
grep '"loss"' "$TMP/ref.jsonl" | head -n "$short" >"$TMP/ref_short.jsonl"
check_short() { CHECK_REF="$TMP/ref_short.jsonl" check "$@" --set "train.steps=$short"; }
check_short dp1_mb16 1 --set parallel.micro_batch=16
check_short dp1_mb1 1 --set parallel.micro_batch=1
check dp2_mb4 2 --set parallel.dp=2 --set parallel.micro_batch=4
check_short dp2_mb8 2 --set parallel.dp=2 --set parallel.micro_batch=8
check_short dp2_mb2 2 --set parallel.dp=2 --set parallel.micro_batch=2
check dp4_mb4 4 --set parallel.dp=4 --set parallel.micro_batch=4
check_short dp4_mb1 4 --set parallel.dp=4 --set parallel.micro_batch=1
check_short dp2_nooverlap 2 --set parallel.dp=2 --set parallel.overlap_grad_sync=false
check_short dp2_bucket1 2 --set parallel.dp=2 --set parallel.bucket_mb=1

release_only "dp=2 run twice, bit for bit" || {
  check dp2_mb4_again 2 --set parallel.dp=2 --set parallel.micro_batch=4
  if cmp -s <(losses "$TMP/dp2_mb4.jsonl") <(losses "$TMP/dp2_mb4_again.jsonl"); then pass
  else fail "dp=2 run twice is not bit-identical"; fi
}
# The reduction driven by a communication thread instead of polling: the same calls in
# the same order, so the same bits, with and without ZeRO-1, and under pp x dp with a
# trace (the thread's spans reach the trace through the main thread).
check dp2_mb4_thread 2 --set parallel.dp=2 --set parallel.micro_batch=4 \
  --set parallel.grad_sync_progress=thread
if cmp -s <(losses "$TMP/dp2_mb4.jsonl") <(losses "$TMP/dp2_mb4_thread.jsonl"); then pass
else fail "dp=2: the communication thread changed the losses"; fi
check dp2_zero_poll 2 --set parallel.dp=2 --set parallel.zero=1
check dp2_zero_thread 2 --set parallel.dp=2 --set parallel.zero=1 --set parallel.grad_sync_progress=thread
if cmp -s <(losses "$TMP/dp2_zero_poll.jsonl") <(losses "$TMP/dp2_zero_thread.jsonl"); then pass
else fail "dp=2 ZeRO-1: the communication thread changed the losses"; fi
check pp2dp2_thread 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=2 \
  --set parallel.grad_sync_progress=thread --set "log.trace=\"$TMP/thread_trace.json\""
grep -q '"all-reduce"' "$TMP/thread_trace.json" && pass || fail "no dp reduction spans in the thread-mode trace"
# dp_overlap depends on timing: check only that it is reported as a fraction.
grep -o '"dp_overlap":[^,]*' "$TMP/dp2_mb4.jsonl" | cut -d: -f2 \
  | awk -v steps="$steps" '{ if ($1 < 0 || $1 > 1) bad = 1; n++ } END { exit !(n == steps && !bad) }' \
  && pass || fail "dp_overlap missing or outside [0, 1]"
finish
