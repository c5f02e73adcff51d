#!/usr/bin/env bash
# Install the pieces of NVIDIA's CUDA 13.0 toolchain that need no GPU —
# NVRTC (libnvrtc.so.13, what server-cuda compiles CUDA C++ with), ptxas
# (the PTX assembler the driver's JIT is built on) and NCCL (libnccl.so.2,
# the collectives library) — from NVIDIA's PyPI wheels into a folder of the
# build tree, for the `toolchain` test of server-cuda
# (crates/server-cuda/tests/toolchain.rs):
#
#   ci/install-cuda-toolchain.sh            # into target/cuda-toolchain
#   ci/install-cuda-toolchain.sh DIR        # into DIR
#   SCOPE_CUDA_TOOLCHAIN=target/cuda-toolchain \
#     cargo test --workspace --all-features --test toolchain
#
# Why 13.0.88: server-cuda is built on cudarc's `cuda-13000` bindings, and
# the PTX a 13.0 NVRTC writes (ISA 9.0) is what every 13.x driver JITs; a
# 13.1+ NVRTC writes a newer PTX ISA that a 13.0 driver refuses. 13.0.88 is
# the last 13.0 release of both wheels (CUDA 13.0 Update 1/2).
#
# Changes nothing outside DIR: `pip install --target DIR --no-deps`, no
# system packages, no root needed (it works as root too), never reads
# stdin. Idempotent: when DIR already holds these versions it only says
# where they are. Needs python3 with pip, and network access to PyPI
# (about 330 MB of wheels; about 700 MB installed).
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_VERSION=13.0.88
NVCC_VERSION=13.0.88
# NCCL for the collectives' device transport: 2.30, the newest release
# cudarc 0.19's bindings name (`nccl-02030`).
NCCL_VERSION=2.30.7
WANT="nvidia-cuda-nvrtc==${NVRTC_VERSION} nvidia-cuda-nvcc==${NVCC_VERSION} nvidia-nccl-cu13==${NCCL_VERSION}"

target_dir="${CARGO_TARGET_DIR:-target}"
dest="${1:-${target_dir}/cuda-toolchain}"
case "$dest" in
  /*) ;;
  *) dest="$PWD/$dest" ;;
esac
stamp="$dest/.scope-cuda-toolchain"
nvrtc="$dest/nvidia/cu13/lib/libnvrtc.so.13"
ptxas="$dest/nvidia/cu13/bin/ptxas"
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
# shellcheck disable=SC2086 # WANT is two requirement words
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --no-input \
  --no-deps --only-binary=:all: --no-compile --target "$staging" $WANT </dev/null
for file in nvidia/cu13/lib/libnvrtc.so.13 nvidia/cu13/bin/ptxas nvidia/nccl/lib/libnccl.so.2; do
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
