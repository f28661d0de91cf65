#!/usr/bin/env bash
# tests/test_mpi_cli_errors.sh BUILD_DIR: `meshtrain train` under mpirun prints an error
# once, not once per rank, and every rank still exits 2 (train/main.c agree_on_inputs):
#  - a mesh that does not fit the world (ici_tensor_parallelism=3 on 2 ranks), an unknown
#    key, num_devices other than the world: one "meshtrain: error:" line naming it;
#  - an error that one rank alone finds (MPMD: rank 1 is given a config file that does
#    not exist) is printed by that rank, and the other rank exits 2 without a message;
#    two ranks with two different errors print both;
#  - a run directory that already holds a run (rank 0 checks it; the others learned
#    "rank 0 refused"): rank 0's message only.
# Each rank runs under a wrapper that records its own exit status (mpirun's SIGTERM,
# sent to the job once a rank has exited non-zero, waits in the wrapper's trap).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_mpi_cli_errors.sh "${1:-}"
mt_need_python3
mt_need_mpirun
mt_mpi_env
mt_tmp

mt_tiny_model "$tmp/cfg/models/tiny.yml" llama 1
mt_shards "$tmp/data" 5 train_000.bin=3000 val_000.bin=400
mt_run_yml <<YML
run_name: r
per_device_batch_size: 1
max_target_length: 8
steps: 2
eval_interval: 0
checkpoint_period: 0
log_period: 1
backend: cpu
ici_data_parallelism: 2
YML
mt_rank_wrapper "$tmp/rank.sh" # rank.sh RCDIR CMD...: each rank's exit status (tests/lib.sh)

# run2 NAME MPIRUN-ARGS...: mpirun with the wrapper around each rank's command;
# $tmp/NAME.err holds stderr, $tmp/NAME.rc/<rank> each rank's status
run2() {
    local name=$1; shift
    rm -rf "$tmp/$name.rc"; mkdir -p "$tmp/$name.rc"
    timeout 300 mpirun --oversubscribe "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"
}
# errors NAME: the meshtrain error lines of run NAME
errors() { grep "^meshtrain: error:" "$tmp/$1.err"; }
# ranks_exit NAME CODE: both ranks' recorded status is CODE
ranks_exit() {
    local r
    for r in 0 1; do
        [ "$(cat "$tmp/$1.rc/$r" 2>/dev/null)" = "$2" ] ||
            fail "$1: rank $r exit status '$(cat "$tmp/$1.rc/$r" 2>/dev/null)', want $2 ($(cat "$tmp/$1.err"))"
    done
}
# once NAME NEEDLE: exactly one error line, and it holds NEEDLE; no rank stopped mid-way
once() {
    [ "$(errors "$1" | wc -l)" -eq 1 ] || fail "$1: $(errors "$1" | wc -l) error lines, want 1: $(errors "$1")"
    errors "$1" | grep -qF -- "$2" || fail "$1: the error does not name '$2': $(errors "$1")"
    grep -q "stopped by the launcher\|did not complete" "$tmp/$1.err" && fail "$1: a rank was stopped: $(cat "$tmp/$1.err")"
}

# errors every rank finds: printed once, by rank 0
for case in "mesh ici_tensor_parallelism=3 ici_data_parallelism=1" "key bogus_key=1" "devices num_devices=8" \
    "blocks ici_data_parallelism=1 ici_tensor_parallelism=2 grad_window_chunks=2"; do
    set -- $case
    name=$1; shift
    run2 "$name" -np 2 "$tmp/rank.sh" "$tmp/$name.rc" "$bin" train "$cfg" "$@"
    ranks_exit "$name" 2
    case $name in
        mesh) once "$name" "ici_tensor_parallelism = 1 x 1 x 1 x 3 = 3 but the world has 2 ranks" ;;
        key) once "$name" "bogus_key" ;;
        devices) once "$name" "num_devices" ;;
        blocks) once "$name" "grad_window_chunks=2 with ici_tensor_parallelism=2" ;;
    esac
done
[ -e "$tmp/out/r" ] && fail "a refused run wrote $tmp/out/r"

# an error one rank alone finds: that rank prints it, the other exits 2 quietly
run2 alone -np 1 "$tmp/rank.sh" "$tmp/alone.rc" "$bin" train "$cfg" : \
    -np 1 "$tmp/rank.sh" "$tmp/alone.rc" "$bin" train "$tmp/cfg/absent.yml"
ranks_exit alone 2
once alone "$tmp/cfg/absent.yml"
# two ranks, two errors: both printed
run2 two -np 1 "$tmp/rank.sh" "$tmp/two.rc" "$bin" train "$tmp/cfg/absent0.yml" : \
    -np 1 "$tmp/rank.sh" "$tmp/two.rc" "$bin" train "$tmp/cfg/absent1.yml"
ranks_exit two 2
[ "$(errors two | wc -l)" -eq 2 ] && errors two | grep -q absent0.yml && errors two | grep -q absent1.yml ||
    fail "two: want one line for each rank's own error: $(errors two)"

# the run directory: rank 0's verdict, printed once
run2 first -np 2 "$tmp/rank.sh" "$tmp/first.rc" "$bin" train "$cfg"
ranks_exit first 0
run2 again -np 2 "$tmp/rank.sh" "$tmp/again.rc" "$bin" train "$cfg"
ranks_exit again 2
once again "already holds a run"
errors again | grep -q "rank 0 refused" && fail "again: the other rank's echo was printed: $(errors again)"

mt_finish "test_mpi_cli_errors: ok"
