#!/usr/bin/env bash
# A CUDA build must not link cuBLASLt: kernels/cuda/gemm.cu dlopen's it on the first
# GEMM, because loading the library alone costs ~148 MiB of resident memory that every
# CPU-only run would pay. Checks the CLI, the shared library and a test binary for a
# DT_NEEDED entry or an undefined cublasLt* symbol. Skipped (77) in a build without CUDA.
set -euo pipefail
B=${1:?usage: test_lazy_cublaslt.sh BUILD_DIR}
if ! nm "$B/libmeshtrain.a" 2>/dev/null | grep "mt_cuda_ops_table" >/dev/null; then  # no -q: pipefail + SIGPIPE
    echo "test_lazy_cublaslt: no CUDA backend in this build"; exit 77
fi
fail=0
for f in "$B/meshtrain" "$B/libmeshtrain.so" "$B/tests/test_model"; do
    [ -e "$f" ] || { echo "missing $f"; fail=1; continue; }
    if readelf -d "$f" | grep "NEEDED.*libcublasLt" >/dev/null; then echo "FAIL: $f needs libcublasLt"; fail=1; fi
done
if nm "$B/libmeshtrain.a" | grep -E " U cublasLt" ; then echo "FAIL: libmeshtrain.a refers to cublasLt symbols"; fail=1; fi
[ $fail = 0 ] && echo "test_lazy_cublaslt: no binary links cuBLASLt"
exit $fail
