#!/usr/bin/env bash
# bench/gpu_check.sh OUTDIR: the device check of issue 4, for an H200 machine that has
# the CUDA toolkit, a C compiler and CMake but no package registry.
#
#   1. unpack gpu-debs/*.deb (scripts/fetch-gpu-debs.sh, run beforehand where apt
#      works; with the device tool, name gpu-debs in `carry`) into a private prefix
#      with `dpkg -x` (or ar + tar), installing nothing;
#   2. configure and build against that prefix: CMAKE_PREFIX_PATH, pkg-config
#      restricted to the prefix's .pc files (PKG_CONFIG_LIBDIR + SYSROOT_DIR), OpenBLAS
#      and cblas.h named explicitly, and an RPATH (old-style, so that Criterion's own
#      dependencies resolve too) instead of LD_LIBRARY_PATH, which would also hand the
#      prefix's libraries to the compilers;
#   3. run the gpu-labelled tests (OUTDIR/gpu_tests.log);
#   4. run bench/gpu_bench: OUTDIR/gemm.json, attention.json, step.json;
#   5. OUTDIR/check.json: what passed, with timings.
# Seven files in all (build.log, gpu_tests.log, gpu_bench.log, three benchmark JSON files,
# check.json): the device tool returns at most eight.
# Sized for under 8 minutes on one H200 (16 cores): the CUDA build is for sm_90a only.
# Environment: MT_GPU_DEBS (default <repo>/gpu-debs), MT_GPU_PREFIX, MT_GPU_BUILD,
# MT_GPU_CHECK_CONFIGURE_ONLY=1 (stop after configuring: the part that can be tested
# on a machine without a GPU), MT_GPU_CHECK_CUDA=OFF (configure without CUDA).
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: bench/gpu_check.sh OUTDIR" >&2; exit 2; fi
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" && out=$(cd "$1" && pwd)
debs=${MT_GPU_DEBS:-$src/gpu-debs}
prefix=${MT_GPU_PREFIX:-/tmp/mt-gpu-prefix}
build=${MT_GPU_BUILD:-/tmp/mt-gpu-build}
cuda=${MT_GPU_CHECK_CUDA:-ON}
t0=$(date +%s)
log() { echo "gpu_check [$(($(date +%s) - t0)) s]: $*"; }
fail() { log "FAIL: $*"; printf '{"ok": false, "stage": "%s", "seconds": %d}\n' "$1" $(($(date +%s) - t0)) > "$out/check.json"; exit 1; }

# ---- 1. the prefix
ls "$debs"/*.deb > /dev/null 2>&1 || fail "debs" "no .deb files in $debs (run scripts/fetch-gpu-debs.sh)"
rm -rf "$prefix" && mkdir -p "$prefix"
for f in "$debs"/*.deb; do
  if command -v dpkg > /dev/null; then
    dpkg -x "$f" "$prefix" || fail "unpack" "dpkg -x $f"
  else # a .deb is an ar archive holding data.tar.*
    (d=$(mktemp -d) && cd "$d" && ar x "$f" && tar -xf data.tar.* -C "$prefix" && rm -rf "$d") || fail "unpack" "$f"
  fi
done
arch=x86_64-linux-gnu
L=$prefix/usr/lib/$arch
log "unpacked $(ls "$debs"/*.deb | wc -l) packages into $prefix"

# pkg-config: the machine's own if it has one, else the prefix's pkgconf (wrapped so that
# only it sees the prefix's libraries); either way it reads only the prefix's .pc files.
export PKG_CONFIG_LIBDIR=$L/pkgconfig:$prefix/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$prefix
pkgcfg=$(command -v pkg-config || true)
if [ -z "$pkgcfg" ]; then
  pkgcfg=$prefix/pkg-config
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$L" "$prefix/usr/bin/pkgconf" > "$pkgcfg"
  chmod +x "$pkgcfg"
fi
"$pkgcfg" --cflags --libs yaml-0.1 libcjson > /dev/null || fail "pkg-config" "yaml-0.1 / libcjson not found in the prefix"

# ---- 2. configure and build
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
rp="-Wl,--disable-new-dtags -Wl,-rpath,$L -Wl,-rpath,$L/openblas-openmp -Wl,-rpath-link,$L"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DMESHTRAIN_CUDA="$cuda" -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgcfg" \
  -DOPENBLAS_LIBRARY="$L/openblas-openmp/libopenblas.so" \
  -DCBLAS_INCLUDE_DIR="$prefix/usr/include/$arch/openblas-openmp" \
  -DCMAKE_C_FLAGS="-isystem $prefix/usr/include" \
  -DCMAKE_EXE_LINKER_FLAGS="$rp" -DCMAKE_SHARED_LINKER_FLAGS="$rp" \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; fail "configure" "see build.log"; }
grep -q "CUDA backend:" "$out/build.log" && log "configured with CUDA" || log "configured WITHOUT CUDA"
if [ "${MT_GPU_CHECK_CONFIGURE_ONLY:-0}" = 1 ]; then
  printf '{"ok": true, "stage": "configure", "seconds": %d}\n' $(($(date +%s) - t0)) > "$out/check.json"
  log "configure-only: done"; exit 0
fi
jobs=$(nproc 2>/dev/null || echo 4)
cmake --build "$build" -j"$jobs" >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; fail "build" "see build.log"; }
log "built"
# ---- 3. gpu tests (a test that exits 77 counts as skipped: no device)
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | tee "$out/gpu_tests.log"
(cd "$build" && ctest -L gpu --output-on-failure --timeout 300) >> "$out/gpu_tests.log" 2>&1
trc=$?
tail -15 "$out/gpu_tests.log"
if grep -q "(Skipped)" "$out/gpu_tests.log"; then log "gpu tests were SKIPPED (no device visible?)"; trc=77; fi
log "gpu tests: rc $trc"

# ---- 4. benchmarks
"$build/bench/gpu_bench" "$out" "$src" > "$out/gpu_bench.log" 2>&1
brc=$?
tail -5 "$out/gpu_bench.log"
log "gpu_bench: rc $brc"
for f in gemm attention step; do [ -f "$out/$f.json" ] && cat "$out/$f.json"; done

# ---- 5. summary
ok=false; [ $trc = 0 ] && [ $brc = 0 ] && ok=true
printf '{"ok": %s, "stage": "done", "tests_rc": %d, "bench_rc": %d, "seconds": %d}\n' \
  "$ok" $trc $brc $(($(date +%s) - t0)) > "$out/check.json"
cat "$out/check.json"
[ "$ok" = true ]
