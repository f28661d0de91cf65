#!/usr/bin/env bash
# bench/gpu_check.sh OUTDIR: the device check of issues 4 and 12, for an H200 machine that
# has the CUDA toolkit, a C compiler, CMake and ninja but no package registry.
#
#   1. preflight (OUTDIR/preflight.log, a summary on stdout): OS, kernel, CPUs, memory,
#      compilers, cmake/make/ninja, nvcc, nvidia-smi, compute-sanitizer, NCCL (toolkit
#      and pip wheel), MPI, the .deb files;
#   2. unpack gpu-debs/*.deb (scripts/fetch-gpu-debs.sh, run beforehand where apt works;
#      with the device tool, name gpu-debs in `carry`) into a private prefix with
#      `dpkg -x` (or ar + tar), installing nothing;
#   3. configure (make, or ninja where make is absent) and build against that prefix:
#      pkg-config restricted to the prefix's .pc files, OpenBLAS and cblas.h named
#      explicitly, an old-style RPATH (so that Criterion's own dependencies resolve too)
#      instead of LD_LIBRARY_PATH. NCCL: NCCL_HOME if set, else the toolkit's, else the
#      nvidia-nccl-cu13 wheel of python3 (lib/libnccl.so.2, passed to CMake by path);
#   4. `ctest -L gpu` (OUTDIR/gpu_tests.log): test_gpu_ops, test_gpu_nccl (its multi-rank
#      part needs 2 GPUs and mpirun: reported skipped, not failed);
#   5. bench/gpu_bench, its gemm/attention/step JSON merged into OUTDIR/bench.json;
#   6. compute-sanitizer memcheck then racecheck over test_gpu_ops (small shapes
#      throughout; MT_GPU_SANITIZE_FILTER passes a Criterion --filter) (sanitizer.log);
#   7. OUTDIR/check.json, written on every exit: each stage's status (ok, failed,
#      skipped), seconds and figures, and the benchmark figures.
# At most seven files (preflight.log, build.log, gpu_tests.log, gpu_bench.log,
# sanitizer.log, bench.json, check.json): the device tool returns at most eight.
# Every stage runs under `timeout`, capped by what is left of MT_GPU_CHECK_BUDGET (420 s;
# 1080 s in dry mode) so that the run stays well under 8 minutes on one H200: the CUDA
# build is for sm_90a only, without the CPU emulator of the CUDA kernels (tests/cudaemu).
# Environment: MT_GPU_DEBS (default <repo>/gpu-debs), MT_GPU_PREFIX, MT_GPU_BUILD,
# MT_GPU_CHECK_CONFIGURE_ONLY=1 (stop after configuring), MT_GPU_CHECK_DRY=1 (preflight,
# configure, build and `ctest -L gpu`, no sanitizer or benchmark: what a machine without
# a GPU can run; there the GPU tests exit 77 and are reported skipped),
# MT_GPU_CHECK_CUDA=OFF (configure without CUDA), MT_GPU_NCCL=wheel (prefer the wheel's
# NCCL to the toolkit's).
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: bench/gpu_check.sh OUTDIR" >&2; exit 2; fi
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" && out=$(cd "$1" && pwd)
rm -f "$out"/{preflight,build,gpu_tests,gpu_bench,sanitizer}.log "$out"/{bench,check}.json
debs=${MT_GPU_DEBS:-$src/gpu-debs}
prefix=${MT_GPU_PREFIX:-/tmp/mt-gpu-prefix}
build=${MT_GPU_BUILD:-/tmp/mt-gpu-build}
mode=full blim=240
[ "${MT_GPU_CHECK_DRY:-0}" = 1 ] && mode=dry blim=900 # a dry build on a small machine
budget=${MT_GPU_CHECK_BUDGET:-$((blim + 180))}
[ "${MT_GPU_CHECK_CONFIGURE_ONLY:-0}" = 1 ] && mode=configure-only
t0=$(date +%s)
now() { echo $(($(date +%s) - t0)); }
log() { echo "gpu_check [$(now) s]: $*"; }
# A stage's time limit: its own, capped by what is left of the budget (1: none left;
# never 0, which would tell `timeout` to wait for ever).
lim() { local l=$((budget - $(now))); [ $l -lt 5 ] && l=1; [ "$1" -lt $l ] && l=$1; echo $l; }

