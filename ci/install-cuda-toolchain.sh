#!/usr/bin/env bash
# Install the pieces of NVIDIA's CUDA toolchain that need no GPU — NVRTC
# 12.2 (libnvrtc.so.12, what server-cuda compiles CUDA C++ with, and what
# the CUDA bundle carries), the ptxas of the same release (the PTX
# assembler the driver's JIT is built on) and NCCL (libnccl.so.2, the
# collectives library) — from NVIDIA's PyPI wheels into a folder of the
# build tree, for the `toolchain` test of server-cuda
# (crates/server-cuda/tests/toolchain.rs) and `cargo xtask bundle`:
#
#   ci/install-cuda-toolchain.sh            # into target/cuda-toolchain
#   ci/install-cuda-toolchain.sh DIR        # into DIR
#   SCOPE_CUDA_TOOLCHAIN=target/cuda-toolchain \
#     cargo test --workspace --all-features --test toolchain
#
# Why NVRTC 12.2: a driver JITs PTX of its own CUDA release's ISA version
# and older, never newer, and NVRTC writes its release's ISA. NVRTC 12.2
# writes PTX ISA 8.2, which every driver from CUDA 12.2 (Linux 535) on
# JITs, 12.x and 13.x alike; NVRTC 13.0's ISA 9.0 would need a 13.x driver
# (Linux 580), and no 12.x driver JITs it. 12.2 is the oldest NVRTC that
# compiles every kernel the project emits for sm_80 and sm_90 (the toolchain
# test; 12.0 and 12.1 refuse some of cubecl's), so it reaches the most
# drivers. 12.2.140 is the last 12.2 release of both wheels (CUDA 12.2
# Update 2). server-cuda's cudarc bindings are 13.0's, which look NVRTC up
# as libnvrtc.so.13 and then libnvrtc.so.12; only NVRTC's oldest calls are
# used, all present in 12.2.
#
# Only this one NVRTC is installed: the toolchain row checks what the bundle
# carries, and a kernel NVRTC 12.2 compiles, a newer NVRTC compiles too.
#
# Changes nothing outside DIR: `pip install --target DIR --no-deps`, no
# system packages, no root needed (it works as root too), never reads
# stdin. Idempotent: when DIR already holds these versions it only says
# where they are. Needs python3 with pip, and network access to PyPI
# (NVRTC and ptxas are about 45 MB of wheels, NCCL most of the rest;
# about 350 MB installed).
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_VERSION=12.2.140
NVCC_VERSION=12.2.140
# NCCL for the collectives' device transport: 2.30, the newest release
# cudarc 0.19's bindings name (`nccl-02030`).
NCCL_VERSION=2.30.7
WANT="nvidia-cuda-nvrtc-cu12==${NVRTC_VERSION} nvidia-cuda-nvcc-cu12==${NVCC_VERSION} nvidia-nccl-cu13==${NCCL_VERSION}"

# target/cuda-toolchain of the workspace, whatever CARGO_TARGET_DIR says:
# where the "cuda toolchain" row (xtask/src/tests.rs) and
# `cargo xtask bundle` look for it.
dest="${1:-target/cuda-toolchain}"
case "$dest" in
  /*) ;;
  *) dest="$PWD/$dest" ;;
esac
stamp="$dest/.scope-cuda-toolchain"
nvrtc="$dest/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
ptxas="$dest/nvidia/cuda_nvcc/bin/ptxas"
nccl="$dest/nvidia/nccl/lib/libnccl.so.2"

say_where() {
  echo "install-cuda-toolchain: $1 ($WANT) in $dest"
  echo "  NVRTC: $nvrtc"
  echo "  ptxas: $ptxas"
  echo "  NCCL:  $nccl"
  echo "  run:   SCOPE_CUDA_TOOLCHAIN=$dest cargo test --workspace --all-features --test toolchain"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$WANT" ] && [ -f "$nvrtc" ] && [ -x "$ptxas" ] && [ -f "$nccl" ]; then
  say_where "already installed"
  exit 0
fi

python=""
for candidate in python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  echo "install-cuda-toolchain: needs python3 with pip (Debian: apt-get install python3-pip)" >&2
  exit 1
fi

# Install beside the destination and move into place once complete, so an
# interrupted install never leaves a folder that looks installed.
mkdir -p "$(dirname "$dest")"
staging="$(mktemp -d "${dest}.partial.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
echo "install-cuda-toolchain: installing $WANT into $dest"
# shellcheck disable=SC2086 # WANT is three requirement words
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --no-input \
  --no-deps --only-binary=:all: --no-compile --target "$staging" $WANT </dev/null
for file in nvidia/cuda_nvrtc/lib/libnvrtc.so.12 nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.2 \
  nvidia/cuda_nvcc/bin/ptxas nvidia/nccl/lib/libnccl.so.2; do
  if [ ! -e "$staging/$file" ]; then
    echo "install-cuda-toolchain: the wheels installed no $file; their layout changed" >&2
    exit 1
  fi
done
# cudarc looks NCCL up as libnccl.so (or .so.<CUDA major>); the wheel
# ships only its soname, libnccl.so.2.
ln -sf libnccl.so.2 "$staging/nvidia/nccl/lib/libnccl.so"
echo "$WANT" >"$staging/.scope-cuda-toolchain"
chmod 755 "$staging" # mktemp made it private
rm -rf "$dest"
mv "$staging" "$dest"
trap - EXIT
say_where "installed"
