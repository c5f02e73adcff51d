#!/usr/bin/env bash
# Install etcd (Debian's etcd-server), which scope-launch's tests start on
# 127.0.0.1 to run every launch behaviour on a real etcd beside the
# launcher's own coordinator. Debian/Ubuntu only.
#
# Idempotent: with `etcd` already on PATH it changes nothing and needs no
# root; otherwise it runs `apt-get update` once and installs the package.
# Needs root, or password-less sudo. Never reads stdin. Installing starts no
# etcd: the tests start their own, on free ports, and stop it.
set -euo pipefail

if command -v etcd >/dev/null 2>&1; then
  echo "install-etcd: already installed ($(etcd --version | head -1))"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-etcd: this is not a Debian/Ubuntu system (no apt-get)." >&2
  echo "  Install an etcd v3 server (3.4 or later) so that \`etcd\` is on PATH." >&2
  exit 1
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "install-etcd: etcd is missing, and installing it needs root. Run:" >&2
    echo "  sudo $0" >&2
    exit 1
  fi
fi

echo "install-etcd: installing etcd-server"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server </dev/null
echo "install-etcd: done ($(etcd --version | head -1))"
