#!/usr/bin/env bash
# Usage: scripts/train.sh [--config FILE] [--text DIR_OR_FILE...] [--set KEY=VALUE ...]
# README command 1: install what is missing, build, prepare the fortunes corpus and
# train the default model (configs/tiny.cfg) on several ranks, showing progress.
# The grid defaults to data parallelism over 2 ranks; set RANKS and pass --set options
# for another (RANKS=4 scripts/train.sh --set parallel.pp=2: dp = 4 / 2 = 2).
# `--config FILE` (first) trains another config, e.g. configs/llama-tiny.cfg; its runs
# go to runs/NAME (the file's name without .cfg). Extra arguments go to `tessera train`
# (e.g. --set train.steps=50). The run saves a checkpoint into runs/NAME (or the
# checkpoint.dir given) and ends by printing a short sample of text from it (`tessera
# sample`).
# `--text DIR_OR_FILE...` (first, or after --config) trains on your own text instead:
# GPT-2's BPE ranks are fetched if missing (scripts/fetch_tokenizers.sh), the
# directories and files (every file under a directory, in name order; .jsonl files one
# document per line) are encoded by `tessera data --encoding gpt2` into data/text_*.bin
# (the first tenth of the tokens a validation shard, the rest training shards; replaced
# on every run), and
# configs/gpt2-bpe-tiny.cfg (or the --config given) trains on them; the sample at the
# end is text, decoded by the checkpoint's tokenizer, starting from <|endoftext|>
# (PROMPT="..." to give one). The arguments after the inputs (from the first one
# starting with "-") go to `tessera train`.
# Metrics go to CKPT_DIR/metrics.jsonl beside the checkpoints (runs/NAME, or the
# checkpoint.dir given) unless the arguments set log.metrics.
# `--help` (or -h) prints this text and exits, building nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
for a in "$@"; do
  case "$a" in
    --help | -h)
      # This file's leading comment is its usage: printed without the '# '.
      sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      exit 0
      ;;
  esac
done
cd "$root"
config=""
text=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config)
      [ $# -ge 2 ] || { echo "train.sh: --config needs a config file" >&2; exit 2; }
      config="$2"
      shift 2
      [ -f "$config" ] || { echo "train.sh: no config file '$config'" >&2; exit 2; }
      ;;
    --text)
      shift
      while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do text+=("$1"); shift; done
      [ ${#text[@]} -gt 0 ] || {
        echo "train.sh: --text needs the directories or files of text to train on" >&2; exit 2; }
      for t in "${text[@]}"; do
        [ -e "$t" ] || { echo "train.sh: --text: no file or directory '$t'" >&2; exit 2; }
      done
      ;;
    *) break ;;
  esac
done
if [ -z "$config" ]; then
  if [ ${#text[@]} -gt 0 ]; then config=configs/gpt2-bpe-tiny.cfg; else config=configs/tiny.cfg; fi
fi
name="$(basename "$config" .cfg)"
scripts/setup.sh
# The build's output goes to a log, shown only when it fails (a demo need not scroll
# past 150 lines of make).
mkdir -p "$root/build"
echo "train.sh: building into build/ (log: build/build.log)" >&2
if ! scripts/build.sh "$root/build" >"$root/build/build.log" 2>&1; then
  cat "$root/build/build.log" >&2
  echo "train.sh: the build failed (above)" >&2
  exit 1
fi
prompt="${PROMPT-The }"
if [ ${#text[@]} -gt 0 ]; then
  # The config's tokenizer reads the ranks from the default path (tokenizer_file "").
  ranks_file="${TS_TOKENIZER_DIR:-$HOME/.cache/tessera/tokenizers}/gpt2.tiktoken"
  if [ ! -f "$ranks_file" ]; then
    echo "train.sh: GPT-2's ranks are not at $ranks_file: fetching them" >&2
    scripts/fetch_tokenizers.sh
  fi
  mkdir -p data
  # About a tenth of the tokens (GPT-2's BPE: ~4 bytes a token) are held out for
  # validation, the stream's first ones; at least a few windows of the config's seq_len.
  bytes=$(find "${text[@]}" -type f ! -name '.*' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
  val=$((bytes / 40 > 1000 ? bytes / 40 : 1000))
  "$root/build/tessera" data --encoding gpt2 --ranks "$ranks_file" --val-tokens "$val" \
    --overwrite "${text[@]}" --out data/text
  prompt="${PROMPT-}" # empty: from the document token, as every training document starts
else
  scripts/prepare_data.sh "$root/build/tessera" data
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ranks="${RANKS:-2}"
# tiny.cfg's parallel.dp = "auto": the ranks left over by pp * tp are data parallel.
# Checkpoints go to runs/NAME (step_NNNNNNNN/ and latest, beside metrics.jsonl) unless
# the arguments name another checkpoint.dir; the model is sampled from there at the end.
# The demo starts over each time it runs: checkpoint.overwrite lets a fresh run save
# where the last one's checkpoints are (without it, Tessera refuses, to protect them).
# The metrics follow the checkpoints (DIR/metrics.jsonl), so a run in another
# checkpoint.dir never writes over the metrics of the run in runs/NAME.
dir="runs/$name"
own_dir=1
own_metrics=1
for a in "$@"; do
  case "$a" in
    checkpoint.dir=* | --set=checkpoint.dir=*)
      own_dir=0
      dir="${a#*checkpoint.dir=}"
      dir="${dir#\"}"
      dir="${dir%\"}"
      ;;
    log.metrics=* | --set=log.metrics=*) own_metrics=0 ;;
  esac
done
sets=()
if [ "$own_dir" = 1 ]; then
  sets+=(--set "checkpoint.dir=\"$dir\"" --set checkpoint.overwrite=true)
fi
if [ "$own_metrics" = 1 ] && [ -n "$dir" ]; then
  sets+=(--set "log.metrics=\"$dir/metrics.jsonl\"")
fi
mpirun --oversubscribe -np "$ranks" "$root/build/tessera" train "$config" "${sets[@]}" "$@"
if [ -z "$dir" ]; then exit 0; fi # checkpoint.dir="": nothing saved to sample from
echo
echo "--- a sample from the trained model: build/tessera sample $dir --prompt \"$prompt\" --tokens 200 ---"
"$root/build/tessera" sample "$dir" --prompt "$prompt" --tokens 200
echo
