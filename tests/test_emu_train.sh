#!/usr/bin/env bash
# tests/test_emu_train.sh BUILD_DIR: `meshtrain train ... backend=cuda` through the CLI with
# the CUDA kernels running on the CPU emulator (BUILD_DIR/meshtrain-emu, tests/cudaemu),
# label emu:
#  - 20 steps of a tiny Llama and a tiny Gemma 2 (soft-caps, sliding window, tied
#    embedding) on backend=cuda and backend=cpu: every step's loss within the bound below;
#    3 steps of configs/models/llama3-tiny.yml (GQA 8/2, head_dim 32, llama3 RoPE) and
#    gemma-tiny.yml (MQA, head_dim 64) likewise; 5 steps of a tiny Gemma 4 likewise, with
#    global head_dim 16 and 512;
#  - 60 steps of the tiny Llama with dtype=bfloat16 on cuda within the band of float32 on
#    cpu (tests/test_bf16_train.sh derives the band);
#  - save and resume on cuda: resuming from step_5 gives steps 6..10 bitwise;
#  - a kernel that faults (CUDAEMU_FAIL_KERNEL) makes `train` exit 1 naming the kernel,
#    and leaves no checkpoint half-written.
#
# The loss bound. Both backends start from bitwise the same parameters (initialised on the
# host from `seed`) and read the same tokens; they differ only in rounding. Each op of
# either backend is within gamma_K = K u / (1 - K u) (u = 2^-24, fp32) of exact, relative
# to the sum of its terms' magnitudes (Higham, "Accuracy and Stability of Numerical
# Algorithms", 2nd ed., eq. 3.5; test_gpu_ops_emu holds every kernel to such bounds), K at
# most KMAX, the model's longest reduction. With S = 16 stages per layer (two norms, four
# attention projections, RoPE, scores, softmax, context, three MLP GEMMs, the activation,
# two residual adds) plus 4 (embedding, final norm, logits, log-sum-exp), activations of
# order one (RMSNorm keeps them so) and both backends' errors counted, one forward's loss
# differs by at most 2 S gamma_KMAX (1 + |loss|) to first order. A step's backward and
# update mirror the forward's stages (another factor 2), and with learning rate 1e-3 an
# Adam step moves each parameter by at most ~1e-3, so the step map is close to the identity
# and earlier steps' differences carry over without growth to first order: at step t the
# bound is t * 4 S gamma_KMAX (1 + |loss|). KMAX is 64 for the 2-layer models (D, F, V and
# T all <= 64) and 8192 (the vocabulary) for the 4-layer configs, whose bound is loose.
# It is a worst-case bound: the emulator's runs sit about 1e-6 of it. It can fail: an Adam
# bias correction off by one step in adamw.cu fails the tiny Llama at step 2 (|diff| 8.1e-3
# > 5.6e-3); kernel errors smaller than that are the op tests' job (test_gpu_ops_emu).
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_emu_train.sh BUILD_DIR}"
bin="$build/meshtrain-emu"
[ -x "$bin" ] || { echo "no $bin (MESHTRAIN_CUDAEMU=OFF?): skipped"; exit 77; }
mt_need_python3
export CUDAEMU_QUIET=1 OMP_NUM_THREADS=1

mt_tmp
mkdir -p "$tmp/cfg/models" "$tmp/data"
mt_tiny_model "$tmp/cfg/models/tiny-llama.yml" llama
mt_tiny_model "$tmp/cfg/models/tiny-gemma2.yml" gemma2
cp configs/models/llama3-tiny.yml configs/models/gemma-tiny.yml "$tmp/cfg/models/"
mt_shards "$tmp/data" 1 train_000.bin=3000 val_000.bin=200
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny-llama
base_output_directory: $tmp/out
dataset_path: $tmp/data
per_device_batch_size: 2
max_target_length: 16
steps: 20
learning_rate: 0.001
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 0
log_period: 1
seed: 7
YML

# compare CPU_RUN CUDA_RUN STEPS LAYERS KMAX: every step's loss within the bound above.
compare() {
    python3 - "$tmp/out/$1/metrics.jsonl" "$tmp/out/$2/metrics.jsonl" "$3" "$4" "$5" <<'PY' || fail "$2 (cuda) vs $1 (cpu): losses differ beyond the bound"
import json, sys
a, b, steps, layers, kmax = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
la = {r["step"]: r["loss"] for r in map(json.loads, open(a)) if "loss" in r}
lb = {r["step"]: r["loss"] for r in map(json.loads, open(b)) if "loss" in r}
assert sorted(la) == sorted(lb) == list(range(1, steps + 1)), (sorted(la), sorted(lb))
u = 2.0 ** -24
gamma = kmax * u / (1 - kmax * u)
S = 16 * layers + 4
worst = 0.0
for t in range(1, steps + 1):
    bound = t * 2 * 2 * S * gamma * (1 + abs(la[t]))
    ratio = abs(la[t] - lb[t]) / bound
    worst = max(worst, ratio)
    if not ratio <= 1:  # NaN too
        print("step %d: cpu %.17g cuda %.17g |diff| %.3g > bound %.3g" % (t, la[t], lb[t], abs(la[t] - lb[t]), bound))
        sys.exit(1)
print("%s: %d steps, worst |diff| / bound = %.2g" % (b.split("/")[-2], steps, worst))
PY
}

# 1. cuda against cpu, 20 steps of the two small models.
for m in tiny-llama tiny-gemma2; do
    mt_train "$m-cpu" model_name=$m backend=cpu || continue
    mt_train "$m-cuda" model_name=$m backend=cuda || continue
    compare "$m-cpu" "$m-cuda" 20 2 64
    python3 - "$tmp/out/$m-cuda/metrics.jsonl" <<'PY' || fail "$m on cuda: the loss did not fall over 20 steps"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert sum(r["loss"] for r in rows[-5:]) < sum(r["loss"] for r in rows[:5]), [r["loss"] for r in rows]
