#!/usr/bin/env bash
# The @BACKEND@ device checks of scope, built elsewhere by
# `cargo xtask bundle --backend @BACKEND@` from commit @COMMIT@.
#
# Runs on a machine with the device and no Rust: unpacks the test and bench
# binaries, runs every test with SCOPE_REQUIRE=@BACKEND@ (a missing device
# fails instead of skipping), then the bench, and writes tests.log,
# bench.log and summary.txt to $OUT (or ./out beside this script).
# Exit status: 0 when every test binary passed and the bench ran; 1 when
# one failed; else 2 when the time budget (SCOPE_BUNDLE_SECONDS) left some
# unrun; 3 when nothing could run (the bundle would not unpack, the glibc
# is too old, or, for CUDA, there is no driver — said before any test, with
# the driver's, NVRTC's and the PTX ISA versions).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
work="$(mktemp -d /tmp/scope-bundle.XXXXXX)"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

say "scope @BACKEND@ device checks, commit @COMMIT@, $(date -u +%FT%TZ)"
tar -xJf "$here/bundle.tar.xz" -C "$work" || { say "could not unpack the bundle"; exit 3; }

# The binaries were linked against glibc @GLIBC@; an older one cannot run them.
have="$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')"
need="@GLIBC@"
if [ -n "$have" ] && [ "$need" != unknown ] &&
   [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  say "glibc here is $have; the bundle needs $need: rebuild it on an older system"
  exit 3
fi
say "glibc $have (bundle needs $need)"

export SCOPE_REQUIRE=@BACKEND@ RUST_BACKTRACE=1 CARGO_TERM_COLOR=never
export XDG_RUNTIME_DIR="$work/xdg"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

# Runtime compilers are found by soname: put the toolkit's and the Python
# wheels' library folders on the search path (the driver's is there already).
libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /opt/rocm/lib; do
  [ -d "$d" ] && libs="$libs:$d"
done
for f in $(find /usr/local/lib /usr/lib /opt -name 'libnvrtc.so*' -o -name 'libhiprtc.so*' 2>/dev/null | head -20); do
  libs="$libs:$(dirname "$f")"
done
# The CUDA bundle carries NVRTC @NVRTC@ (NVIDIA's wheel, in lib/), whose PTX
# (ISA @PTX_ISA@) every driver from CUDA @NVRTC@ on JITs. A driver JITs PTX
# of its own CUDA release's ISA and older, never newer, so this machine's
# own NVRTC is used only where the probe (bin/probe-cuda-versions: the
# server's own NVRTC call, and cuDriverGetVersion) says the driver JITs what
# it writes; otherwise the bundle's, first on the path (it holds the
# libnvrtc.so name the server looks up first, so no other NVRTC is found
# before it). The versions are printed before any test.
first=""
if [ "@BACKEND@" = cuda ]; then
  probe="$work/bin/probe-cuda-versions"
  if command -v nvidia-smi >/dev/null 2>&1; then
    say "nvidia-smi: $(nvidia-smi 2>/dev/null | grep -oE 'Driver Version: [0-9.]+ +CUDA Version: [0-9.]+' | head -1 | tr -s ' ')"
  else
    say "nvidia-smi: none on this machine"
  fi
  own=""
  ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so' && own=yes
  for d in ${libs//:/ }; do
    ls "$d"/libnvrtc.so* >/dev/null 2>&1 && own=yes
  done
  verdict=3
  if [ -n "$own" ]; then
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$libs" "$probe" >"$work/probe.txt" 2>&1
    verdict=$?
    sed 's/^/  this machine: /' "$work/probe.txt" | tee -a "$summary"
  fi
  if [ "$verdict" -eq 0 ] || [ "$verdict" -eq 4 ]; then
    say "NVRTC: this machine's (its PTX the driver JITs)"
  elif [ -d "$work/lib" ]; then
    first="$work/lib:"
    LD_LIBRARY_PATH="$first${LD_LIBRARY_PATH:-}$libs" "$probe" >"$work/probe.txt" 2>&1
    verdict=$?
    sed 's/^/  the bundle: /' "$work/probe.txt" | tee -a "$summary"
    if [ -n "$own" ]; then
      say "NVRTC: the bundle's @NVRTC@ (the driver cannot JIT this machine's NVRTC's PTX)"
    else
      say "NVRTC: the bundle's @NVRTC@ (none on this machine)"
    fi
  else
    say "NVRTC: none usable, and the bundle carries none (ci/install-cuda-toolchain.sh was not run where it was built)"
  fi
  case "$verdict" in
    0) ;;
    2) say "no CUDA driver on this machine: nothing to check"; rm -rf "$work"; exit 3 ;;
    *) say "the driver cannot load what NVRTC writes: every CUDA C++ kernel would fail (see above)" ;;
  esac
