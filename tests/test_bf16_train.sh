#!/usr/bin/env bash
# tests/test_bf16_train.sh BUILD_DIR: dtype=bfloat16 training against float32 on the CPU
# backend, through the CLI, label cpu:
#  - configs/models/llama3-tiny.yml (7.0M parameters, vocabulary 8192) trained 200 steps
#    on the bundled corpus (data/kjv, `make corpus`; exit 77 when it is absent) with
#    dtype=float32 and dtype=bfloat16, same seed, same batches: the bf16 run stays in the
#    band below;
#  - resuming a bf16 run from a checkpoint gives bitwise the losses of the whole run (the
#    compute weights are a pure function of the master, the seed and the step:
#    models/model.h mt_model_set_compute_rounding);
#  - bf16 with parameter host offload gives bitwise the losses of bf16 without.
#
# The band. Both runs start from the same fp32 master weights and see the same tokens; the
# bf16 run rounds activations and compute weights to bf16 (unit roundoff 2^-8: 8
# significant bits, round to nearest) at the
# points kernels/ops.h lists, keeping fp32 master weights, moments, reductions, norms and
# the loss. Mixed precision of this kind is reported to reach fp32's loss within
# run-to-run variation (Micikevicius et al. 2018, "Mixed Precision Training", section 4,
# for fp16 with fp32 master weights; Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep
# Learning Training", section 4, for bf16): its effect is well below the loss's own fall
# over training. Rounding alone perturbs each activation by about sqrt(s) 2^-8 relative
# after s rounding sites (independent errors: Higham & Mary 2019, "A New Approach to
# Probabilistic Rounding Error Analysis"); with s ~ 70 sites per token path here that is
# ~3%, which moves the loss at first order along the trajectory by a similarly small
# fraction of its fall. So we require (tests/loss_band.py), with drop_f the fp32 run's
# fall (mean of steps 1-20 minus mean of steps 181-200):
#    drop_f > 0.5 (the model learns; a check of the test itself),
#    |mean_b(181-200) - mean_f(181-200)| <= 0.1 drop_f,
#    the bf16 run's own fall >= 0.9 drop_f.
# A bf16 path that learns materially slower fails it: compute weights not refreshed from
# the master (the bf16 weights stay at their initial values: no fall at all), gradients
# of the wrong scale or rounded to bf16 before accumulation, a biased stochastic rounding.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_bf16_train.sh "${1:-}"
mt_need_python3
corpus="$src/data/kjv"
[ -s "$corpus/train_000.bin" ] && [ -s "$corpus/val_000.bin" ] ||
    { echo "no corpus in $corpus (run: make corpus): skipped"; exit 77; }
export OMP_NUM_THREADS=1 # ctest runs two tests at once on the 2 cores
mt_tmp

mkdir -p "$tmp/cfg"
cat > "$tmp/cfg/run.yml" <<YML
model_name: llama3-tiny
base_output_directory: $tmp/out
dataset_path: $corpus
per_device_batch_size: 4
max_target_length: 64
steps: 200
learning_rate: 0.003
warmup_steps_fraction: 0.05
eval_interval: 0
checkpoint_period: 0
log_period: 1
seed: 11
YML

# 1. The band over 200 steps.
mt_train f32 dtype=float32 && mt_train bf16 dtype=bfloat16 &&
    { python3 "$src/tests/loss_band.py" "$tmp/out/f32/metrics.jsonl" "$tmp/out/bf16/metrics.jsonl" 200 20 0.5 ||
          fail "bf16 left the band of the float32 run"; }

# 2. Resume: steps 6..10 of a bf16 run resumed from step 5 are bitwise the whole run's.
mt_train whole dtype=bfloat16 steps=10 checkpoint_period=5 || exit 1
mt_train resumed dtype=bfloat16 steps=10 checkpoint_period=5 \
    load_checkpoint="$tmp/out/whole/checkpoints/step_5" || exit 1
for k in loss grad_norm; do
    [ "$(mt_column whole $k 6 10)" = "$(mt_column resumed $k 6 10)" ] ||
        { fail "bf16 run resumed from step 5 differs in $k"; paste <(mt_column whole $k 6 10) <(mt_column resumed $k 6 10); }
done
[ "$(mt_column whole loss 6 10 | wc -l)" -eq 5 ] || fail "the whole bf16 run lacks steps 6..10"

# 3. bf16 with parameter host offload (the master and its compute copy in the host
# pool, the windows copied from the copy; the embedding and lm_head copied a vocabulary
# chunk at a time) gives bitwise the losses of the run without, at the same
# num_vocab_chunks (offload's auto picks chunks, one process without windows keeps the
# vocabulary whole: models/model.h): the same ops on the same values.
mt_train chunked dtype=bfloat16 steps=10 checkpoint_period=0 num_vocab_chunks=3 || exit 1
mt_train offload dtype=bfloat16 steps=10 checkpoint_period=0 num_vocab_chunks=3 parameter_memory_host_offload=true ||
    exit 1
for k in loss grad_norm; do
    [ "$(mt_column chunked $k 1 10)" = "$(mt_column offload $k 1 10)" ] ||
        { fail "bf16 with parameter offload differs in $k"
          paste <(mt_column chunked $k 1 10) <(mt_column offload $k 1 10); }
done

mt_finish "bf16 within the band of float32 over 200 steps; bf16 resume and parameter offload bitwise"