# ---- check.json: one entry per stage, written by the EXIT trap whatever happens
stages=() failed=0
st() { # st NAME STATUS SECONDS [NOTE [EXTRA_JSON]]
  local e="\"$1\": {\"status\": \"$2\", \"seconds\": $3"
  [ -n "${4:-}" ] && e+=", \"note\": \"${4//\"/\'}\""
  [ -n "${5:-}" ] && e+=", $5"
  stages+=("$e}"); [ "$2" = failed ] && failed=1
  log "$1: $2${4:+ ($4)}"
}
finish() {
  local figs=null ok=true IFS=,
  [ -s "$out/bench.json" ] && figs=$(cat "$out/bench.json")
  command -v python3 > /dev/null && ! python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figs" 2> /dev/null &&
    figs='"bench.json is not valid JSON"'
  [ $failed = 0 ] || ok=false
  printf '{"ok": %s, "mode": "%s", "seconds": %d, "gpus": %d,\n "stages": {%s},\n "figures": %s}\n' \
    "$ok" "$mode" "$(now)" "${ngpu:-0}" "${stages[*]}" "$figs" > "$out/check.json"
  log "$(ls "$out" | wc -l) files in $out; $([ $failed = 0 ] && echo OK || echo FAILED)"
}
trap finish EXIT
stop() { st "$@"; tail -30 "$out/build.log" 2>/dev/null; exit 1; } # a stage after which nothing can run

# ---- 1. preflight
kv() { printf '%-18s %s\n' "$1:" "$2" | tee -a "$out/preflight.log"; }
det() { { echo "---- $1"; shift; timeout 20 "$@" 2>&1; } >> "$out/preflight.log"; }
ver() { command -v "$1" > /dev/null && echo "$(command -v "$1"): $(timeout 10 "$1" --version 2>&1 | grep -m1 .)" || echo none; }
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
cudadir=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
san=$(command -v compute-sanitizer || ls "$cudadir"/compute-sanitizer/compute-sanitizer 2> /dev/null || true)
wheel=$(timeout 20 python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null || true)
# the wheel's nccl.h and libnccl.so.2 (nvidia/nccl/include, nvidia/nccl/lib); "." if none
winc=$(dirname "$(find "${wheel:-/nonexistent}" -name nccl.h 2> /dev/null | head -1)")
wlib=$(dirname "$(find "${wheel:-/nonexistent}" -name libnccl.so.2 2> /dev/null | head -1)")
ngpu=$(timeout 15 nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
kv os "$(. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME")"
kv kernel "$(uname -srm)"
kv cpus "$(nproc)"
kv memory "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
for c in gcc g++ cc cmake make ninja; do kv "$c" "$(ver $c)"; done
kv nvcc "$(ver nvcc | sed 's/: .*//') $(nvcc --version 2> /dev/null | grep -o 'release [0-9.]*, V[0-9.]*'), toolkit $cudadir"
kv nvidia-smi "$ngpu GPU(s): $(timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null | paste -sd';')"
kv compute-sanitizer "${san:-none} $([ -n "$san" ] && timeout 10 "$san" --version | grep -m1 -i version)"
kv nccl-toolkit "$(ls "$cudadir"/include/nccl.h "$cudadir"/lib64/libnccl.so* "$cudadir"/targets/*/lib/libnccl.so* 2> /dev/null | paste -sd' ')"
kv nccl-wheel "${wheel:-none} $(cd "${wheel:-/nonexistent}" 2> /dev/null && find . -name nccl.h -o -name 'libnccl.so*' | sort | paste -sd' ')"
kv nccl-home "${NCCL_HOME:-unset}"
kv mpi "$(ver mpirun); mpicc: $(command -v mpicc || echo none)"
kv gpu-debs "$(ls "$debs"/*.deb 2> /dev/null | wc -l) .deb files in $debs"
det "/etc/os-release" cat /etc/os-release; det "nvcc --version" nvcc --version
det "nvidia-smi" nvidia-smi; det "gpu-debs" ls -l "$debs"; det "python3" python3 --version
st preflight ok "$(now)"

