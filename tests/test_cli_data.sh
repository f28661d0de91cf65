#!/usr/bin/env bash
# tests/test_cli_data.sh BUILD_DIR: how `meshtrain train` finds and orders its data
# (train/data.h), on a tiny model and shards made here:
#  - llm.c's names (<name>_train_NNNNNN.bin, <name>_val_NNNNNN.bin) are found; so are
#    a dataset_path glob and train_files / eval_files given as a YAML list or as a,b;
#  - a directory holding both namings of a split exits 2 naming a file of each; a
#    listed file that does not exist exits 2 naming train_files and the file;
#  - shuffling (on by default): the losses differ from enable_data_shuffling=false and
#    between two data_shuffle_seed values, not between two runs of one seed; the val
#    split is never shuffled (step-0 val_loss, before any update, is the same with and
#    without shuffling, although eval_steps reads only part of the split);
#  - resume is bitwise (loss, grad_norm, val_loss as printed) from a checkpoint in
#    epoch 0 (the run then crosses two epoch boundaries) and from one in epoch 1 (the
#    epochs are read from train_state.safetensors, so the test knows it crossed them);
#  - resuming with another enable_data_shuffling or data_shuffle_seed exits 2 naming it;
#    another `seed` (data_shuffle_seed -1 follows it) keeps the checkpoint's order.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_data.sh "${1:-}"
mt_need_python3

mt_tmp
mkdir -p "$tmp/cfg/models"
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
# B=2 x T=16: windows of 32 tokens; (100-1)/32 = 3 and (70-1)/32 = 2: 5 steps per epoch.
mt_shards "$tmp/data" 1 fw_train_000001.bin=100 fw_train_000002.bin=70 fw_val_000000.bin=200
mt_run_yml <<YML
per_device_batch_size: 2
max_target_length: 16
steps: 12
learning_rate: 0.01
warmup_steps_fraction: 0
eval_interval: 4
eval_steps: 2
checkpoint_period: 3
log_period: 1
backend: cpu
seed: 7
YML

# expect2 WHAT TEXT... -- ARGS: `meshtrain train` exits 2 and stderr holds every TEXT
expect2() {
    local what=$1; shift
    local texts=()
    while [ "$1" != "--" ]; do texts+=("$1"); shift; done
    shift
    "$bin" train "$tmp/cfg/run.yml" "$@" > "$tmp/e.out" 2> "$tmp/e.err"
    local rc=$?
    [ $rc -eq 2 ] || { fail "$what: exit $rc, want 2: $(cat "$tmp/e.err")"; return; }
    for t in "${texts[@]}"; do grep -qF -- "$t" "$tmp/e.err" || fail "$what: message lacks '$t': $(cat "$tmp/e.err")"; done
}
# epoch RUN STEP: data_epoch of the checkpoint's train_state.safetensors
epoch() {
    python3 - "$tmp/out/$1/checkpoints/step_$2/train_state.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"]["data_epoch"])
PY
}

# llm.c's names, shuffled (default), twice with one seed.
mt_train a || exit 1
mt_train a2 || exit 1
[ "$(mt_column a loss 1 12 | wc -l)" -eq 12 ] || fail "run a has no 12 loss rows"
for f in loss grad_norm val_loss; do
    [ "$(mt_column a $f 0 12)" = "$(mt_column a2 $f 0 12)" ] || fail "two runs with one seed differ in $f"
done
# File order, and another shuffle seed: other batches, so other losses.
mt_train plain enable_data_shuffling=false || exit 1
mt_train seed5 data_shuffle_seed=5 || exit 1
[ "$(mt_column a loss 1 12)" != "$(mt_column plain loss 1 12)" ] || fail "shuffling did not change the batches"
[ "$(mt_column a loss 1 12)" != "$(mt_column seed5 loss 1 12)" ] || fail "data_shuffle_seed did not change the batches"
[ "$(mt_column a loss 1 1)" = "$(mt_column plain loss 1 1)" ] && fail "the first batch is the file's first with shuffling"
# data_shuffle_seed=-1 means seed: seed=7 is data_shuffle_seed=7 (init is seed 7 in both).
mt_train seed7 data_shuffle_seed=7 || exit 1
[ "$(mt_column a loss 1 12)" = "$(mt_column seed7 loss 1 12)" ] || fail "data_shuffle_seed=-1 is not seed"
# The val split is read in file order either way.
[ "$(mt_column a val_loss 0 0)" = "$(mt_column plain val_loss 0 0)" ] || fail "the val split was shuffled"
[ -n "$(mt_column a val_loss 0 0)" ] || fail "no step-0 val_loss"

