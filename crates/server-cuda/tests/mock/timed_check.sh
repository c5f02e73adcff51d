#!/bin/sh
# Build the mock driver and the mock NCCL as the tests do (scope_test's
# clib.rs: -shared -fPIC -O1 -Wall -Werror, and harness.rs's -Wextra,
# sonames, -lpthread -ldl), link timed_check.c against them, and run it.
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/scope-timed-check.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
cc=${CC:-cc}
flags="-shared -fPIC -O1 -Wall -Werror -Wextra -I$here/../../../scope-test/mock"
$cc $flags -Wl,-soname,libcuda.so -o "$out/libcuda.so" "$here/mock_cuda.c" -lpthread -ldl
$cc $flags -DSCOPE_MOCK_OLD_DRIVER -Wl,-soname,libcuda.so -o "$out/libcuda-old.so" "$here/mock_cuda.c" -lpthread -ldl
$cc $flags -Wl,-soname,libnccl.so -o "$out/libnccl.so" "$here/../../../scope-test/mock/mock_nccl.c" -lpthread -ldl
$cc -O1 -Wall -Werror -Wextra -o "$out/timed_check" "$here/timed_check.c" -L"$out" -Wl,-rpath,"$out" -lcuda -lnccl -lpthread
"$out/timed_check"
