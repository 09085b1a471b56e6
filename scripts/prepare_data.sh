#!/usr/bin/env bash
# The demo corpus: the English texts of Debian's fortunes packages, concatenated, the
# last tenth held out for validation, each written as a byte-level token shard.
# Usage: scripts/prepare_data.sh TESSERA_BINARY [OUT_DIR]
set -euo pipefail
tessera="$1"
out="${2:-data}"
src=/usr/share/games/fortunes
if [ -s "$out/fortunes_train.bin" ] && [ -s "$out/fortunes_val.bin" ]; then
  exit 0
fi
mkdir -p "$out"
# Plain text files only: skip the .dat indexes and the .u8 links to the same texts.
find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort \
  | xargs cat > "$out/fortunes.txt"
total=$(stat -c %s "$out/fortunes.txt")
val=$((total / 10))
head -c $((total - val)) "$out/fortunes.txt" > "$out/fortunes_train.txt"
tail -c "$val" "$out/fortunes.txt" > "$out/fortunes_val.txt"
"$tessera" data "$out/fortunes_train.txt" "$out/fortunes_train.bin"
"$tessera" data "$out/fortunes_val.txt" "$out/fortunes_val.bin"
