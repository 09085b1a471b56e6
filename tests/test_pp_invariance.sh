# Grid invariance for pipeline parallelism: pp = 2 and 4 with every schedule (a CSV
# schedule included), interleaved-1f1b with v = 2, recompute modes (selective: bit for bit
# on one rank), an uneven explicit
# partition and pipeline x data parallelism all give the one-rank losses within
# relative 1e-4 for 16 steps of the tiny config (8 for the runs that change only the
# order or the shape of the work inside a step, below), with the exchange run eagerly
# (MPI) and group by group (as NCCL needs). Bad pipeline configs fail clearly.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 16 steps; 4 under the sanitizers (TS_TEST_SWEEP_STEPS, tests/CMakeLists.txt).
steps=${TS_TEST_SWEEP_STEPS:-16}
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)


check ref 1
# check_short NAME NP SETS...: check with $short steps, against the reference's first
# $short steps. For the runs that vary only the order or the shape of the work inside
# a step (the schedule, recompute, the micro-batch count, a CSV of 1F1B, the grouped
# exchange) on a layout whose 16 steps are checked above or below (pp2 and pp4 1f1b):
# every step runs that whole step again, so 8 steps check it as 16 do (as
# test_pp_schedules checks the generated schedules). The layouts (which layers and
# chunks each rank holds and updates: pp 2 and 4, interleaved v = 2 and 3, the uneven
# partitions, pp x dp), the rerun and the reference keep 16 steps. The 16 steps are all
# warm-up, whose learning rate does not depend on train.steps: an 8-step run's steps are
# the 16-step run's first 8, bit for bit.
short=$((steps < 8 ? steps : 8))
grep '"loss"' "$TMP/ref.jsonl" | head -n "$short" >"$TMP/ref_short.jsonl"
check_short() { CHECK_REF="$TMP/ref_short.jsonl" check "$@" --set "train.steps=$short"; }
check pp2_1f1b 2 --set parallel.pp=2 --set parallel.schedule=1f1b
check pp4_1f1b 4 --set parallel.pp=4 --set parallel.schedule=1f1b
for sched in gpipe zb-h1; do
  check_short "pp2_$sched" 2 --set parallel.pp=2 --set parallel.schedule="$sched"
  check_short "pp4_$sched" 4 --set parallel.pp=4 --set parallel.schedule="$sched"
done
# A CSV schedule (tests/schedules/example_1f1b_pp2.csv, 1F1B on pp 2 with 4 micro-batches)
# trains in test_pp_torch_csv: torch's 1f1b_pp2_v1_m4.csv is the same file, line for
# line, on this config against the one-rank run (6 steps; 4 under the sanitizers). Here
# it runs with the grouped exchange below, against pp2_1f1b bit for bit (docs/CI.md).
check pp2_v2_interleaved 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b
check pp2_v3_interleaved_m8 2 --set parallel.pp=2 --set parallel.virtual_stages=3 \
  --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=2
check_short pp2_recompute_full 2 --set parallel.pp=2 --set parallel.recompute=full
check_short pp4_recompute_except_last 4 --set parallel.pp=4 --set parallel.recompute=except_last
check_short pp2_zb_recompute 2 --set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.recompute=full
# Selective recompute: each block's backward reruns attention's core from the q, k, v it
# kept (the same kernel on the same input), so one rank equals recompute none bit for
# bit; the pipeline, and zero-bubble's split backward (whose I pass rebuilds it), within
# 1e-4 as every grid.
check_short pp2_selective 2 --set parallel.pp=2 --set parallel.recompute=selective
check_short pp2_zb_selective 2 --set parallel.pp=2 --set parallel.schedule=zb-h1 \
  --set parallel.recompute=selective
check_short one_selective 1 --set parallel.recompute=selective
if cmp -s <(losses "$TMP/one_selective.jsonl") <(losses "$TMP/ref_short.jsonl"); then pass
else fail "recompute = selective on one rank is not bit-identical to recompute none"; fi
check pp2_uneven 2 --set parallel.pp=2 --set "parallel.partition=[1,5]"
check pp4_uneven 4 --set parallel.pp=4 --set "parallel.partition=[2,1,2,1]"
check pp2_dp2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=2
check_short pp2_m8_more_mb 2 --set parallel.pp=2 --set parallel.micro_batch=2
check_short pp4_m2_fewer_mb 4 --set parallel.pp=4 --set parallel.micro_batch=8

# The exchange program run group by group, as a backend that matches by order and
# completes a send only when the peer receives (NCCL) needs it (TS_PP_EXCHANGE=grouped),
# gives the eager run's losses bit for bit (its first $short steps: the eager
# interleaved run has 16; the CSV's eager twin is pp2_1f1b).
export TS_PP_EXCHANGE=grouped
check_short pp2_v2_interleaved_grouped 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b
check_short pp4_zb-h1_grouped 4 --set parallel.pp=4 --set parallel.schedule=zb-h1
check_short pp2_csv_grouped 2 --set parallel.pp=2 --set "parallel.schedule=\"$SRC/tests/schedules/example_1f1b_pp2.csv\""
check_short pp2_recompute_full_grouped 2 --set parallel.pp=2 --set parallel.recompute=full
unset TS_PP_EXCHANGE
for g in pp2_v2_interleaved pp4_zb-h1 pp2_csv pp2_recompute_full; do
  # The CSV's eager twin is the built-in 1F1B, action for action the same program.
  e=$g; [ "$g" = pp2_csv ] && e=pp2_1f1b
  cmp -s <(losses "$TMP/$e.jsonl" | head -n "$short") <(losses "$TMP/${g}_grouped.jsonl") && pass ||
    fail "$g: the grouped exchange changed the losses (against $e)"
done

# The same pipeline run twice is bit-identical: pp2_csv_grouped above is pp2_1f1b's
# program again (the CSV is 1F1B action for action), and its losses are pp2_1f1b's first
# $short bit for bit, so no third run of it is needed (docs/CI.md).
grep -q '"bubble":0\.[0-9]*[1-9]' "$TMP/pp2_1f1b.jsonl" && pass || fail "no measured bubble with pp=2"

# Bad pipeline configs: one clear message, non-zero exit everywhere.
expect_error 2 "more pipeline chunks|chunks than layers|more chunks" "${common[@]}" --set parallel.pp=2 \
  --set parallel.virtual_stages=4 --set parallel.schedule=interleaved-1f1b
expect_error 2 "partition" "${common[@]}" --set parallel.pp=2 --set "parallel.partition=[2,2]"
expect_error 2 "micro-batches" "${common[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=16
printf '0F0,0F1,0B0\n' > "$TMP/bad.csv"
expect_error 2 "bad.csv" "${common[@]}" --set parallel.pp=2 --set "parallel.schedule=\"$TMP/bad.csv\""
finish
