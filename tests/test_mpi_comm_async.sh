#!/usr/bin/env bash
# tests/test_mpi_comm_async.sh BUILD_DIR: the collectives of parallel/comm.h on host
# buffers (MPI), blocking and asynchronous (mt_comm_*_start + mt_comm_wait), under
# mpirun --oversubscribe with 1, 2 and 3 ranks (tests/tools/comm_check.c: uneven and
# equal counts, an empty chunk, in-place gather, three requests outstanding at once,
# byte counters equal to comm.h's formulas; every value exact in fp32, compared for
# equality; bf16 sums, MT_COMM_BF16, with their rounding on two ranks), and the watchdog on an asynchronous wait: a peer that joins 6 s late must
# end rank 0 after collective timeout 1 s with the rank, the collective and the group
# named.
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_mpi_comm_async.sh BUILD_DIR}"
mt_need_tools comm_check
tool=${tools[0]}
mt_need_mpirun
mt_mpi_env
failures=0

out="$("$tool" host 2>&1)" || fail "one process: $out"
echo "$out"
for np in 2 3; do
    out="$(timeout 120 mpirun --oversubscribe -np $np "$tool" host 2>&1)" || fail "np $np: $out"
    echo "$out" | grep -q "comm_check: ok (host, $np ranks)" || fail "np $np: no ok line: $out"
    echo "$out" | grep "comm_check" | head -20
done

t0=$(date +%s)
out="$(timeout 60 mpirun --oversubscribe -np 2 "$tool" hang 2>&1)"; rc=$?
dt=$(( $(date +%s) - t0 ))
echo "hang: exit $rc after ${dt} s"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "hang: exit $rc (want a failure, not a timeout): $out"
grep -q "rank 0: all_gather (MPI_Iallgatherv) on the 'hangworld' communicator did not complete in 1 s" <<< "$out" ||
    fail "hang: no watchdog message naming rank 0, the collective and the group: $out"
grep -q "watchdog did not fire" <<< "$out" && fail "hang: the wait returned: $out"
grep "did not complete" <<< "$out" | head -2

mt_finish "ok"
