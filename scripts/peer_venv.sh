#!/usr/bin/env bash
# A Python virtual environment with PyTorch 2 from PyPI and numpy: the peer that
# bench/bf16.sh measures Tessera's bf16 against (bf16 autocast, torch.compile). Debian's
# python3-torch is 1.13, which bench/throughput.sh keeps using. Idempotent: a venv that
# already imports torch >= 2 and numpy is left as it is. Never a CI dependency.
#
# Usage: scripts/peer_venv.sh [DIR]     (default ~/.cache/tessera/peer-venv)
# Prints the venv's python on stdout; pip's progress goes to stderr.
#
# The wheels come from PyTorch's CPU index when it answers (about 200 MB); otherwise from
# plain PyPI, whose Linux torch is the CUDA build and pulls the nvidia-* libraries
# (several GB) it needs to import, although the CPU runs never load them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$HOME/.cache/tessera/peer-venv}"
py="$dir/bin/python"
cpu_index=https://download.pytorch.org/whl/cpu

ready() {
  [ -x "$py" ] && "$py" -c 'import sys, numpy, torch
sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null
}

if ! ready; then
  # Debian's python3 (the one python3-venv serves), not whatever python3 PATH finds
  if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
    "$root/scripts/setup.sh" python3-venv >&2
  fi
  [ -x "$py" ] || /usr/bin/python3 -m venv "$dir" >&2
  echo "peer_venv: installing torch and numpy into $dir" >&2
  if ! "$py" -m pip install -q --timeout 20 --retries 0 --index-url "$cpu_index" torch numpy >&2; then
    echo "peer_venv: PyTorch's CPU index unreachable; installing from PyPI (the CUDA build)" >&2
    "$py" -m pip install -q torch numpy >&2
  fi
  ready || { echo "peer_venv: $py does not import torch >= 2 and numpy" >&2; exit 1; }
fi
echo "$py"
