# The quick tier's grids (CTest label "quick", `scripts/test.sh --quick`): one small grid
# per kind of parallelism, 8 steps of the tiny config each, gives the one-rank losses and
# gradient norms within relative 1e-4: dp 2, pp 2 (1F1B), tp 2, cp 2, sequence
# parallelism on tp 2, ZeRO-1 and ZeRO-3 on dp 2. A minute's first look at a change
# that breaks one of them; the full suite's sweeps (test_dp/pp/tp/cp/sp/zero/
# zero3_invariance) run every one of these grids for 20 steps (ZeRO-3 for 8) among their
# others, which is why scripts/test.sh leaves this test out of the full run.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/tiny.cfg" --set train.steps=8 --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)

check ref 1
check dp2 2 --set parallel.dp=2
check pp2 2 --set parallel.pp=2 --set parallel.schedule=1f1b
check tp2 2 --set parallel.tp=2
check cp2 2 --set parallel.cp=2
check sp_tp2 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
check zero1_dp2 2 --set parallel.dp=2 --set parallel.zero=1
check zero3_dp2 2 --set parallel.dp=2 --set parallel.zero=3
finish
