# Grid invariance for data parallelism: dp = 1, 2, 4 and several micro-batch splits of
# the same global batch give the one-rank losses within relative 1e-4 for 20 steps;
# the same multi-rank run twice is bit-identical.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/tiny.cfg" --set train.steps=20 --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)

run() { # NAME NP DP MICRO_BATCH [extra sets]
  local name="$1" np="$2" dp="$3" mb="$4"; shift 4
  if run_np "$np" "${common[@]}" --set parallel.dp="$dp" --set parallel.micro_batch="$mb" \
       --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
  else
    fail "run $name (np $np dp $dp micro_batch $mb)"; sed 's/^/    /' "$TMP/err" >&2
  fi
}

run ref 1 1 4
for spec in "dp1_mb16 1 1 16" "dp1_mb1 1 1 1" "dp2_mb4 2 2 4" "dp2_mb8 2 2 8" "dp2_mb2 2 2 2" \
            "dp4_mb4 4 4 4" "dp4_mb1 4 4 1" "dp2_nooverlap 2 2 4 --set parallel.overlap_grad_sync=false" \
            "dp2_bucket1 2 2 4 --set parallel.bucket_mb=1"; do
  # shellcheck disable=SC2086
  run $spec
  name="${spec%% *}"
  if out=$(same_losses "$TMP/$name.jsonl" "$TMP/ref.jsonl" 1e-4); then pass; else fail "$name vs one rank: $out"; fi
done

run dp2_mb4_again 2 2 4
if cmp -s <(losses "$TMP/dp2_mb4.jsonl") <(losses "$TMP/dp2_mb4_again.jsonl"); then pass
else fail "dp=2 run twice is not bit-identical"; fi
grep -q '"dp_overlap":0\.[0-9]*[1-9]' "$TMP/dp2_mb4.jsonl" && pass || fail "dp_overlap never above 0 with dp=2"
finish
