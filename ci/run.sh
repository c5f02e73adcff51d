#!/usr/bin/env bash
# What CI runs: make sure a software Vulkan adapter and the real CUDA and
# HIP compilers are there, give Mesa a private runtime directory, and run
# `cargo xtask ci` (fmt, clippy, doc, every test that can run here, a smoke
# run of each bench).
#
# Works from a fresh clone, with no stdin and CI=true. Under CI a software
# adapter that cannot be installed is an error: without one the Vulkan and
# wgpu tests would pass by skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ci/install-software-adapter.sh </dev/null; then
  if [ "${CI:-}" = "true" ]; then
    echo "ci/run.sh: the software adapter could not be installed; refusing to run the device tests as skips" >&2
    exit 1
  fi
  echo "ci/run.sh: carrying on without a software adapter; device tests will skip" >&2
fi

# The real CUDA and HIP compilers for the toolchain rows (no GPU needed):
# every CUDA and HIP kernel the project emits is compiled by them.
for installer in ci/install-cuda-toolchain.sh ci/install-hip-toolchain.sh; do
  if ! "$installer" </dev/null; then
    if [ "${CI:-}" = "true" ]; then
      echo "ci/run.sh: $installer failed; refusing to run its toolchain row as a skip" >&2
      exit 1
    fi
    echo "ci/run.sh: carrying on without $installer's compilers; its toolchain row will skip" >&2
  fi
done

# etcd, for scope-launch's tests on a real etcd (they start their own on
# 127.0.0.1); without it they skip, and under CI=true they fail.
if ! ci/install-etcd.sh </dev/null; then
  if [ "${CI:-}" = "true" ]; then
    echo "ci/run.sh: ci/install-etcd.sh failed; refusing to run the etcd tests as skips" >&2
    exit 1
  fi
  echo "ci/run.sh: carrying on without etcd; scope-launch's etcd tests will skip" >&2
fi

XDG_RUNTIME_DIR="$(mktemp -d "${TMPDIR:-/tmp}/scope-xdg.XXXXXX")"
chmod 700 "$XDG_RUNTIME_DIR"
export XDG_RUNTIME_DIR
trap 'rm -rf "$XDG_RUNTIME_DIR"' EXIT

if ! command -v cargo >/dev/null 2>&1; then
  echo "ci/run.sh: cargo is not on PATH; install Rust with rustup (https://rustup.rs)" >&2
  exit 1
fi

# Plain output for logs; rust-toolchain.toml picks the compiler.
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export CARGO_TERM_PROGRESS_WHEN="${CARGO_TERM_PROGRESS_WHEN:-never}"
# A clean clone builds once: incremental caches would only cost time and
# disk (gigabytes, beside each workspace crate's test binaries).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo --version
cargo xtask ci </dev/null
