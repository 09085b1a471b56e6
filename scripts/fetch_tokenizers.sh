#!/usr/bin/env bash
# Get the BPE ranks files the gpt2 and llama3 encodings read, from pinned PyPI packages:
#   gpt2.tiktoken   = openai-whisper 20250625's sdist, whisper/assets/gpt2.tiktoken
#                     (tiktoken's r50k_base ranks)
#   llama3.tiktoken = llama-models 0.3.0's wheel, llama_models/llama3/tokenizer.model
# Usage: scripts/fetch_tokenizers.sh [DIR]
#   DIR defaults to ${TS_TOKENIZER_DIR:-$HOME/.cache/tessera/tokenizers}, where
#   ts_tokenizer_default_path looks. Idempotent: a file already there with the right
#   sha256 is kept. Every download and every extracted file is checked against its pinned
#   sha256; a mismatch is an error that leaves nothing behind (files are written to a
#   temporary name and renamed only once verified).
set -euo pipefail

DIR=${1:-${TS_TOKENIZER_DIR:-$HOME/.cache/tessera/tokenizers}}

WHISPER_URL=https://files.pythonhosted.org/packages/35/8e/d36f8880bcf18ec026a55807d02fe4c7357da9f25aebd92f85178000c0dc/openai_whisper-20250625.tar.gz
WHISPER_SHA=37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96
WHISPER_MEMBER=openai_whisper-20250625/whisper/assets/gpt2.tiktoken
GPT2_SHA=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
LLAMA_PKG=llama-models==0.3.0
LLAMA_WHEEL=llama_models-0.3.0-py3-none-any.whl
LLAMA_WHEEL_SHA=7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f
LLAMA_MEMBER=llama_models/llama3/tokenizer.model
LLAMA3_SHA=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55

die() { echo "fetch_tokenizers: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
# check FILE SHA WHAT: an error naming both hashes when they differ
check() {
    local got
    got=$(sha_of "$1")
    [[ $got == "$2" ]] || die "$3 has sha256 $got, expected $2: a changed or damaged download; nothing was installed"
}
have() { [[ -f $DIR/$1 && $(sha_of "$DIR/$1") == "$2" ]]; }

mkdir -p "$DIR" || die "cannot create $DIR"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ts_fetch_tok.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# install SRC NAME SHA: verified, then renamed into place (same filesystem: atomic)
install_file() {
    check "$1" "$3" "$2 (extracted)"
    local part
    part=$(mktemp "$DIR/.$2.XXXXXX")
    cp "$1" "$part" && chmod 644 "$part" && mv -f "$part" "$DIR/$2" || { rm -f "$part"; die "cannot write $DIR/$2"; }
    echo "installed $DIR/$2 (sha256 $3)"
}

if have gpt2.tiktoken "$GPT2_SHA"; then
    echo "ok $DIR/gpt2.tiktoken (sha256 matches)"
else
    # pip download of openai-whisper would build the sdist's metadata; curl the pinned file
    curl -fsSL --retry 3 -o "$TMP/whisper.tar.gz" "$WHISPER_URL" || die "cannot download $WHISPER_URL"
    check "$TMP/whisper.tar.gz" "$WHISPER_SHA" "openai-whisper 20250625 sdist"
    tar -xzf "$TMP/whisper.tar.gz" -C "$TMP" "$WHISPER_MEMBER" || die "the whisper sdist lacks $WHISPER_MEMBER"
    install_file "$TMP/$WHISPER_MEMBER" gpt2.tiktoken "$GPT2_SHA"
fi

if have llama3.tiktoken "$LLAMA3_SHA"; then
    echo "ok $DIR/llama3.tiktoken (sha256 matches)"
else
    PIP=()
    if python3 -m pip --version >/dev/null 2>&1; then PIP=(python3 -m pip)
    elif command -v pip3 >/dev/null; then PIP=(pip3)
    else die "pip is needed to download $LLAMA_PKG (apt install python3-pip)"; fi
    "${PIP[@]}" download --quiet --no-deps --only-binary=:all: -d "$TMP/wheel" "$LLAMA_PKG" \
        || die "pip could not download $LLAMA_PKG"
    check "$TMP/wheel/$LLAMA_WHEEL" "$LLAMA_WHEEL_SHA" "$LLAMA_WHEEL"
    python3 - "$TMP/wheel/$LLAMA_WHEEL" "$LLAMA_MEMBER" "$TMP/llama3.tiktoken" <<'PYEOF' \
        || die "the llama-models wheel lacks $LLAMA_MEMBER"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as f:
    f.write(z.read(sys.argv[2]))
PYEOF
    install_file "$TMP/llama3.tiktoken" llama3.tiktoken "$LLAMA3_SHA"
fi
