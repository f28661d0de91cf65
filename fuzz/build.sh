#!/usr/bin/env bash
# fuzz/build.sh BUILD_DIR [OUT_DIR]: build the libFuzzer targets fuzz/fuzz_*.c with
# clang (-fsanitize=fuzzer,address,undefined) into OUT_DIR (default BUILD_DIR/fuzz).
# The code under test (models/safetensors.c, models/checkpoint.c, models/config.c,
# runtime/status.c, runtime/dtype.c) is compiled here with the sanitizers and coverage; the rest of the
# library (the model code that models/checkpoint.c refers to) is linked from the
# CMake build's BUILD_DIR/libmeshtrain.a, uninstrumented.
# Exit 0 when built, 77 when clang or its libFuzzer runtime is missing, 1 on errors.
set -euo pipefail
BUILD=${1:?usage: fuzz/build.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-$BUILD/fuzz}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CC=${MT_FUZZ_CC:-}
if [ -z "$CC" ]; then
    for c in clang-14 clang; do command -v "$c" >/dev/null && { CC=$c; break; }; done
fi
if [ -z "$CC" ]; then
    echo "fuzz/build.sh: no clang found"
    exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
        "$CC" -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
    echo "fuzz/build.sh: $CC cannot link -fsanitize=fuzzer (libclang_rt.fuzzer missing)"
    exit 77
fi
LIB="$BUILD/libmeshtrain.a"
[ -f "$LIB" ] || { echo "fuzz/build.sh: $LIB not built"; exit 1; }
mkdir -p "$OUT/obj"
CFLAGS=(-std=c11 -g -O1 -fno-omit-frame-pointer -D_POSIX_C_SOURCE=200809L -I"$SRC"
        -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)
objs=()
for f in "$SRC"/runtime/status.c "$SRC"/runtime/dtype.c "$SRC"/models/safetensors.c "$SRC"/models/checkpoint.c "$SRC"/models/config.c; do
    o="$OUT/obj/$(basename "$(dirname "$f")")_$(basename "$f" .c).o"
    "$CC" "${CFLAGS[@]}" -c "$f" -o "$o"
    objs+=("$o")
done
# The library's other dependencies (as the CMake build links them).
LIBS=(-fopenmp -lcjson -lyaml -lm -lpthread)
BLAS=$(ls /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so 2>/dev/null || true)
if [ -n "$BLAS" ]; then LIBS+=("$BLAS" -Wl,-rpath,"$(dirname "$BLAS")"); else LIBS+=(-lopenblas); fi
if nm "$LIB" 2>/dev/null | grep " U MPI_" >/dev/null; then  # no -q: pipefail + SIGPIPE
    MPI=$(ls /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so 2>/dev/null || true)
    [ -n "$MPI" ] && LIBS+=("$MPI" -Wl,-rpath,"$(dirname "$MPI")")
fi
# A CUDA build's archive refers to the CUDA runtime and NCCL (the comm layer pulls
# the NCCL backend in; cuBLASLt is dlopen'ed): link the libraries CMake found (its cache).
if nm "$LIB" 2>/dev/null | grep -E " U (cuda|nccl)" >/dev/null; then
    for v in CUDA_cudart_LIBRARY NCCL_LIBRARY; do
        l=$(sed -n "s/^$v:FILEPATH=//p" "$BUILD/CMakeCache.txt" 2>/dev/null || true)
        [ -n "$l" ] && [ -f "$l" ] && LIBS+=("$l" -Wl,-rpath,"$(dirname "$l")")
    done
    LIBS+=(-lstdc++)
fi
for t in "$SRC"/fuzz/fuzz_*.c; do
    name=$(basename "$t" .c)
    "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer "$t" "${objs[@]}" "$LIB" "${LIBS[@]}" -o "$OUT/$name"
    echo "fuzz/build.sh: built $OUT/$name"
done
