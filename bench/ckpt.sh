#!/usr/bin/env bash
# Checkpoint save and load bandwidth for GPT-2 124M with its AdamW state (1.49 GB per
# checkpoint: weights + exp_avg + exp_avg_sq, F32) on 1, 2 and 4 ranks, next to the
# disk's sequential write bandwidth measured in the same run (dd with conv=fdatasync,
# the same bytes, right before and right after each save, the page cache dropped first:
# a virtual disk's rate swings, so the save is compared with the mean of the two). Saves are synchronous: the save time is the time training is blocked.
# Prints a markdown table.
#
# Usage: bench/ckpt.sh [ROUNDS] [DIR]    (run from anywhere)
#   ROUNDS  measurements per rank count (default 2; the table shows each)
#   DIR     where to write (default: a temporary directory under build/; needs ~5 GB)
#
# Grids: 1 rank; dp = 2 and dp = 4 with ZeRO-1 (each rank writes its 1/dp of every
# tensor and of the moments). A save is timed by the trainer (the metrics line
# {"checkpoint_step", "save_ms"}: files created, every rank's pwrites, fsyncs, the
# checksum gather, state.json, rename, latest); a load by its log line (open, every
# chunk's checksum verified once over the ranks, then each rank's own slices). Before
# each load the page cache is dropped when this machine allows it (root, not a
# container), so the load reads the disk; the table says whether it did.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-2}"
command="bench/ckpt.sh $*"
scripts/setup.sh >/dev/null
scripts/build.sh "$root/build" >/dev/null
scripts/prepare_data.sh "$root/build/tessera" data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="${2:-}"
if [ -z "$work" ]; then
  work="$(mktemp -d "$root/build/ckpt-bench.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

drop_caches() {
  sync
  if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo yes; else echo no; fi
}

# The disk: 1.5 GB of zeros written and fdatasync'ed, as dd reports it (GB/s).
disk_write() {
  local out
  out=$(LC_ALL=C dd if=/dev/zero of="$work/dd.bin" bs=16M count=89 conv=fdatasync 2>&1 | tail -1)
  rm -f "$work/dd.bin"
  echo "$out" | awk '{ for (i = 1; i <= NF; i++) if ($i == "s,") { printf "%.3f", $1 / $(i - 1) / 1e9; exit } }'
}

cfg=(train configs/gpt2-124m.cfg --set train.steps=0 --set parallel.micro_batch=1
     --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' --set train.threads=1)
grid_for() { # N: 1 rank, or dp = N with ZeRO-1
  if [ "$1" = 1 ]; then echo --set parallel.dp=1 --set train.global_batch=1
  else echo --set parallel.dp="$1" --set parallel.zero=1 --set train.global_batch="$1"; fi
}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "## Checkpoint save and load, GPT-2 124M with AdamW state"
echo
echo "\`$command\` on $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cpu, $(nproc) cores; files under $work ($(df -T "$work" | awk 'NR == 2 { print $2 }'))."
echo
echo "| ranks | round | disk write before / after (dd, GB/s) | save s (training blocked) | save GB/s | save / disk (mean of dd) | load s | load GB/s | page cache dropped |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in 1 2 4; do
  for r in $(seq 1 "$rounds"); do
    drop_caches >/dev/null
    disk=$(disk_write)
    drop_caches >/dev/null
    ck="$work/ck$n"
    rm -rf "$ck"
    mpirun --oversubscribe -np "$n" build/tessera "${cfg[@]}" $(grid_for "$n") \
      --set "checkpoint.dir=\"$ck\"" --set "log.metrics=\"$work/save.jsonl\"" 2>"$work/save.err" ||
      { cat "$work/save.err" >&2; exit 1; }
    disk2=$(disk_write)
    line=$(grep '"checkpoint_step"' "$work/save.jsonl")
    save_ms=$(echo "$line" | sed 's/.*"save_ms":\([0-9.]*\).*/\1/')
    bytes=$(echo "$line" | sed 's/.*"save_bytes":\([0-9.]*\).*/\1/')
    dropped=$(drop_caches)
    mpirun --oversubscribe -np "$n" build/tessera "${cfg[@]}" $(grid_for "$n") \
      --set "checkpoint.load=\"$ck/step_00000000\"" --set 'log.metrics=""' 2>"$work/load.err" ||
      { cat "$work/load.err" >&2; exit 1; }
    load_s=$(sed -n 's/.*checkpoint: loaded .* in \([0-9.]*\) s.*/\1/p' "$work/load.err" | head -1)
    awk -v n="$n" -v r="$r" -v disk="$disk" -v disk2="$disk2" -v ms="$save_ms" -v b="$bytes" -v ls="$load_s" -v d="$dropped" 'BEGIN {
      s = ms / 1000; sg = b / s / 1e9; lg = b / ls / 1e9
      printf "| %d | %d | %.2f / %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f | %s |\n", n, r, disk, disk2, s, sg, 200 * sg / (disk + disk2), ls, lg, d }'
    rm -rf "$ck"
  done
done
echo
echo "Checkpoint size: $(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }') (3 x 124.4M F32 values) plus headers and state.json."

# Training blocked by a save: 4 steps with a save after each of the first three (the
# end-of-run save is always synchronous), synchronous against checkpoint.async = true
# (a copy of this rank's slices, then a thread writes them while the next step runs).
echo
echo "Training blocked by a save (saves after steps 1-3 of 4; median over them):"
echo
echo "| ranks | saving | blocked ms per save | save ms (start to commit) | step ms while a save is in flight | step ms, no save in flight |"
echo "|---|---|---|---|---|---|"
for n in 1 2; do
  for mode in false true; do
    ck="$work/blk$n"
    rm -rf "$ck"
    mpirun --oversubscribe -np "$n" build/tessera "${cfg[@]}" $(grid_for "$n") --set train.steps=4 \
      --set checkpoint.every=1 --set checkpoint.keep=1 --set checkpoint.async=$mode \
      --set "checkpoint.dir=\"$ck\"" --set "log.metrics=\"$work/blk.jsonl\"" 2>"$work/blk.err" ||
      { cat "$work/blk.err" >&2; exit 1; }
    awk -v n="$n" -v mode="$mode" '
      function med(a, k,   i, j, t) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
      /"checkpoint_step":[123],/ { match($0, /"blocked_ms":[0-9.]+/); b[++nb] = substr($0, RSTART + 13, RLENGTH - 13)
                                   match($0, /"save_ms":[0-9.]+/); s[++ns] = substr($0, RSTART + 10, RLENGTH - 10) }
      /"step":[0-9]+,"loss"/ { match($0, /"step":[0-9]+/); st = substr($0, RSTART + 7, RLENGTH - 7) + 0
                               match($0, /"step_ms":[0-9.]+/); ms = substr($0, RSTART + 10, RLENGTH - 10)
                               if (st >= 1 && st <= 3) busy[++nbusy] = ms; else if (st == 0) idle[++nidle] = ms }
      END { printf "| %d | %s | %.0f | %.0f | %.0f | %.0f |\n", n, mode == "true" ? "async" : "sync",
                   med(b, nb), med(s, ns), med(busy, nbusy), med(idle, nidle) }' "$work/blk.jsonl"
    rm -rf "$ck"
  done
done
echo
echo "Step 0 (no save in flight) includes first-touch page faults; the sync rows' steps 1-3 follow a finished save."
