#!/usr/bin/env bash
# Tokenizer throughput against tiktoken on the same documents and ranks files.
# Corpus: the Debian copyright files (/usr/share/doc/*/copyright, one document each,
# ~23 MB of mostly English legal text), the valid UTF-8 ones (tiktoken takes str), plus
# one pathological document: a single 200 KB "word" of random letters, one pre-token
# piece (a linear-scan merge like tiktoken's small-piece path would be quadratic on it;
# tiktoken 0.14 and ours both switch to a heap for long pieces). Ours (bench_tokenize) with 1 and THREADS
# threads, tiktoken's encode_ordinary_batch(docs, num_threads=THREADS) with THREADS, each
# the best of REPS passes; the ids are compared by count and sha256 (document order,
# little-endian uint32). Prints a markdown table.
#
# Usage: bench/tokenize.sh [THREADS] [REPS]       (default 2 threads, 3 passes)
#   TS_BENCH_BUILD  build dir with bench/bench_tokenize (default build/, built if absent)
#   TS_BENCH_PYTHON python with tiktoken (default /tmp/tkv/bin/python, then python3);
#                   without tiktoken the peer rows are skipped with a message
# The ranks files come from scripts/fetch_tokenizers.sh (run first when missing).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
threads="${1:-2}"
reps="${2:-3}"
command="bench/tokenize.sh $*"
build="${TS_BENCH_BUILD:-$root/build}"
if [ ! -x "$build/bench/bench_tokenize" ]; then
  if [ -f "$build/CMakeCache.txt" ]; then cmake --build "$build" -j2 --target bench_tokenize >/dev/null
  else scripts/build.sh "$build" >/dev/null; fi
fi
bench="$build/bench/bench_tokenize"
scripts/fetch_tokenizers.sh >/dev/null
tokdir="${TS_TOKENIZER_DIR:-$HOME/.cache/tessera/tokenizers}"
py="${TS_BENCH_PYTHON:-/tmp/tkv/bin/python}"
[ -x "$py" ] || py=python3
peer=1
if ! "$py" -c 'import tiktoken' 2>/dev/null; then
  echo "(tiktoken is not importable by $py: its rows are skipped; pip install tiktoken)" >&2
  peer=0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ts_tokbench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
python3 - "$work/corpus.txt" "$work/long.txt" "$work/long.doc" <<'PYEOF'
import glob, random, sys
ok = []
for p in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        open(p, "rb").read().decode("utf-8")
        ok.append(p)
    except (UnicodeDecodeError, OSError):
        pass
open(sys.argv[1], "w").write("".join(p + "\n" for p in ok))
rng = random.Random(1)
open(sys.argv[3], "w").write("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(200000)))
open(sys.argv[2], "w").write(sys.argv[3] + "\n")
PYEOF

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }
rows=()
# row NAME ENCODING THREADS CORPUS LINE [PEERLINE]
row() {
  local line="$5" peerline="${6:-}"
  local bytes tokens secs sha ratio same
  bytes=$(field bytes "$line"); tokens=$(field tokens "$line"); secs=$(field seconds "$line")
  sha=$(field sha256 "$line")
  ratio="—"; same="—"
  if [ -n "$peerline" ]; then
    ratio=$(awk -v a="$secs" -v b="$(field seconds "$peerline")" 'BEGIN { printf "%.2fx", b / a }')
    if [ "$tokens" = "$(field tokens "$peerline")" ] && [ "$sha" = "$(field sha256 "$peerline")" ]; then
      same="yes (${sha:0:12})"; else same="**NO**"; fi
  fi
  awk -v n="$1" -v e="$2" -v t="$3" -v c="$4" -v by="$bytes" -v tk="$tokens" -v s="$secs" \
      -v r="$ratio" -v same="$same" -v l="$(field load_ms "$line")" \
      'BEGIN { printf "| %s | %s | %s | %s | %d | %d | %.3f | %.1f | %.2fM | %s | %s | %s |\n",
               n, e, c, t, by, tk, s, by / s / 1e6, tk / s / 1e6, r, same, l }'
}

for enc in gpt2 llama3; do
  ranks="$tokdir/$enc.tiktoken"
  for corpus in corpus long; do
    list="$work/$corpus.txt"
    label=$([ $corpus = corpus ] && echo "copyright files" || echo "one 200 KB piece")
    peerline=""
    if [ $peer = 1 ]; then
      peerline=$("$py" bench/tokenize_tiktoken.py "$list" "$enc" "$ranks" "$threads" "$reps")
    fi
    for t in 1 "$threads"; do
      ours=$("$bench" --list "$list" --encoding "$enc" --ranks "$ranks" --threads "$t" --reps "$reps")
      if [ "$t" = "$threads" ]; then rows+=("$(row tessera "$enc" "$t" "$label" "$ours" "$peerline")")
      else rows+=("$(row tessera "$enc" "$t" "$label" "$ours")"); fi
      [ "$t" = "$threads" ] && break
    done
    [ -n "$peerline" ] && rows+=("$(row "tiktoken $("$py" -c 'import tiktoken; print(tiktoken.__version__)')" "$enc" "$threads" "$label" "$peerline")")
  done
done

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "## Tokenizer throughput: tessera's BPE against tiktoken"
echo
echo "\`$command\` on $(date -u '+%Y-%m-%d %H:%M') UTC at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cpu, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the run."
echo "Best of $reps passes; documents read into memory first; ratio = tiktoken's seconds / ours at the same thread count; load = reading and indexing the ranks file."
echo
echo "| tokenizer | encoding | corpus | threads | bytes | tokens | seconds | MB/s | tokens/s | ratio | ids = tiktoken's | load ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
