#!/bin/sh
# Build the mock HIP runtime and the kit's mock NCCL as its RCCL, as the
# tests do (scope_test's clib.rs: -shared -fPIC -O1 -Wall -Werror; the
# RCCL with SCOPE_MOCK_DRIVER naming the runtime, -lpthread -ldl), link
# hip_timed_check.c against them, and run it.
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/scope-hip-timed-check.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
cc=${CC:-cc}
flags="-shared -fPIC -O1 -Wall -Werror -I$here/../../../scope-test/mock"
$cc $flags -Wl,-soname,libscope_mock_hip.so -o "$out/libscope_mock_hip.so" "$here/mock_hip.c"
$cc $flags "-DSCOPE_MOCK_DRIVER=\"$out/libscope_mock_hip.so\"" -Wl,-soname,libscope_mock_rccl.so \
  -o "$out/libscope_mock_rccl.so" "$here/../../../scope-test/mock/mock_nccl.c" -lpthread -ldl
$cc -O1 -Wall -Werror -Wextra -o "$out/hip_timed_check" "$here/hip_timed_check.c" -L"$out" -Wl,-rpath,"$out" \
  -l:libscope_mock_hip.so -l:libscope_mock_rccl.so -lpthread
"$out/hip_timed_check"