PY
done
# The repository's tiny configs (4 layers, vocabulary 8192), 3 steps of 1 x 32 tokens.
for m in llama3-tiny gemma-tiny; do
    args=(model_name=$m steps=3 per_device_batch_size=1 max_target_length=32)
    mt_train "$m-cpu" "${args[@]}" backend=cpu || continue
    mt_train "$m-cuda" "${args[@]}" backend=cuda || continue
    compare "$m-cpu" "$m-cuda" 3 4 8192
done

# 1c. gemma4 (issue 18, models/model_gemma4.c) on cuda against cpu: 5 steps of a tiny
# model with KV sharing (layers 2-4 attend to 0 and 1), per-layer inputs, double-wide
# MLPs and global head_dim 16. About 21 stages per layer (the 16 above plus the
# per-layer input's gate, product, projection and norm and the layer_scalar): counted as
# 7 layers of 16 for its 5; KMAX 128 (the double-wide MLP).
mt_tiny_model "$tmp/cfg/models/tiny-gemma4.yml" gemma4 5
mt_train g4-cpu model_name=tiny-gemma4 steps=5 backend=cpu &&
mt_train g4-cuda model_name=tiny-gemma4 steps=5 backend=cuda &&
compare g4-cpu g4-cuda 5 7 128
# The same with Gemma 4's global head_dim 512 (kernels/cuda/attention.cu's 16 columns
# per lane; layers 1 and 3 global, layer 3 sharing layer 1's K/V). The same stage count;
# KMAX 2048, the out_proj's reduction over 4 heads x 512 (the scores' is 512). Loose by
# construction (attention scale 1.0 on unit-RMS q and k makes scores of order sqrt(512),
# so the losses' rounding is far below a worst case counted per term); what it guards
# is that the model runs there at all and stays finite: with the context's columns
# 256-511 left unwritten (8 columns per lane at 512) step 1 is NaN and the cuda run fails.
mt_train g4w-cpu model_name=tiny-gemma4 steps=5 backend=cpu global_head_dim=512 &&
mt_train g4w-cuda model_name=tiny-gemma4 steps=5 backend=cuda global_head_dim=512 &&
compare g4w-cpu g4w-cuda 5 7 2048

# 1b. dtype=bfloat16 on cuda (bf16 kernels, bf16 cuBLASLt GEMMs) against float32 on cpu,
# 60 steps of the tiny Llama: the band of tests/test_bf16_train.sh (which derives it),
# windows of 10 steps (tests/loss_band.py).
mt_train bf16-f32 model_name=tiny-llama backend=cpu steps=60 &&
mt_train bf16-cuda model_name=tiny-llama backend=cuda dtype=bfloat16 steps=60 &&
{ python3 tests/loss_band.py "$tmp/out/bf16-f32/metrics.jsonl" "$tmp/out/bf16-cuda/metrics.jsonl" 60 10 0.3 ||
      fail "cuda bf16 left the band of cpu float32"; }

# 2. Save and resume on cuda: steps 6..10 of a resumed run bitwise those of the whole run.
mt_train whole backend=cuda steps=10 checkpoint_period=5 || exit 1
mt_train resumed backend=cuda steps=10 checkpoint_period=5 load_checkpoint="$tmp/out/whole/checkpoints/step_5" || exit 1
for f in loss grad_norm lr; do
    [ "$(mt_column whole $f 6 10)" = "$(mt_column resumed $f 6 10)" ] || {
        fail "cuda run resumed from step 5 differs in $f"; paste <(mt_column whole $f 6 10) <(mt_column resumed $f 6 10); }
done
[ "$(mt_column whole loss 6 10 | wc -l)" -eq 5 ] || fail "the whole cuda run lacks steps 6..10"
# A cuda checkpoint is an ordinary one: the CPU backend resumes from it too.
mt_train on-cpu backend=cpu steps=6 checkpoint_period=5 load_checkpoint="$tmp/out/whole/checkpoints/step_5" || exit 1
[ "$(mt_column on-cpu loss 6 6 | wc -l)" -eq 1 ] || fail "backend=cpu did not resume from a cuda checkpoint"

# 3. A faulting kernel reaches the trainer: exit 1, the kernel's name, no step_N.tmp left.
CUDAEMU_FAIL_KERNEL=att_bwd_dkdv_kernel:3 "$bin" train "$tmp/cfg/run.yml" run_name=fault backend=cuda \
    steps=4 checkpoint_period=1 > "$tmp/fault.out" 2> "$tmp/fault.err"
rc=$?
[ $rc -eq 1 ] || fail "a faulting kernel: exit $rc, expected 1 ($(tail -3 "$tmp/fault.err"))"
grep -q "att_bwd_dkdv_kernel" "$tmp/fault.err" || fail "the error does not name the kernel: $(tail -3 "$tmp/fault.err")"
grep -qi "illegal" "$tmp/fault.err" || fail "the error does not carry CUDA's text: $(tail -3 "$tmp/fault.err")"
ls "$tmp/out/fault/checkpoints" 2>/dev/null | grep -q tmp && fail "a half-written checkpoint was left after the fault"
# the fault is in step 2's backward (3rd dk/dv launch, 2 layers): step 1 completed, step 2 never logged
[ "$(mt_column fault loss 2 4 | wc -l)" -eq 0 ] || fail "steps after the fault were logged"

mt_finish "cuda (emulated) matches cpu; resume bitwise; kernel fault -> exit 1"