# ---- 2. the prefix
s=$(now)
ls "$debs"/*.deb > /dev/null 2>&1 || stop debs failed 0 "no .deb files in $debs (run scripts/fetch-gpu-debs.sh)"
rm -rf "$prefix" && mkdir -p "$prefix"
for f in "$debs"/*.deb; do
  if command -v dpkg > /dev/null; then dpkg -x "$f" "$prefix" || stop debs failed $(($(now) - s)) "dpkg -x $f"
  else # a .deb is an ar archive holding data.tar.*
    (d=$(mktemp -d) && cd "$d" && ar x "$f" && tar -xf data.tar.* -C "$prefix" && rm -rf "$d") || stop debs failed $(($(now) - s)) "unpack $f"
  fi
done
arch=x86_64-linux-gnu L=$prefix/usr/lib/$arch
# pkg-config: the machine's own if it has one, else the prefix's pkgconf (wrapped so that
# only it sees the prefix's libraries); either way it reads only the prefix's .pc files.
export PKG_CONFIG_LIBDIR=$L/pkgconfig:$prefix/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
pkgcfg=$(command -v pkg-config || true)
if [ -z "$pkgcfg" ]; then
  pkgcfg=$prefix/pkg-config
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$L" "$prefix/usr/bin/pkgconf" > "$pkgcfg" && chmod +x "$pkgcfg"
fi
"$pkgcfg" --cflags --libs yaml-0.1 libcjson > /dev/null || stop debs failed $(($(now) - s)) "yaml-0.1 / libcjson not in the prefix"
st debs ok $(($(now) - s)) "$(ls "$debs"/*.deb | wc -l) packages"

# ---- 3. configure and build
s=$(now)
rp="-Wl,--disable-new-dtags -Wl,-rpath,$L -Wl,-rpath,$L/openblas-openmp -Wl,-rpath-link,$L"
nccl=() nsrc=${NCCL_HOME:+NCCL_HOME}; nsrc=${nsrc:-toolkit}
if [ -z "${NCCL_HOME:-}" ] && [ "$winc" != . ] && [ "$wlib" != . ] &&
   { [ "${MT_GPU_NCCL:-}" = wheel ] || ! ls "$cudadir"/include/nccl.h > /dev/null 2>&1; }; then
  nccl=(-DNCCL_INCLUDE_DIR="$winc" -DNCCL_LIBRARY="$wlib/libnccl.so.2") nsrc=wheel
  rp+=" -Wl,-rpath,$wlib"
fi
gen=Unix\ Makefiles
command -v make > /dev/null || gen=Ninja
grep -qs "CMAKE_GENERATOR:INTERNAL=$gen\$" "$build/CMakeCache.txt" || rm -rf "$build"
timeout "$(lim 120)" cmake -S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DMESHTRAIN_CUDA="${MT_GPU_CHECK_CUDA:-ON}" -DCMAKE_CUDA_ARCHITECTURES=90a -DMESHTRAIN_CUDAEMU=OFF "${nccl[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgcfg" \
  -DOPENBLAS_LIBRARY="$L/openblas-openmp/libopenblas.so" \
  -DCBLAS_INCLUDE_DIR="$prefix/usr/include/$arch/openblas-openmp" \
  -DCMAKE_C_FLAGS="-isystem $prefix/usr/include" \
  -DCMAKE_EXE_LINKER_FLAGS="$rp" -DCMAKE_SHARED_LINKER_FLAGS="$rp" \
  > "$out/build.log" 2>&1 || stop configure failed $(($(now) - s)) "see build.log"
cu=$(grep -q "CUDA backend:" "$out/build.log" && echo true || echo false)
nlib=$(sed -n 's/^-- NCCL: //p' "$out/build.log")
st configure ok $(($(now) - s)) "$gen; NCCL ($nsrc): ${nlib:-not looked for}" "\"cuda\": $cu"
[ $mode = configure-only ] && { log "configure-only: done"; exit 0; }
s=$(now)
k=-k; [ "$gen" = Ninja ] && k="-k 0" # keep going: a broken target leaves the others to run
timeout "$(lim $blim)" cmake --build "$build" -j"$(nproc)" -- $k >> "$out/build.log" 2>&1
rc=$?
if [ $rc = 0 ]; then st build ok $(($(now) - s))
else st build failed $(($(now) - s)) "rc $rc$([ $rc = 124 ] && echo ' (timeout)'), $(grep -c 'error:' "$out/build.log") errors, see build.log; running what was built"
  grep -m5 'error:' "$out/build.log"; fi

# ---- 4. gpu tests: a test that exits 77 is skipped (no device, no NCCL)
s=$(now)
(cd "$build" && timeout "$(lim 180)" ctest -L gpu -V --timeout "$(lim 150)") > "$out/gpu_tests.log" 2>&1
rc=$?
# a test's ctest result line, "Test  #44: test_gpu_nccl ....***Skipped   0.05 sec": "Skipped 0.05"
res() { sed -n "s/.*Test *#[0-9]*: $1 \.* *\**\([A-Za-z]*\) *\([0-9.]*\) sec.*/\1 \2/p" "$out/gpu_tests.log" | tail -1; }
tst() { # tst STAGE TEST: a stage from one test's result
  local r t; read -r r t <<< "$(res "$2")"
  case "$r" in Passed) r=ok;; Skipped) r=skipped;; "") r=failed t=0;; *) r=failed;; esac
  st "$1" $r "${t:-0}" "$(res "$2")"
}
np=$(grep -c 'Test *#.*Passed' "$out/gpu_tests.log") ns=$(grep -c 'Test *#.*Skipped' "$out/gpu_tests.log")
r=failed; [ $rc = 0 ] && r=ok; [ $rc = 0 ] && [ "$np" = 0 ] && r=skipped
st gpu_tests $r $(($(now) - s)) "ctest rc $rc" "\"passed\": $np, \"skipped\": $ns"
tst test_gpu_ops test_gpu_ops
if [ "$nlib" = "not found (device communicators disabled)" ]; then st nccl skipped 0 "no NCCL in the build"
else tst nccl test_gpu_nccl; fi
if [ "$(res test_gpu_nccl | cut -d' ' -f1)" = Passed ] && ! grep -q "multi-rank NCCL checks skipped" "$out/gpu_tests.log"
then st nccl_multi_rank ok 0 "part of test_gpu_nccl"
else st nccl_multi_rank skipped 0 "$ngpu GPU(s), one rank per GPU needs 2; mpirun: $(command -v mpirun || echo none)"; fi
tail -8 "$out/gpu_tests.log"

