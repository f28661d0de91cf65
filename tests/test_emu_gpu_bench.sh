#!/usr/bin/env bash
# tests/test_emu_gpu_bench.sh BUILD_DIR: bench/gpu_bench.c (the H200 benchmark that
# bench/gpu_check.sh runs) on the CUDA emulator with MT_GPU_BENCH_SMOKE=1 (tiny shapes),
# label emu: it runs to the end and writes gemm.json, attention.json and step.json as
# valid JSON with every row measured (no null figure) in fp32 and bf16, and the step's
# measured device bytes (the emulator's cudaMemGetInfo, which counts the bytes asked of
# cudaMalloc) equal the planned ones: nothing outside the plan, the ops' scratch included
# (it lives in the plan's workspace: ops.h scratch_bytes).
# The figures themselves mean nothing on the emulator; this keeps the benchmark's code
# paths working between the rare GPU sessions.
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_emu_gpu_bench.sh BUILD_DIR}"
bin="$build/bench/gpu_bench_emu"
[ -x "$bin" ] || { echo "no $bin (MESHTRAIN_CUDAEMU=OFF?): skipped"; exit 77; }
mt_need_python3
mt_tmp
MT_GPU_BENCH_SMOKE=1 CUDAEMU_QUIET=1 OMP_NUM_THREADS=1 "$bin" "$tmp" "$PWD" > "$tmp/log" 2>&1 ||
    fail "gpu_bench_emu exit $?: $(tail -5 "$tmp/log")"
python3 - "$tmp" <<'PY' || fail "JSON"
import json, math, sys
d = sys.argv[1]
ok = True
def check(name, key, fields):
    global ok
    rows = json.load(open(f"{d}/{name}"))[key]
    dts = sorted({r.get("dtype") for r in rows})
    if dts != ["bf16", "fp32"]:
        print(f"{name}: dtypes {dts}, want bf16 and fp32"); ok = False
    for r in rows:
        for f in fields:
            v = r.get(f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                print(f"{name}: row {r}: {f} = {v!r}"); ok = False
    return rows
check("attention.json", "attention", ["fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops"])
for r in check("step.json", "step", ["step_ms", "tokens_per_s", "mfu", "planned_bytes", "measured_bytes"]):
    print(f"step {r['model']} {r['dtype']}: planned {r['planned_bytes']} measured {r['measured_bytes']} bytes")
    if r["measured_bytes"] != r["planned_bytes"]:
        print("  measured != planned: the step allocated device memory outside its plan"); ok = False
g = json.load(open(f"{d}/gemm.json"))["gemm"]
for r in g:
    for f in ["meshtrain_fp32_tflops", "meshtrain_bf16_tflops", "cublaslt_fp32_tflops", "cublaslt_bf16_tflops"]:
        if not isinstance(r.get(f), (int, float)):
            print(f"gemm.json: row {r}: {f} = {r.get(f)!r}"); ok = False
sys.exit(0 if ok else 1)
PY
mt_finish "test_emu_gpu_bench: ok"
