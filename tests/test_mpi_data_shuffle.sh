#!/usr/bin/env bash
# tests/test_mpi_data_shuffle.sh BUILD_DIR: with shuffling on (enable_data_shuffling,
# the default), every layout reads the same global batch (train/data.h: each rank its
# slice of the same shuffled windows), over 12 steps that cross two epoch boundaries:
#  - `mpirun -np 2` with ici_data_parallelism=2 and per_device_batch_size=1 gives the
#    losses of one process with per_device_batch_size=2, each step within its derived
#    fp32 bound (fp32 sums in another order; tests/lib.sh mt_fp32_bounds: 1e-7 at step
#    1, growing with what AdamW carries to ~1e-2 by step 12 at this learning rate; was
#    1e-5 for every step). Other batches differ by percents from step 1 on, which the
#    test checks against a run without shuffling (it must fail the same bounds);
#  - dp2 with 2 micro-batches of 1 gives the losses of one process with a batch of 4
#    (a shuffled unit is one optimizer step's tokens);
#  - the dp2 run resumed from its step-6 checkpoint (epoch 1) repeats steps 7..12 bitwise.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_mpi_data_shuffle.sh "${1:-}"
mt_need_mpirun
mt_need_python3
mt_mpi_env
mt_tmp

mkdir -p "$tmp/cfg/models"
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
# windows of 2 x 16 = 32 tokens: 3 + 2 = 5 steps per epoch (64-token steps: 1 + 1)
mt_shards "$tmp/data" 2 web_train_000001.bin=100 web_train_000002.bin=70 web_val_000000.bin=100
mt_run_yml <<YML
max_target_length: 16
steps: 12
learning_rate: 0.003
adam_eps: 1e-05
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 6
log_period: 1
backend: cpu
seed: 4
YML
run() { # NP RUN_NAME ARGS...
    local np=$1 name=$2; shift 2
    local cmd=("$bin" train "$tmp/cfg/run.yml" run_name="$name" "$@")
    if [ "$np" -gt 1 ]; then mpi "$np" "${cmd[@]}" > "$tmp/$name.log" 2>&1; else "${cmd[@]}" > "$tmp/$name.log" 2>&1; fi ||
        fail "$name: $(tail -5 "$tmp/$name.log")"
}
bitwise() { # A B FIRST: loss and grad_norm rows from step FIRST on, as printed
    python3 - "$tmp/out/$1/metrics.jsonl" "$tmp/out/$2/metrics.jsonl" "$3" <<'PY'
import re, sys
def rows(p):
    return [re.sub(r'"(tokens_per_s|step_ms|mfu)": [^,}]*', '', l) for l in open(p)
            if '"loss"' in l and int(re.search(r'"step": (\d+)', l).group(1)) >= int(sys.argv[3])]
sys.exit(0 if rows(sys.argv[1]) == rows(sys.argv[2]) and rows(sys.argv[1]) else 1)
PY
}

run 1 one per_device_batch_size=2
run 1 one_plain per_device_batch_size=2 enable_data_shuffling=false
run 2 dp2 per_device_batch_size=1 ici_data_parallelism=2
layout_tool="$build/tests/tools/mpi_layout"
mt_fp32_bounds b2 12 per_device_batch_size=2
mt_fp32_bounds b4 12 per_device_batch_size=4
mt_check_bounds "$tmp/b2.bounds" loss one dp2 || fail "dp2 x batch 1 read other tokens than one process x batch 2"
mt_check_bounds "$tmp/b2.bounds" loss one one_plain &&
    fail "shuffled and file-order runs agree: the layout check above could not fail"
run 1 one_b4 per_device_batch_size=4
run 2 dp2_ga2 per_device_batch_size=1 ici_data_parallelism=2 gradient_accumulation_steps=2
mt_check_bounds "$tmp/b4.bounds" loss one_b4 dp2_ga2 ||
    fail "dp2 x 2 micro-batches read other tokens than one process x batch 4"
run 2 dp2_resumed per_device_batch_size=1 ici_data_parallelism=2 load_checkpoint="$tmp/out/dp2/checkpoints/step_6"
bitwise dp2 dp2_resumed 7 || fail "dp2 resumed from step 6 differs from the uninterrupted run"

mt_finish ok
