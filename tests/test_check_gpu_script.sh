#!/usr/bin/env bash
# tests/test_check_gpu_script.sh BUILD_DIR: bench/gpu_check.sh's reporting, without a
# GPU, a build or the .deb files (about 2 s; label cpu: its name does not start with
# test_gpu_, which would make it a gpu test). With an empty gpu-debs folder the run
# must stop at the debs stage, exit 1, and still leave a valid OUTDIR/check.json (ok
# false, preflight ok, debs failed) beside preflight.log, at most 8 files in all; the
# preflight must find a (fake) nvidia-nccl wheel through python3's import path.
. "$(dirname "$0")/lib.sh"
mt_tmp
src=$(cd "$(dirname "$0")/.." && pwd)
w=$tmp/site/nvidia/nccl
mkdir -p "$tmp/debs" "$w/include" "$w/lib" && touch "$w/include/nccl.h" "$w/lib/libnccl.so.2"
PYTHONPATH=$tmp/site MT_GPU_DEBS=$tmp/debs MT_GPU_PREFIX=$tmp/prefix MT_GPU_BUILD=$tmp/build \
    bash "$src/bench/gpu_check.sh" "$tmp/out" > "$tmp/stdout" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "exit $rc, not 1: $(cat "$tmp/stdout")"
python3 - "$tmp/out/check.json" <<'PY' || fail "check.json: $(cat "$tmp/out/check.json")"
import json, sys
d = json.load(open(sys.argv[1]))
st = d["stages"]
assert d["ok"] is False and d["figures"] is None, d
assert st["preflight"]["status"] == "ok" and st["debs"]["status"] == "failed", st
assert "configure" not in st, st
PY
grep -q "^nccl-wheel: *$w ./include/nccl.h ./lib/libnccl.so.2" "$tmp/out/preflight.log" ||
    fail "preflight did not find the wheel: $(grep nccl "$tmp/out/preflight.log")"
for k in os kernel cpus memory gcc cmake nvcc nvidia-smi compute-sanitizer nccl-toolkit mpi gpu-debs; do
    grep -q "^$k: " "$tmp/stdout" || fail "no '$k:' line in the preflight summary"
done
n=$(ls "$tmp/out" | wc -l)
[ "$n" -le 8 ] || fail "$n files in OUTDIR (the device tool returns 8)"
[ -e "$tmp/build" ] && fail "a build directory was made after the debs stage failed"
mt_finish "ok"