fi
# The collectives' library (NCCL for CUDA, RCCL for HIP) is too large to
# travel in the bundle (NCCL is 250 MB). Where this machine has it, its
# folder joins the search path and SCOPE_REQUIRE names it, so that a library
# present but refused fails; where it has none, the collectives tests print
# `skipped: no <library> device` and count as skipped.
case "@BACKEND@" in
  cuda) collectives=nccl ;;
  hip) collectives=rccl ;;
  *) collectives="" ;;
esac
if [ -n "$collectives" ]; then
  found="$(ldconfig -p 2>/dev/null | grep -oE "/[^ ]*lib${collectives}\.so[.0-9]*" | head -1)"
  [ -n "$found" ] || found="$(find /usr/local /usr/lib /opt -name "lib${collectives}.so*" 2>/dev/null | head -1)"
  if [ -n "$found" ]; then
    libs="$libs:$(dirname "$found")"
    export SCOPE_REQUIRE="$SCOPE_REQUIRE,$collectives"
    say "$collectives: $found (required)"
  else
    say "$collectives: none on this machine (its tests skip)"
  fi
fi
export LD_LIBRARY_PATH="$first${LD_LIBRARY_PATH:-}$libs"

{
  echo "== machine"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v rocm-smi >/dev/null && rocm-smi --showproductname
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} 2>&1 | tee -a "$summary"

# One budget for the whole run (SCOPE_BUNDLE_SECONDS, 540 by default), so
# that it ends inside a GPU machine's time limit with its logs written: the
# server's own tests run first, then the demo runtime's, scope-cube's, and
# cubecl's; a binary the budget does not reach is reported as not run, and
# the run as incomplete — never as passed.
budget="${SCOPE_BUNDLE_SECONDS:-540}"
started=$(date +%s)
left() { echo $((budget - ($(date +%s) - started))); }
broke=0 incomplete=0
cd "$work/bin"
ordered="$(ls test-server-* 2>/dev/null; ls test-tiny-runtime-* 2>/dev/null;
  ls test-scope-cube-* 2>/dev/null; ls test-* | grep -vE '^test-(server|tiny-runtime|scope-cube)-')"
for t in $ordered; do
  remaining=$(left)
  if [ "$remaining" -lt 30 ]; then
    say "$(printf '%-44s not run: the budget of %ss is spent' "$t" "$budget")"
    incomplete=1
    continue
  fi
  echo "== $t" | tee -a "$out/tests.log"
  timeout $((remaining < 240 ? remaining : 240)) "./$t" --nocapture >"$work/$t.log" 2>&1
  rc=$?
  cat "$work/$t.log" >>"$out/tests.log"
  # Counted from the harness's own lines only: a test's output may say
  # "3 failed" of something else.
  passed=$(grep -E '^test result:' "$work/$t.log" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
  failed=$(grep -E '^test result:' "$work/$t.log" | grep -oE '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
  skipped=$(grep -c 'skipped: no ' "$work/$t.log")
  # Tests that passed having done nothing on the device (cubecl's runtime
  # tests that returned early for a missing feature, or marked not run).
  unexercised=$(grep -cE '^[[:space:]]*not (exercised|run):' "$work/$t.log")
  say "$(printf '%-44s rc=%-3s %4s passed %4s failed %4s skip lines %4s of the passed not exercised' \
    "$t" "$rc" "$passed" "$failed" "$skipped" "$unexercised")"
  [ "$rc" -eq 0 ] || broke=1
  # Each failure's panic site and message, the first few.
  grep -A1 'panicked at' "$work/$t.log" | grep -v '^--$' | head -12 | tee -a "$summary"
done

nobench=0
if ! ls bench-* >/dev/null 2>&1; then
  say "no bench in this bundle (built with SCOPE_BUNDLE_NO_BENCH): its figures are not measured"
  nobench=1
fi
for b in bench-*; do
  [ -e "$b" ] || continue
  remaining=$(left)
  if [ "$remaining" -lt 30 ]; then
    say "$(printf '%-44s not run: the budget of %ss is spent' "$b" "$budget")"
    incomplete=1
    continue
  fi
  echo "== $b" | tee -a "$out/bench.log"
  timeout $((remaining < 300 ? remaining : 300)) "./$b" --bench 2>&1 | tee -a "$out/bench.log"
  rc=${PIPESTATUS[0]}
  say "$(printf '%-44s rc=%s' "$b" "$rc")"
  [ "$rc" -eq 0 ] || broke=1
done

[ $incomplete -eq 0 ] || say "not every check ran: the budget ran out (SCOPE_BUNDLE_SECONDS)"
[ $nobench -eq 0 ] || incomplete=1
if [ $broke -ne 0 ]; then
  say "device checks: FAILED"; status=1
elif [ $incomplete -ne 0 ]; then
  say "device checks: INCOMPLETE"; status=2
else
  say "device checks: ok"; status=0
fi
rm -rf "$work"
exit $status
