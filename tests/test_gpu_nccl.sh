#!/usr/bin/env bash
# tests/test_gpu_nccl.sh BUILD_DIR: the NCCL backend of parallel/comm.h (label gpu).
# Skipped (77) without a GPU or without NCCL in the build. One rank per GPU:
#  - 1 GPU: tests/tools/comm_check.c `nccl1` (every NCCL collective on a communicator
#    of one rank: ncclCommInitRank, the comm stream, its events, the event queue
#    wrapping, the watchdog poll) and `device` in one process (device communicators of
#    one rank: local copies on the compute stream, kernels before and after each call);
#    `nccl1-hang`: an ncclRecv with no matching send must be aborted by the watchdog's
#    poll within 10 s (timeout 1 s), naming the collective and the group.
#  - 2+ GPUs (and mpirun): `device` on 2 ranks (NCCL all_gather / reduce_scatter with
#    uneven and equal counts, all_reduce, broadcast, sendrecv, asynchronous requests,
#    byte counters equal to the MPI backend's formulas), and `device-hang`: rank 1 joins
#    6 s late, rank 0's watchdog (timeout 1 s) must abort its NCCL communicator and end
#    it naming the rank, the collective and the group.
# Every value is exact in fp32 and compared for equality (comm_check.c).
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_gpu_nccl.sh BUILD_DIR}"
mt_need_tools comm_check
tool=${tools[0]}
failures=0

out="$("$tool" nccl1 2>&1)"; rc=$?
echo "$out"
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "nccl1: exit $rc"
out="$("$tool" device 2>&1)" || fail "device, one process: $out"
echo "$out"
out="$(timeout 60 "$tool" nccl1-hang 2>&1)"; rc=$?
echo "$out"
[ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "nccl1-hang: exit $rc"

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -lt 2 ] || ! command -v mpirun >/dev/null; then
    echo "multi-rank NCCL checks skipped: $ngpu GPU(s) visible (one rank per GPU needs 2), mpirun: $(command -v mpirun || echo none)"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    out="$(timeout 300 mpirun --oversubscribe -np 2 "$tool" device 2>&1)" || fail "device np 2: $out"
    echo "$out" | grep "comm_check" | head -20
    grep -q "comm_check: ok (device, 2 ranks)" <<< "$out" || fail "device np 2: no ok line"
    out="$(timeout 120 mpirun --oversubscribe -np 2 "$tool" device-hang 2>&1)"; rc=$?
    echo "device-hang: exit $rc"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "device-hang: exit $rc: $out"
    grep -q "rank 0: all_gather (ncclAllGather) on the 'hangworld' communicator did not complete in [0-9]* s" <<< "$out" ||
        fail "device-hang: no watchdog message naming rank 0, the collective and the group: $out"
    grep -q "NCCL communicator aborted" <<< "$out" || fail "device-hang: the communicator was not aborted: $out"
fi
mt_finish "ok"
