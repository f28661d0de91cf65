#!/usr/bin/env bash
# tests/test_emu_mpi_train.sh BUILD_DIR: `mpirun ... meshtrain train ... backend=cuda` through
# the CLI, each rank running the CUDA kernels on the emulator (BUILD_DIR/meshtrain-emu) with
# its own emulated GPU, collectives on device buffers staged through host memory
# (parallel/comm.h), label emu (issue 14):
#  - 4 ranks, data 2 x tensor 2, ZeRO-1, 2 micro-batches of 2 sequences, reproduce the
#    single-process run of batch 8 (the same 8 sequences per step): every step's loss
#    and grad norm within the derived fp32 bounds of that step (tests/lib.sh
#    mt_fp32_bounds: the one-process run and its perturbed twin through
#    tests/tools/mpi_layout_emu, bounded as tests/tools/mpi_layout.c derive_bounds says:
#    the chain's 2 lambda sqrt(S) u kappa, plus what AdamW carries of the earlier steps'
#    differences). Both runs compute the same sums in another order (vocab-parallel
#    loss, row-parallel partial sums, the data all-reduce and ZeRO-1 reduce-scatter).
#    Was 1e-5 for every step, from "about 1e-7 here".
#  - resume under the same layout: steps 4..6 from step_3's checkpoint equal the
#    uninterrupted run's bitwise (the same collectives on the same values).
#  - more ranks on a node than visible devices (CUDAEMU_DEVICES=1, 2 ranks): exit 2
#    before any compute, the message naming both counts.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_emu_mpi_train.sh "${1:-}" meshtrain-emu
mt_need_python3
command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }
mt_mpi_env
export CUDAEMU_QUIET=1 CUDAEMU_DEVICES=4

mt_tmp
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
mt_shards "$tmp/data" 1 train_000.bin=4000 val_000.bin=200
mt_run_yml <<YML
backend: cuda
max_target_length: 16
steps: 6
learning_rate: 0.001
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 3
log_period: 1
seed: 7
YML

mt_train ref per_device_batch_size=8
layout_tool="$build/tests/tools/mpi_layout_emu"
mt_fp32_bounds bref 6 per_device_batch_size=8
layout=(ici_data_parallelism=2 ici_tensor_parallelism=2 shard_optimizer_over_data=true
        gradient_accumulation_steps=2 per_device_batch_size=2)
mpi 4 "$bin" train "$tmp/cfg/run.yml" run_name=d2t2 "${layout[@]}" > "$tmp/d2t2.out" 2>&1 ||
    fail "dp2 x tp2: $(tail -5 "$tmp/d2t2.out")"
for f in loss grad_norm; do
    mt_check_bounds "$tmp/bref.bounds" "$f" ref d2t2 || fail "dp2 x tp2 $f"
done

# resume from step 3 under the same layout: steps 4..6 bitwise
mpi 4 "$bin" train "$tmp/cfg/run.yml" run_name=d2t2r "${layout[@]}" \
    load_checkpoint="$tmp/out/d2t2/checkpoints/step_3" > "$tmp/d2t2r.out" 2>&1 ||
    fail "resume: $(tail -5 "$tmp/d2t2r.out")"
[ "$(mt_column d2t2 loss 4 6)" = "$(mt_column d2t2r loss 4 6)" ] && [ -n "$(mt_column d2t2r loss 4 6)" ] ||
    fail "resumed steps 4..6 differ: $(mt_column d2t2 loss 4 6 | tr '\n' ' ') vs $(mt_column d2t2r loss 4 6 | tr '\n' ' ')"

# one GPU per rank: 2 ranks, 1 device
CUDAEMU_DEVICES=1 mpi 2 "$bin" train "$tmp/cfg/run.yml" run_name=bind ici_data_parallelism=2 \
    per_device_batch_size=1 > "$tmp/bind.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "2 ranks on 1 device: exit $rc, want 2"
grep -q "2 ranks run on this node but it has 1 visible CUDA device" "$tmp/bind.out" ||
    fail "2 ranks on 1 device: message: $(tail -3 "$tmp/bind.out")"
grep -q "^step " "$tmp/bind.out" && fail "2 ranks on 1 device: it computed"
[ -e "$tmp/out/bind/metrics.jsonl" ] && fail "2 ranks on 1 device: wrote metrics"

mt_finish "test_emu_mpi_train: ok"
