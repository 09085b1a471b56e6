#!/usr/bin/env bash
# Install what Tessera needs from Debian's packages. Idempotent: apt runs only when a
# package is missing. Usage: scripts/setup.sh [extra-package ...]
set -euo pipefail

packages=(
  build-essential cmake pkg-config     # compiler and build
  openmpi-bin libopenmpi-dev           # MPI library and runtime (mpirun)
  hwloc libhwloc-dev                   # hardware topology and binding
  libconfig-dev                        # config files
  libopenblas-openmp-dev               # BLAS built on OpenMP: one thread pool with our kernels
  libdnnl-dev                          # oneDNN: the bf16 CPU backend's GEMMs (AVX-512 BF16 / AMX), on OpenMP too
  libjansson-dev                       # JSON (safetensors headers, metrics, plans)
  zlib1g-dev                           # crc32 checksums of checkpoints
  libpcre2-dev                         # the BPE pre-tokenizer patterns (Unicode properties, JIT)
  libssl-dev                           # sha256 of tokenizer ranks files (libcrypto)
  libprotobuf-c-dev protobuf-c-compiler  # TensorBoard's Event protobufs (log.tensorboard), generated at build time
  libisal-dev                          # Intel ISA-L: CRC-32C of TensorBoard's TFRecord framing
  curl ca-certificates                 # scripts/fetch_tokenizers.sh: the pinned ranks files from PyPI
  fortunes fortunes-min                # the demo's English text corpus
  slurmctld slurmd slurm-client munge libpmix-dev  # Slurm test cluster; srun --mpi=pmix dlopens libpmix.so
  clang-14 libclang-rt-14-dev libomp-14-dev  # scripts/fuzz.sh: clang, libFuzzer + sanitizer runtimes, clang's OpenMP
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
