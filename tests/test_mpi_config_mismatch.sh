#!/usr/bin/env bash
# tests/test_mpi_config_mismatch.sh BUILD_DIR: ranks that mpirun starts with different
# arguments (MPMD `-np 1 A : -np 1 B`) are refused at start-up (train/main.c
# differing_configs): every rank exits 2, and rank 0 alone prints one error naming the
# first key whose resolved value differs, both values and both ranks; nothing is
# written. Before, a different learning_rate trained diverging replicas and exited 0,
# a different steps hung until the collective timeout, a different model_name died in
# MPI (MPI_ERR_TRUNCATE) and a different run_name was ignored.
#  - learning_rate, steps, run_name, model_name (the first key: not one of the model
#    keys it changes), a model key given to one rank only, and 3 ranks of which rank 2
#    differs (the lowest differing rank is named, with the count);
#  - the same resolved config reached two ways (a key=value on one rank, the config
#    file on the other) trains: what is compared is the effective value.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_mpi_config_mismatch.sh "${1:-}"
mt_need_python3
mt_need_mpirun
mt_mpi_env
mt_tmp

mt_tiny_model "$tmp/cfg/models/tiny.yml" llama 1
mt_tiny_model "$tmp/cfg/models/tiny2.yml" llama 2
mt_shards "$tmp/data" 5 train_000.bin=3000 val_000.bin=400
mt_run_yml <<YML
run_name: r
per_device_batch_size: 1
max_target_length: 8
steps: 3
eval_interval: 0
checkpoint_period: 0
log_period: 1
backend: cpu
collective_timeout_s: 10
YML
# the same run with learning_rate set in the file (run.yml's default is base.yml's)
{ cat "$cfg"; echo "learning_rate: 0.002"; } > "$tmp/cfg/lr.yml"
mt_rank_wrapper "$tmp/rank.sh" # rank.sh RCDIR CMD...: each rank's exit status (tests/lib.sh)

# mpmd NAME NP0 ARGS0 NP1 ARGS1: NP0 ranks train $cfg with ARGS0 (one word list), NP1
# ranks with ARGS1; each rank's status in $tmp/NAME.rc/<rank>, stderr in $tmp/NAME.err
mpmd() {
    local name=$1 np0=$2 a0=$3 np1=$4 a1=$5
    rm -rf "$tmp/$name.rc"; mkdir -p "$tmp/$name.rc"
    # shellcheck disable=SC2086 # ARGS are word lists
    timeout 300 mpirun --oversubscribe \
        -np "$np0" "$tmp/rank.sh" "$tmp/$name.rc" "$bin" train "$cfg" $a0 : \
        -np "$np1" "$tmp/rank.sh" "$tmp/$name.rc" "$bin" train "$cfg" $a1 > "$tmp/$name.out" 2> "$tmp/$name.err"
}
errors() { grep "^meshtrain: error:" "$tmp/$1.err"; }
# refused NAME NRANKS NEEDLE...: every rank exited 2, one error line holding every NEEDLE
refused() {
    local name=$1 n=$2 r; shift 2
    for r in $(seq 0 $((n - 1))); do
        [ "$(cat "$tmp/$name.rc/$r" 2>/dev/null)" = 2 ] ||
            fail "$name: rank $r exit status '$(cat "$tmp/$name.rc/$r" 2>/dev/null)', want 2 ($(tail -5 "$tmp/$name.err"))"
    done
    [ "$(errors "$name" | wc -l)" -eq 1 ] || fail "$name: $(errors "$name" | wc -l) error lines, want 1: $(errors "$name")"
    for needle in "$@"; do
        errors "$name" | grep -qF -- "$needle" || fail "$name: the error does not say '$needle': $(errors "$name")"
    done
    grep -q "stopped by the launcher\|did not complete" "$tmp/$name.err" && fail "$name: a rank was stopped: $(cat "$tmp/$name.err")"
    [ -e "$tmp/out" ] && fail "$name: a refused run wrote $(find "$tmp/out")"
    rm -rf "$tmp/out" # each case on its own
}

dp2="ici_data_parallelism=2"
mpmd lr 1 "$dp2 learning_rate=1e-3" 1 "$dp2 learning_rate=1e-2"
refused lr 2 "key 'learning_rate' = 0.001 on rank 0 but 0.01 on rank 1" "different configs"
mpmd steps 1 "$dp2 steps=3" 1 "$dp2 steps=4"
refused steps 2 "key 'steps' = 3 on rank 0 but 4 on rank 1"
mpmd run 1 "$dp2 run_name=m5" 1 "$dp2 run_name=m6"
refused run 2 "key 'run_name' = 'm5' on rank 0 but 'm6' on rank 1"
mpmd model 1 "$dp2" 1 "$dp2 model_name=tiny2"
refused model 2 "key 'model_name' = 'tiny' on rank 0 but 'tiny2' on rank 1"
mpmd modelkey 1 "$dp2 base_mlp_dim=128" 1 "$dp2"
refused modelkey 2 "key 'base_mlp_dim' = 128 on rank 0 but 64 on rank 1"
mpmd three 2 "ici_data_parallelism=3" 1 "ici_data_parallelism=3 seed=9"
refused three 3 "key 'seed' = 0 on rank 0 but 9 on rank 2" "(1 of the 3 ranks differ from rank 0)"

# the same effective config, given two ways: trains (rank 1 reads learning_rate from its file)
rm -rf "$tmp/same.rc"; mkdir -p "$tmp/same.rc"
timeout 300 mpirun --oversubscribe \
    -np 1 "$tmp/rank.sh" "$tmp/same.rc" "$bin" train "$cfg" $dp2 learning_rate=0.002 : \
    -np 1 "$tmp/rank.sh" "$tmp/same.rc" "$bin" train "$tmp/cfg/lr.yml" $dp2 > "$tmp/same.out" 2> "$tmp/same.err"
for r in 0 1; do
    [ "$(cat "$tmp/same.rc/$r" 2>/dev/null)" = 0 ] ||
        fail "same config two ways: rank $r exit status '$(cat "$tmp/same.rc/$r" 2>/dev/null)' ($(tail -5 "$tmp/same.err"))"
done
[ -s "$tmp/out/r/metrics.jsonl" ] || fail "same config two ways: no metrics.jsonl"

mt_finish "test_mpi_config_mismatch: ok"
