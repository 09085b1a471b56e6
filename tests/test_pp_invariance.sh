# Grid invariance for pipeline parallelism: pp = 2 and 4 with every schedule (a CSV
# schedule included), interleaved-1f1b with v = 2, recompute modes, an uneven explicit
# partition and pipeline x data parallelism all give the one-rank losses within
# relative 1e-4 for 20 steps of the tiny config, with the exchange run eagerly (MPI)
# and group by group (as NCCL needs). Bad pipeline configs fail clearly.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 20 steps; 6 under the sanitizers (TS_TEST_SWEEP_STEPS, tests/CMakeLists.txt).
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=${TS_TEST_SWEEP_STEPS:-20}" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)


check ref 1
for sched in gpipe 1f1b zb-h1; do
  check "pp2_$sched" 2 --set parallel.pp=2 --set parallel.schedule="$sched"
  check "pp4_$sched" 4 --set parallel.pp=4 --set parallel.schedule="$sched"
done
check pp2_csv 2 --set parallel.pp=2 --set "parallel.schedule=\"$SRC/tests/schedules/example_1f1b_pp2.csv\""
check pp2_v2_interleaved 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b
check pp2_v3_interleaved_m8 2 --set parallel.pp=2 --set parallel.virtual_stages=3 \
  --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=2
check pp2_recompute_full 2 --set parallel.pp=2 --set parallel.recompute=full
check pp4_recompute_except_last 4 --set parallel.pp=4 --set parallel.recompute=except_last
check pp2_zb_recompute 2 --set parallel.pp=2 --set parallel.schedule=zb-h1 --set parallel.recompute=full
check pp2_uneven 2 --set parallel.pp=2 --set "parallel.partition=[1,5]"
check pp4_uneven 4 --set parallel.pp=4 --set "parallel.partition=[2,1,2,1]"
check pp2_dp2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=2
check pp2_m8_more_mb 2 --set parallel.pp=2 --set parallel.micro_batch=2
check pp4_m2_fewer_mb 4 --set parallel.pp=4 --set parallel.micro_batch=8

# The exchange program run group by group, as a backend that matches by order and
# completes a send only when the peer receives (NCCL) needs it (TS_PP_EXCHANGE=grouped),
# gives the eager run's losses bit for bit.
export TS_PP_EXCHANGE=grouped
check pp2_v2_interleaved_grouped 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved-1f1b
check pp4_zb-h1_grouped 4 --set parallel.pp=4 --set parallel.schedule=zb-h1
check pp2_csv_grouped 2 --set parallel.pp=2 --set "parallel.schedule=\"$SRC/tests/schedules/example_1f1b_pp2.csv\""
check pp2_recompute_full_grouped 2 --set parallel.pp=2 --set parallel.recompute=full
unset TS_PP_EXCHANGE
for g in pp2_v2_interleaved pp4_zb-h1 pp2_csv pp2_recompute_full; do
  cmp -s <(losses "$TMP/$g.jsonl") <(losses "$TMP/${g}_grouped.jsonl") && pass ||
    fail "$g: the grouped exchange changed the losses"
done

# The same pipeline run twice is bit-identical.
check pp2_1f1b_again 2 --set parallel.pp=2 --set parallel.schedule=1f1b
if cmp -s <(losses "$TMP/pp2_1f1b.jsonl") <(losses "$TMP/pp2_1f1b_again.jsonl"); then pass
else fail "pp=2 run twice is not bit-identical"; fi
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