# ---- 5. benchmarks, then 6. compute-sanitizer (each skipped in dry mode or without a GPU)
why=""
[ "${ngpu:-0}" -ge 1 ] || why="no GPU visible"
[ $mode = dry ] && why="dry mode"
if [ -n "$why" ] || [ "$(lim 180)" = 1 ]; then st bench skipped 0 "${why:-no time left of $budget s}"
else
  s=$(now) bo=$build/bench-out
  rm -rf "$bo" && mkdir -p "$bo"
  timeout "$(lim 180)" "$build/bench/gpu_bench" "$bo" "$src" > "$out/gpu_bench.log" 2>&1
  rc=$?
  j() { [ -s "$bo/$1.json" ] && cat "$bo/$1.json" || echo null; }
  printf '{"gemm": %s,\n "attention": %s,\n "step": %s}\n' "$(j gemm)" "$(j attention)" "$(j step)" > "$out/bench.json"
  case $rc in 0) st bench ok $(($(now) - s));; 77) st bench skipped $(($(now) - s)) "exit 77";;
    *) st bench failed $(($(now) - s)) "rc $rc$([ $rc = 124 ] && echo ' (timeout)')";; esac
  tail -5 "$out/gpu_bench.log"
fi
[ -z "$why" ] && [ -z "$san" ] && why="no compute-sanitizer"
for tool in memcheck racecheck; do
  [ -n "$why" ] && { st $tool skipped 0 "$why"; continue; }
  s=$(now) t=$(lim 90)
  [ "$t" = 1 ] && { st $tool skipped 0 "no time left of $budget s"; continue; }
  echo "==== $tool" >> "$out/sanitizer.log"
  timeout "$t" "$san" --tool $tool --target-processes all --print-limit 20 --error-exitcode 86 \
    "$build/tests/test_gpu_ops" --jobs 1 ${MT_GPU_SANITIZE_FILTER:+--filter "$MT_GPU_SANITIZE_FILTER"} >> "$out/sanitizer.log" 2>&1
  rc=$?
  sed -n "/^==== $tool/,\$p" "$out/sanitizer.log" > "$build/san-$tool.log"
  # one ERROR SUMMARY per process the tool followed (Criterion runs each test in a child)
  errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$build/san-$tool.log" | awk '{n += $1} END {print n + 0}')
  procs=$(grep -c 'ERROR SUMMARY' "$build/san-$tool.log")
  case $rc in 0) r=ok;; 77) r=skipped;; *) r=failed;; esac
  [ "$errs" -gt 0 ] && r=failed
  st $tool $r $(($(now) - s)) "rc $rc$([ $rc = 124 ] && echo ' (timeout)')" "\"errors\": $errs, \"processes\": $procs"
done

# ---- 7. check.json: the EXIT trap
[ $failed = 0 ]
