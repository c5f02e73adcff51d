#!/usr/bin/env bash
# Install AMD's hiprtc from Debian's ROCm 5.2 packages, for the `toolchain`
# test of server-hip (crates/server-hip/tests/toolchain.rs), which compiles
# every HIP kernel the project emits with it on a machine with no AMD GPU:
#
#   sudo ci/install-hip-toolchain.sh
#   SCOPE_HIP_TOOLCHAIN=/usr/lib/x86_64-linux-gnu/libamdhip64.so.5 \
#     cargo test --workspace --all-features --test toolchain
#
# ROCm 5.2 is what Debian 12 ships; the server is written to ROCm 6's ABI
# and refuses 5.2's runtime (a typed error, which the test checks), but
# 5.2's hiprtc compiles for gfx90a (MI200). It predates gfx942 (MI300), for
# which the test reports a skip. About 19 MB of packages, 80 MB installed
# (libamd-comgr2, ROCm's compiler library, is most of it).
#
# Debian/Ubuntu only. Idempotent: with every package installed it changes
# nothing and needs no root; otherwise it runs `apt-get update` once and
# installs what is missing. Needs root, or password-less sudo. Never reads
# stdin.
set -euo pipefail

PACKAGES=(
  libamdhip64-5
  libhiprtc-builtins5
)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-hip-toolchain: this is not a Debian/Ubuntu system (no dpkg/apt-get)." >&2
  echo "  Install ROCm (hiprtc) and set SCOPE_HIP_TOOLCHAIN to its libhiprtc.so.6 instead." >&2
  exit 1
fi

where() {
  local lib
  lib="$(dpkg -L libamdhip64-5 | grep '/libamdhip64\.so\.5$' | head -n1)"
  echo "  hiprtc: $lib (in the runtime, as ROCm 5 ships it)"
  echo "  run:    SCOPE_HIP_TOOLCHAIN=$lib cargo test --workspace --all-features --test toolchain"
}

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-hip-toolchain: already installed (${PACKAGES[*]})"
  where
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "install-hip-toolchain: missing ${missing[*]}, and installing needs root. Run:" >&2
    echo "  sudo $0" >&2
    exit 1
  fi
fi

echo "install-hip-toolchain: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
echo "install-hip-toolchain: done"
where
