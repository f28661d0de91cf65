#!/usr/bin/env bash
# tests/test_cli_train.sh BUILD_DIR: end-to-end `meshtrain train / sample / plan` on a
# tiny model and tiny synthetic shards generated here (never data/kjv):
#  - determinism: two runs with the same seed write identical loss columns;
#  - resume: a run resumed from its step_5 checkpoint reproduces the uninterrupted
#    run's steps 6..10 bitwise (loss, lr, grad_norm as printed with %.17g), both
#    from a 10-step run's checkpoint and from a run that stopped at step 5 (with a
#    schedule that does not depend on `steps`);
#  - checkpoint files exist and no temporary directory is left;
#  - gradient accumulation: batch 1 x 2 micro-batches matches batch 2 (same tokens,
#    token-weighted mean) within the derived fp32 bounds of each step (tests/lib.sh
#    mt_fp32_bounds), and bf16 accumulators match fp32 ones within the bounds derived
#    from their roundings (mt_bf16_acc_bounds);
#  - sample prints text, deterministically for a seed; plan prints the memory table.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_train.sh "${1:-}"
mt_need_python3

mt_tmp

mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
mt_run_yml <<YML
tokenizer_path: $tmp/data/tokenizer.vocab
per_device_batch_size: 2
max_target_length: 16
steps: 10
learning_rate: 0.01
warmup_steps_fraction: 0.2
eval_interval: 5
eval_steps: 2
checkpoint_period: 5
log_period: 1
seed: 7
YML