# Resume: from step 3 (epoch 0; the rest crosses epochs 1 and 2) and step 6 (epoch 1).
[ "$(epoch a 3)" = 0 ] && [ "$(epoch a 6)" = 1 ] && [ "$(epoch a 12)" = 2 ] ||
    fail "epochs at steps 3, 6, 12 are $(epoch a 3), $(epoch a 6), $(epoch a 12); want 0, 1, 2"
for s in 3 6; do
    mt_train r$s load_checkpoint="$tmp/out/a/checkpoints/step_$s" || continue
    for f in loss grad_norm val_loss; do
        [ "$(mt_column a $f $((s + 1)) 12)" = "$(mt_column r$s $f $((s + 1)) 12)" ] || {
            fail "resumed from step $s: $f differs"; paste <(mt_column a $f $((s + 1)) 12) <(mt_column r$s $f $((s + 1)) 12); }
    done
done
mt_train pr3 enable_data_shuffling=false load_checkpoint="$tmp/out/plain/checkpoints/step_3" || true
[ "$(mt_column plain loss 4 12)" = "$(mt_column pr3 loss 4 12)" ] || fail "resume without shuffling differs"
# seed may change on resume (the parameters come from the checkpoint): with
# data_shuffle_seed = -1 the run keeps the checkpoint's order.
mt_train r3s seed=99 load_checkpoint="$tmp/out/a/checkpoints/step_3" || true
[ "$(mt_column a loss 4 12)" = "$(mt_column r3s loss 4 12)" ] || fail "resume with another seed changed the data order"
expect2 "resume, shuffling turned off" "enable_data_shuffling" -- \
    run_name=x1 enable_data_shuffling=false load_checkpoint="$tmp/out/a/checkpoints/step_3"
expect2 "resume, another shuffle seed" "data_shuffle_seed" -- \
    run_name=x2 data_shuffle_seed=9 load_checkpoint="$tmp/out/a/checkpoints/step_3"

# dataset_path as a glob; train_files / eval_files as a YAML list and as a,b.
mt_train glob dataset_path="$tmp/data/fw_*.bin" || true
[ "$(mt_column a loss 1 12)" = "$(mt_column glob loss 1 12)" ] || fail "dataset_path glob reads other batches"
cp "$tmp/cfg/run.yml" "$tmp/cfg/list.yml"
cat >> "$tmp/cfg/list.yml" <<YML
train_files:
  - $tmp/data/fw_train_000001.bin
  - $tmp/data/fw_train_00000[2].bin
eval_files: [$tmp/data/fw_val_000000.bin]
YML
sed -i "s|^dataset_path:.*|dataset_path: \"\"|" "$tmp/cfg/list.yml"
"$bin" train "$tmp/cfg/list.yml" run_name=list > "$tmp/list.out" 2>&1 || fail "train_files list: $(cat "$tmp/list.out")"
[ "$(mt_column a loss 1 12)" = "$(mt_column list loss 1 12)" ] || fail "train_files list reads other batches"
mt_train cli dataset_path= train_files="$tmp/data/fw_train_000001.bin,$tmp/data/fw_train_000002.bin" \
    eval_files="$tmp/data/fw_val_000000.bin" || true
[ "$(mt_column a loss 1 12)" = "$(mt_column cli loss 1 12)" ] || fail "train_files a,b reads other batches"
expect2 "missing listed file" "train_files" "nope_train_1.bin" -- \
    run_name=x3 train_files="$tmp/data/fw_train_000001.bin,$tmp/data/nope_train_1.bin"
# An empty list is unset, in YAML as on the command line (train_files=): the dataset
# split, the same batches as run a.
{ grep -v '^train_files:\|^eval_files:' "$tmp/cfg/run.yml"; printf 'train_files: []\neval_files: [ ]\n'; } > "$tmp/cfg/emptylist.yml"
"$bin" train "$tmp/cfg/emptylist.yml" run_name=emptylist > "$tmp/emptylist.out" 2>&1 ||
    fail "train_files: [] (unset): $(cat "$tmp/emptylist.out")"
[ "$(mt_column a loss 1 12)" = "$(mt_column emptylist loss 1 12)" ] || fail "train_files: [] reads other batches than unset"
# eval_files is checked whenever it is set, even with evaluation off
expect2 "empty eval_files glob, eval off" "eval_files" "zz*.bin" "matches no file" -- \
    run_name=x5 eval_interval=0 eval_files="$tmp/zz*.bin"
[ ! -e "$tmp/out/x5" ] || fail "empty eval_files glob, eval off: wrote $tmp/out/x5"

# Both namings in one directory: exit 2 naming both files.
cp "$tmp/data/fw_train_000001.bin" "$tmp/data/train_000.bin"
expect2 "ambiguous directory" "train_000.bin" "fw_train_000001.bin" "dataset_path" -- run_name=x4

mt_finish ok
