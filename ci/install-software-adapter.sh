#!/usr/bin/env bash
# Install Mesa's software Vulkan driver (lavapipe) and what the wgpu and
# Vulkan servers need around it, so their tests run on a machine without a
# GPU instead of skipping. Debian/Ubuntu only. `cargo xtask demo|test|ci`
# run this before building when one of the first three is missing here.
#
# Idempotent: when every package is already installed it changes nothing and
# needs no root; otherwise it runs `apt-get update` once and installs only
# what is missing. Needs root, or password-less sudo. Never reads stdin.
set -euo pipefail

PACKAGES=(
  mesa-vulkan-drivers     # lavapipe (lvp_icd.*.json)
  libvulkan1              # the Vulkan loader, libvulkan.so.1
  vulkan-validationlayers # VK_LAYER_KHRONOS_validation, which server-vulkan's tests run under
  libegl1                 # EGL, for wgpu on GL (llvmpipe)
  libegl-mesa0
  libgl1-mesa-dri
)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-software-adapter: this is not a Debian/Ubuntu system (no dpkg/apt-get)." >&2
  echo "  Install your distribution's Mesa Vulkan drivers (lavapipe) and the Vulkan loader instead." >&2
  exit 1
fi

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-software-adapter: already installed (${PACKAGES[*]})"
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "install-software-adapter: missing ${missing[*]}, and installing needs root. Run:" >&2
    echo "  sudo $0" >&2
    exit 1
  fi
fi

echo "install-software-adapter: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
echo "install-software-adapter: done"