# Shards: a noisy repeating pattern (learnable), two train shards and one val shard;
# a vocabulary file of 64 pieces with <unk> <s> </s> first.
mt_shards "$tmp/data" 1 train_000.bin=300 train_001.bin=400 val_000.bin=200
python3 - "$tmp/data" <<'PY'
import sys
d = sys.argv[1]
with open(d + "/tokenizer.vocab", "w", encoding="utf-8") as f:
    f.write("<unk>\t0\n<s>\t0\n</s>\t0\n")
    for i in range(3, 64):
        f.write("\u2581%s\t-%d\n" % (chr(ord('a') + i % 26) * (1 + i // 26), i))
PY


mt_train a || exit 1
mt_train a2 || exit 1
# Determinism.
for f in loss grad_norm lr val_loss; do
    [ "$(mt_column a $f 0 10)" = "$(mt_column a2 $f 0 10)" ] || fail "two runs with the same seed differ in $f"
done
[ "$(mt_column a loss 1 10 | wc -l)" -eq 10 ] || fail "metrics.jsonl of run a does not have 10 loss rows"
[ "$(mt_column a val_loss 0 0 | wc -l)" -eq 1 ] || fail "no evaluation before training (step 0 val_loss)"
[ "$(mt_column a val_loss 5 5 | wc -l)" -eq 1 ] || fail "no evaluation at step 5"
python3 - "$tmp/out/a/metrics.jsonl" <<'PY' || fail "metrics.jsonl rows lack fields or loss did not decrease"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
for r in train:
    for k in ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms", "mfu"):
        assert k in r, (k, r)
    assert r["tokens"] == 2 * 16, r
assert train[0]["lr"] == 0.0, "warmup starts at lr 0 (MaxText)"
assert train[-1]["loss"] < train[0]["loss"], (train[0]["loss"], train[-1]["loss"])
PY
grep -q "step 10/10" "$tmp/a.out" || fail "no console line for step 10: $(cat "$tmp/a.out")"

# Checkpoint files.
for s in 5 10; do
    for f in model.safetensors config.json train_state.safetensors; do
        [ -s "$tmp/out/a/checkpoints/step_$s/$f" ] || fail "missing checkpoints/step_$s/$f"
    done
done
ls "$tmp/out/a/checkpoints" | grep -q tmp && fail "a temporary checkpoint directory was left behind"

# Resume from the 10-step run's step 5: steps 6..10 bitwise equal.
mt_train c load_checkpoint="$tmp/out/a/checkpoints/step_5" || exit 1
for f in loss grad_norm lr val_loss; do
    [ "$(mt_column a $f 6 10)" = "$(mt_column c $f 6 10)" ] || {
        fail "resumed run differs in $f"; paste <(mt_column a $f 6 10) <(mt_column c $f 6 10); }
done
[ "$(mt_column c loss 1 5 | wc -l)" -eq 0 ] || fail "the resumed run re-ran steps 1..5"

# A run interrupted at step 5 (steps=5), resumed to 10. The schedule must not depend
# on `steps` for this to be the same run: constant learning rate.
const=(warmup_steps_fraction=0 cosine_learning_rate_final_fraction=1)
mt_train full "${const[@]}" || exit 1
mt_train half "${const[@]}" steps=5 || exit 1
mt_train rest "${const[@]}" load_checkpoint="$tmp/out/half/checkpoints/step_5" || exit 1
[ "$(mt_column full loss 1 5)" = "$(mt_column half loss 1 5)" ] || fail "steps=5 run differs from the first half"
[ "$(mt_column full loss 6 10)" = "$(mt_column rest loss 6 10)" ] || {
    fail "run resumed after an interruption differs"; paste <(mt_column full loss 6 10) <(mt_column rest loss 6 10); }

# Gradient accumulation: batch 1 x 2 micro-batches reads the same tokens as batch 2
# (the loader's windows are consecutive), and the loss is the token-weighted mean.
# Equal up to fp32 rounding of the summation order: each step's loss and grad norm
# within its derived bound (mt_fp32_bounds: 2 lambda sqrt(S) u kappa on the chain, plus
# what AdamW carries of the earlier steps' differences; was 1e-5 for every step).
mt_train ga1 eval_interval=0 steps=4 || exit 1
mt_train ga2 eval_interval=0 steps=4 per_device_batch_size=1 gradient_accumulation_steps=2 || exit 1
layout_tool="$build/tests/tools/mpi_layout"
mt_fp32_bounds ga1b 4 eval_interval=0
for f in loss grad_norm; do
    mt_check_bounds "$tmp/ga1b.bounds" $f ga1 ga2 || fail "gradient accumulation: $f differs from the large batch"
done
python3 - "$tmp/out/ga1/metrics.jsonl" "$tmp/out/ga2/metrics.jsonl" <<'PY' || fail "gradient accumulation read other tokens"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"] == 32, (x, y)
PY

# bfloat16 gradient accumulators (grad_dtype=bfloat16) against fp32 ones, the same 2
# micro-batches of 1: the bf16 run rounds each partial sum G_k = g_1 + ... + g_k of the
# micro-batch gradients to bf16 (u = 2^-8, 8 significant bits; train/trainer.h: fp32
# add, one rounding) where the fp32 run keeps it, so after the K = 2 micro-batches an
# element of the mean gradient differs by at most v (1 + v)^(K - 1) sum_k |G_k| / N
# (v = 2^-8 + 2^-22: with the fp32 adds' roundings; N the labelled tokens); the step-1
# grad norm by at most the norm of those, relative; AdamW turns each element's
# difference into a parameter difference (at most lr x 2.006 per step) and the next
# step's loss moves by lambda sqrt(sum_i (g_i dp_i)^2) (independent roundings add in
# quadrature, lambda 6), and from step 2 the parameter differences move the gradients
# too (through the condition the perturbed run measures): tests/tools/mpi_layout.c
# derive_bounds, with the partial sums from `mpi_layout run-acc`. Plus the fp32 bound of
# the two runs' other roundings. Step 1's loss is bitwise equal (the first forward
# does not see the accumulator). Was 1e-2 of the loss for every step, not derived.
# Measured: 0.005 of the bound (losses), 0.006 (grad norms; the step-1 bound 6.7e-3 is
# each element's worst case, the norm of the worst cases). MT_CHECK_PLANT=4 (the bf16
# run's values moved by 4 bounds) fails both; a planted scale of 1 + 2^-5 on the bf16
# partial sums fails the grad norm at 4.6 bounds (not the losses: AdamW's update is
# invariant to a gradient's scale). From step 2 the bounds (1.6e-2 to 8e-2 of the loss)
# are those of the fp32 comparison above: elements whose gradient is near its rounding
# error may flip their Adam update (up to 2 lr each) in the worst case.
mt_train gab eval_interval=0 steps=4 per_device_batch_size=1 gradient_accumulation_steps=2 grad_dtype=bfloat16 || exit 1
mt_bf16_acc_bounds gabb 4 eval_interval=0 per_device_batch_size=1 gradient_accumulation_steps=2
for f in loss grad_norm; do
    mt_check_bounds "$tmp/gabb.bounds" $f ga2 gab || fail "bfloat16 accumulation: $f differs from fp32 accumulation"
done
# the bounds' reference is the fp32 run's trajectory: run-acc's extra pass over the
# micro-batches leaves its steps bitwise those of `train` (same losses)
python3 - "$tmp/out/ga2/metrics.jsonl" "$tmp/out/gab/metrics.jsonl" "$tmp/gabb/loss.txt" <<'PY' ||
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["loss"] for x in a] == [float(l) for l in open(sys.argv[3])], "run-acc is not the fp32 run"
assert a[0]["loss"] == b[0]["loss"]  # the first forward does not see the accumulator
assert a[1]["loss"] != b[1]["loss"] or a[0]["grad_norm"] != b[0]["grad_norm"], "bf16 rounding had no effect"
PY
    fail "bfloat16 accumulation: step 1, or the bounds' reference"

# Sample: text, the same for the same seed, greedy works.
ck="$tmp/out/a/checkpoints/step_10"
s1="$("$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" sample_length=20 2> "$tmp/s.err")" || fail "sample failed: $(cat "$tmp/s.err")"
s2="$("$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" sample_length=20 2> "$tmp/s.err")" || fail "sample failed"
[ -n "$s1" ] || fail "sample printed nothing"
echo "$s1" | grep -q '[a-z]' || fail "sample printed no pieces: '$s1'"
[ "$s1" = "$s2" ] || fail "sampling is not deterministic for a seed"
"$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" temperature=0 top_k=5 > /dev/null 2> "$tmp/s.err" || fail "greedy sample failed: $(cat "$tmp/s.err")"
"$bin" sample "$tmp/cfg/run.yml" > /dev/null 2>&1; [ $? -eq 2 ] || fail "sample without load_checkpoint must exit 2"

# Plan: the table and JSON; the optimizer holds m and v (2 x 4 bytes per parameter) and
# the AdamW segment table (24 bytes per parameter tensor, train/optimizer.h: the tiny
# Llama's 2 layers of 2 norms and 7 matrices, embedding, final norm and lm_head: 21).
"$bin" plan "$tmp/cfg/run.yml" > "$tmp/plan.out" 2>&1 || fail "plan failed: $(cat "$tmp/plan.out")"
grep -q "optimizer" "$tmp/plan.out" && grep -q "peak" "$tmp/plan.out" || fail "plan output: $(cat "$tmp/plan.out")"
"$bin" plan "$tmp/cfg/run.yml" --json > "$tmp/plan.json" 2>&1 || fail "plan --json failed"
python3 - "$tmp/plan.json" <<'PY' || fail "plan --json: $(cat "$tmp/plan.json")"
import json, sys
p = json.load(open(sys.argv[1]))
n = p["num_params"]
assert p["total"]["optimizer"] == 8 * n + 24 * (9 * 2 + 3), (p["total"]["optimizer"], n)
assert p["total"]["params"] >= 4 * n
assert p["peak_bytes"] >= sum(p["live_at_peak"].values())
PY

mt_finish ok
