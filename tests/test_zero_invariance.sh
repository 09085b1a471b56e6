# Grid invariance for ZeRO-1 (parallel.zero = 1: gradients reduce-scattered over dp,
# AdamW moments and updates sharded 1/dp, parameters all-gathered): dp = 2 and 4, tp2 x
# dp2, and pp2 x dp2 x tp2 interleaved (v = 2) give the one-rank losses and gradient
# norms within relative 1e-4 for 16 steps of the tiny config; zero = 1 on one replica is
# the plain run bit for bit, and overlap off the overlapped run, over 8 steps (below); the
# same run twice is bit-identical; the optimizer state per rank at dp = 4 is a quarter of dp = 1's (within
# 5%); dp = 3 with pieces of unequal size works too; zero = 4 is an error naming the key
# (ZeRO-2 and 3: test_zero3_invariance.sh).
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# 16 steps; 4 under the sanitizers and in the strict copy (TS_TEST_SWEEP_STEPS,
# tests/CMakeLists.txt).
steps=${TS_TEST_SWEEP_STEPS:-16}
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)
zero=(--set parallel.zero=1)
# 1 MiB buckets: several per rank, so reductions start during the backward.
small=(--set parallel.bucket_mb=1)
nooverlap=(--set parallel.overlap_grad_sync=false)
grid3d=(--set parallel.pp=2 --set parallel.dp=2 --set parallel.tp=2 --set parallel.virtual_stages=2
        --set parallel.schedule=interleaved-1f1b --set parallel.micro_batch=2)

# bit_same A B WHAT: runs A and B (metrics files) have the same losses and gradient norms,
# bit for bit (the first $short of A's when B is a check_short run).
bit_same() {
  local n
  n=$(losses "$TMP/$2.jsonl" | wc -l)
  if [ "$n" -gt 0 ] && cmp -s <(losses "$TMP/$1.jsonl" | head -n "$n") <(losses "$TMP/$2.jsonl") \
     && cmp -s <(norms "$TMP/$1.jsonl" | head -n "$n") <(norms "$TMP/$2.jsonl"); then pass
  else fail "$3: $1 and $2 differ"; fi
}

check ref 1
# check_short NAME NP SETS...: check with $short steps against the reference's first
# $short: for the runs that bit_same holds against a 16-step run below (zero = 1 on one
# replica, overlap off). A deterministic difference in any step changes the next step's
# bits, so 8 steps show it as 16 do; the 16 steps are all warm-up, whose learning rate
# does not depend on train.steps, so an 8-step run's steps are the 16-step run's first 8.
short=$((steps < 8 ? steps : 8))
grep '"loss"' "$TMP/ref.jsonl" | head -n "$short" >"$TMP/ref_short.jsonl"
check_short() { CHECK_REF="$TMP/ref_short.jsonl" check "$@" --set "train.steps=$short"; }
check_short zero_dp1 1 "${zero[@]}"
check zero_dp2 2 --set parallel.dp=2 "${zero[@]}" "${small[@]}"
check_short zero_dp2_nooverlap 2 --set parallel.dp=2 "${zero[@]}" "${small[@]}" "${nooverlap[@]}"
check zero_dp4 4 --set parallel.dp=4 "${zero[@]}" "${small[@]}"
check_short zero_dp4_nooverlap 4 --set parallel.dp=4 "${zero[@]}" "${small[@]}" "${nooverlap[@]}"
check zero_tp2_dp2 4 --set parallel.tp=2 --set parallel.dp=2 "${zero[@]}"
check zero_3d 8 "${grid3d[@]}" "${zero[@]}"
check_short zero_3d_nooverlap 8 "${grid3d[@]}" "${zero[@]}" "${nooverlap[@]}"
# Another schedule and recompute mode with the tied embedding across stages.
check zero_pp2_dp2_zb_recompute 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.micro_batch=2 \
  --set parallel.schedule=zb-h1 --set parallel.recompute=full "${zero[@]}" "${small[@]}"
release_only "the same ZeRO-1 run twice, bit for bit" ||
  check zero_dp2_again 2 --set parallel.dp=2 "${zero[@]}" "${small[@]}"

# dp = 3 with n_embd = 64: the bucket's 16-float units do not divide by 3, so the dp
# ranks' pieces differ in size (its own one-rank reference: global_batch 12).
odd=(--set model.n_embd=64 --set train.global_batch=12 --set parallel.micro_batch=2)
if run_np 1 "${common[@]}" "${odd[@]}" --set "log.metrics=\"$TMP/odd_ref.jsonl\"" \
   && run_np 3 "${common[@]}" "${odd[@]}" --set parallel.dp=3 "${zero[@]}" \
        --set "log.metrics=\"$TMP/odd_dp3.jsonl\""; then
  if out=$(same_losses "$TMP/odd_dp3.jsonl" "$TMP/odd_ref.jsonl" 1e-4); then pass
  else fail "dp = 3 (uneven pieces) vs one rank: $out"; fi
else
  fail "run with dp = 3 (uneven pieces)"; sed 's/^/    /' "$TMP/err" >&2
fi

bit_same ref zero_dp1 "zero = 1 with dp = 1 is not the plain run"
bit_same zero_dp2 zero_dp2_nooverlap "overlap on and off (dp = 2)"
bit_same zero_dp4 zero_dp4_nooverlap "overlap on and off (dp = 4)"
# The 8-rank pair is the release build's under the sanitizers (TS_TEST_MAX_RANKS, lib.sh).
[ "${TS_TEST_MAX_RANKS:-8}" -lt 8 ] ||
  bit_same zero_3d zero_3d_nooverlap "overlap on and off (pp2 x dp2 x tp2, v = 2)"
[ "${TS_TEST_SANITIZERS:-0}" = 1 ] || [ -n "${TS_TEST_DEVICE:-}" ] ||
  bit_same zero_dp2 zero_dp2_again "the same ZeRO-1 run twice"

# The optimizer state per rank (the metrics' last line, MiB to 0.1): every dp = 4 rank
# holds a quarter of the one-rank moments, within 5%.
optimizer_mb() { tail -n 1 "$TMP/$1.jsonl" | grep -o '"optimizer_mb":\[[^]]*\]' | cut -d'[' -f2 | tr -d ']'; }
one=$(optimizer_mb ref) four=$(optimizer_mb zero_dp4)
if awk -v one="$one" -v four="$four" 'BEGIN {
     n = split(four, v, ","); if (one <= 0 || n != 4) exit 1
     for (i = 1; i <= n; i++) { r = v[i] / (one / 4); if (r < 0.95 || r > 1.05) exit 1 }
   }'; then pass
else fail "optimizer_mb at dp = 4 ($four) is not a quarter of dp = 1's ($one) within 5%"; fi

expect_error 1 "'?parallel.zero'?.*\\[0, 3\\]" "${common[@]}" --set parallel.zero=4
finish
