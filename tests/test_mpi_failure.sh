#!/usr/bin/env bash
# tests/test_mpi_failure.sh BUILD_DIR: a dead or hung rank never leaves the others
# hanging.
#  - killed: 4 ranks train (dp4 + ZeRO-1); one rank is killed with SIGKILL mid-run; the
#    job must end non-zero within 60 s of the kill, mpirun's report must name the rank
#    that died, and the survivors (stopped by mpirun with SIGTERM, or by their
#    watchdog) must say where they were (normally: which collective).
#  - hung: rank 1 is stopped with SIGSTOP; the survivors' watchdog
#    (collective_timeout_s=5) must end them within 60 s with
#    "rank R: <collective> on the '<group>' communicator did not complete".
# With a second argument `cuda` (tests/test_emu_mpi_failure.sh) the ranks run
# meshtrain-emu with backend=cuda (each an emulated GPU, collectives on device buffers
# staged through host memory): the same two cases.
set -u
. "$(dirname "$0")/lib.sh"
backend="${2:-cpu}"
mt_build_backend test_mpi_failure.sh "${1:-}" "$backend"
mt_need_tools mpi_layout
tool=${tools[0]}
mt_need_mpirun
mt_mpi_env

mt_tmp

mt_tiny_model "$tmp/cfg/models/tinyl.yml" llama
"$tool" data "$tmp/data" || exit 1
mt_run_yml tinyl <<YML
max_target_length: 16
per_device_batch_size: 1
steps: 100000
eval_interval: 0
checkpoint_period: 0
log_period: 1
backend: $backend
ici_data_parallelism: 4
shard_optimizer_over_data: true
collective_timeout_s: 5
overlap_grad_reduce: true
YML

# a collective as the messages name it: "all_gather", or an asynchronous one with its MPI
# call, "reduce_scatter (MPI_Ireduce_scatter)" (the per-parameter gradient reduce-scatters
# overlap the backward: overlap_grad_reduce)
coll="[a-z_]+( \\([A-Za-z_]+\\))?"

# pids of the 4 meshtrain ranks started by the mpirun with pid $1
rank_pids() { pgrep -P "$1" -f "$bin" | sort -n; }

# run_case SIGNAL: start, wait for steps, signal one rank, time the end
run_case() {
    local sig=$1 victim_idx=$2
    mpirun --oversubscribe -np 4 "$bin" train "$tmp/cfg/run.yml" run_name=$sig > "$tmp/$sig.log" 2>&1 &
    local mp=$!
    local i
    for ((i = 0; i < 1200; i++)); do
        grep -q "^step 3/" "$tmp/$sig.log" 2>/dev/null && break
        sleep 0.1
    done
    grep -q "^step 3/" "$tmp/$sig.log" || { fail "$sig: training did not start: $(tail -3 "$tmp/$sig.log")"; kill "$mp"; return; }
    local pids=($(rank_pids "$mp"))
    [ ${#pids[@]} -eq 4 ] || { fail "$sig: found ${#pids[@]} rank processes"; kill "$mp"; return; }
    local victim=${pids[$victim_idx]}
    local t0=$SECONDS
    kill -s "$sig" "$victim"
    local ended=0
    for ((i = 0; i < 600; i++)); do
        if ! kill -0 "$mp" 2>/dev/null; then ended=1; break; fi
        sleep 0.1
    done
    local dt=$((SECONDS - t0))
    if [ $ended -eq 0 ]; then
        fail "$sig: the job still runs 60 s after the signal"
        kill -9 "$victim" 2>/dev/null; kill -CONT "$victim" 2>/dev/null; kill -9 "$mp"; wait "$mp" 2>/dev/null
        return
    fi
    wait "$mp"; local rc=$?
    [ $rc -ne 0 ] || fail "$sig: mpirun exited 0"
    echo "$sig: job ended ${dt}s after the signal, mpirun exit $rc; messages:"
    grep -E "rank|signal|Killed" "$tmp/$sig.log" | grep -v "^step" | head -6 | sed 's/^/    /'
    grep -qE "rank [0-9]+.*(exited on signal|did not complete)|process rank [0-9]+" "$tmp/$sig.log" ||
        fail "$sig: no message naming a rank"
    if [ "$sig" = KILL ]; then
        grep -qE "process rank [0-9]+ .*exited on signal 9" "$tmp/$sig.log" || fail "KILL: no report naming the dead rank"
        # a survivor is normally blocked in a collective when mpirun stops it; one that
        # was computing says so instead (not a failure)
        grep -qE "rank [0-9]+: (stopped by the launcher|$coll on the '[a-z_]+' communicator did not complete)" \
            "$tmp/$sig.log" || fail "KILL: no survivor reported where it was stopped"
    fi
    if [ "$sig" = STOP ]; then
        kill -CONT "$victim" 2>/dev/null; kill -9 "$victim" 2>/dev/null
        grep -qE "rank [0-9]: $coll on the '[a-z_]+' communicator did not complete" "$tmp/$sig.log" ||
            fail "STOP: no watchdog message naming the collective"
    fi
}

run_case KILL 2
run_case STOP 1

mt_finish "failures detected in time"
