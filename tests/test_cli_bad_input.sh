#!/usr/bin/env bash
# tests/test_cli_bad_input.sh BUILD_DIR: `meshtrain train` on bad input exits 2 with
# a stderr message naming the problem (the key, the value, the file), and writes
# nothing: no output directory is created and an existing run's files are untouched.
# Tiny shards are generated here (python3 standard library only).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_bad_input.sh "${1:-}"
mt_need_python3

mt_tmp

mkdir -p "$tmp/cfg/models" "$tmp/data" "$tmp/bad_magic" "$tmp/truncated" "$tmp/big_token"
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama 1
mt_run_yml <<YML
run_name: keep
per_device_batch_size: 2
max_target_length: 8
steps: 2
eval_interval: 1
eval_steps: 1
checkpoint_period: 1
log_period: 1
YML

# shard DIR NAME COUNT [MAGIC] [TRUNCATE_TO_TOKENS] [MAX_TOKEN]
python3 - "$tmp" <<'PY'
import struct, sys, random
tmp = sys.argv[1]
def shard(path, count, magic=20240520, keep=None, top=64):
    rng = random.Random(count)
    toks = [rng.randrange(top) for _ in range(count)]
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, 1, count
    body = struct.pack("<256i", *hdr) + struct.pack("<%dH" % count, *toks)
    if keep is not None:
        body = body[:1024 + 2 * keep]
    open(path, "wb").write(body)
shard(tmp + "/data/train_000.bin", 2000)
shard(tmp + "/data/val_000.bin", 500)
shard(tmp + "/bad_magic/train_000.bin", 2000, magic=12345)
shard(tmp + "/bad_magic/val_000.bin", 500)
shard(tmp + "/truncated/train_000.bin", 2000, keep=1000)
shard(tmp + "/truncated/val_000.bin", 500)
shard(tmp + "/big_token/train_000.bin", 2000, top=100)
shard(tmp + "/big_token/val_000.bin", 500)
PY

# A good run first: its outputs must survive every bad run below unchanged.
if ! "$bin" train "$tmp/cfg/run.yml" > "$tmp/good.out" 2> "$tmp/good.err"; then
    cat "$tmp/good.out" "$tmp/good.err"
    fail "the good run failed"
    exit 1
fi
snapshot() { (cd "$tmp/out" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . | sort); }
before="$(snapshot)"
[ -f "$tmp/out/keep/checkpoints/step_2/model.safetensors" ] || fail "good run wrote no checkpoint"

# expect_bad DESCRIPTION PATTERN... -- ARGS: exit code 2, every PATTERN in stderr.
expect_bad() {
    local desc="$1"; shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$bin" "$@" > "$tmp/bad.out" 2> "$tmp/bad.err"
    local rc=$?
    if [ "$rc" -ne 2 ]; then
        fail "$desc: exit code $rc, expected 2 (stderr: $(cat "$tmp/bad.err"))"
        return
    fi
    grep -q "^meshtrain: error: " "$tmp/bad.err" || fail "$desc: no 'meshtrain: error:' line: $(cat "$tmp/bad.err")"
    for p in "${pats[@]}"; do
        grep -qF -- "$p" "$tmp/bad.err" || fail "$desc: stderr does not mention '$p': $(cat "$tmp/bad.err")"
    done
    local after
    after="$(snapshot)"
    [ "$before" = "$after" ] || fail "$desc: the output directory changed"
    [ ! -e "$tmp/out2" ] || fail "$desc: created an output directory"
}

run="$tmp/cfg/run.yml"
expect_bad "unknown key" "lerning_rate" "learning_rate" -- train "$run" lerning_rate=0.1
printf 'model_name: tiny\nbogus_key: 1\n' > "$tmp/cfg/bogus.yml"
expect_bad "unknown key in file" "bogus_key" "bogus.yml" -- train "$tmp/cfg/bogus.yml" base_output_directory="$tmp/out2"
expect_bad "wrong type" "steps" "abc" "integer" -- train "$run" steps=abc
expect_bad "wrong type (float)" "learning_rate" "fast" -- train "$run" learning_rate=fast
# integers are decimal digits with an optional '-': no '+', no blanks (strtoll takes both)
expect_bad "integer with a plus sign" "steps" "+5" "integer" -- train "$run" steps=+5
expect_bad "integer with a blank" "per_device_batch_size" "integer" -- train "$run" "per_device_batch_size= 8"
expect_bad "decimal beyond double" "learning_rate" "1e400" "out of range" -- train "$run" learning_rate=1e400
# the nine remat tensor keys are read with remat_policy=custom only: a changed one is refused
expect_bad "remat tensor key without custom" "query_proj" "remat_policy=custom" -- train "$run" query_proj=device
expect_bad "enum value" "dtype" "float32|bfloat16" -- train "$run" dtype=fp8
expect_bad "range" "per_device_batch_size" -- train "$run" per_device_batch_size=0
expect_bad "layers beyond the plan's reach (it grew to 24 GB before)" "base_num_decoder_layers" "10000000" "65536" -- plan "$run" base_num_decoder_layers=10000000
expect_bad "bfloat16 master weights" "weight_dtype=bfloat16" "float32" -- train "$run" backend=cpu weight_dtype=bfloat16
expect_bad "missing model file" "nope.yml" -- train "$run" model_name=nope
expect_bad "missing config" "absent.yml" -- train "$tmp/cfg/absent.yml"
expect_bad "missing data dir" "$tmp/nodata" -- train "$run" dataset_path="$tmp/nodata"
expect_bad "missing data dir (new run)" "$tmp/nodata" -- train "$run" dataset_path="$tmp/nodata" base_output_directory="$tmp/out2"
expect_bad "shard with wrong magic" "bad_magic/train_000.bin" "magic" -- train "$run" dataset_path="$tmp/bad_magic"
expect_bad "truncated shard" "truncated/train_000.bin" -- train "$run" dataset_path="$tmp/truncated"
expect_bad "token id beyond the vocabulary" "vocab_size" -- train "$run" dataset_path="$tmp/big_token"
# gemma4 keys (issue 18): a sharing layer without a donor, a gemma4 key on another block
cp "$(dirname "$0")/../configs/models/gemma4-e2b.yml" "$tmp/cfg/models/"
expect_bad "gemma4: every layer shares KV" "num_kv_shared_layers=35" -- train "$run" model_name=gemma4-e2b \
    num_kv_shared_layers=35
expect_bad "gemma4: a global layer without a donor" "num_kv_shared_layers=34" "no earlier global layer" -- \
    train "$run" model_name=gemma4-e2b num_kv_shared_layers=34
expect_bad "gemma4 key on llama" "global_head_dim=64" "gemma4 key" -- train "$run" global_head_dim=64
# parameter windows of a weight: an unknown unit
expect_bad "param_window_unit unknown" "param_window_unit" "weights" "layer" -- plan "$run" param_window_unit=weights
expect_bad "grad_window_chunks negative" "grad_window_chunks" "-1" -- plan "$run" grad_window_chunks=-1
expect_bad "grad_window_chunks above the rows" "grad_window_chunks=1000000000000" "rows" -- plan "$run" \
    num_devices=2 ici_fsdp_parallelism=2 grad_window_chunks=1000000000000
expect_bad "grad_window_chunks with a tensor axis" "grad_window_chunks=2" "ici_tensor_parallelism" -- plan "$run" \
    num_devices=2 ici_tensor_parallelism=2 grad_window_chunks=2
# gemma4 values that no Gemma 4 has: a local/global period of 0 (every layer global with
# the window set), a RoPE scaling its config.json cannot hold (plan: an accepted one
# would not allocate E2B's 70 GiB here)
expect_bad "gemma4: sliding_window_pattern 0" "sliding_window_pattern=0" "gemma4" -- plan "$run" \
    model_name=gemma4-e2b sliding_window_pattern=0
expect_bad "gemma4: rope_type llama3" "rope_type=llama3" "gemma4" -- plan "$run" model_name=gemma4-e2b rope_type=llama3
expect_bad "gemma4: per-layer table past int64" "per_layer_input_dim" -- plan "$run" model_name=gemma4-e2b \
    per_layer_input_dim=1000000000000000
# range messages say what is accepted (0 is no mesh axis; 1 is no beta)
expect_bad "ici axis -2" "ici_tensor_parallelism" "-1 (fill the world) or >= 1" -- plan "$run" ici_tensor_parallelism=-2
grep -q ">= -1" "$tmp/bad.err" && fail "ici_tensor_parallelism=-2 offers 0: $(cat "$tmp/bad.err")"
expect_bad "ici axis 0" "ici_tensor_parallelism=0" ">= 1 or -1" -- plan "$run" ici_tensor_parallelism=0
expect_bad "adam_b1 above 1" "adam_b1" "[0, 1)" -- train "$run" adam_b1=2
expect_bad "adam_b1 at 1" "adam_b1" "[0, 1)" -- train "$run" adam_b1=1
# top_k beyond the vocabulary (vocab_size 64 here): the config's model for train, the
# checkpoint's for sample
expect_bad "top_k beyond the vocabulary" "top_k" "65" "vocab_size 64" -- train "$run" top_k=65
expect_bad "top_k beyond the checkpoint's vocabulary" "top_k" "65" "vocab_size 64" -- \
    sample "$run" load_checkpoint="$tmp/out/keep/checkpoints/step_2" top_k=65 prompt_ids=1
expect_bad "missing checkpoint" "$tmp/nockpt" -- train "$run" load_checkpoint="$tmp/nockpt"
expect_bad "not key=value" "steps" -- train "$run" steps
expect_bad "unknown command" "frobnicate" -- frobnicate "$run"

# Paths given empty, or of the wrong kind, or missing: the message names the key / the real problem.
expect_bad "empty dataset_path" "dataset_path" -- train "$run" dataset_path= base_output_directory="$tmp/out2"
expect_bad "empty base_output_directory" "base_output_directory" -- train "$run" base_output_directory= \
    run_name="meshtrain_test_bad_$$"
[ ! -e "/meshtrain_test_bad_$$" ] || { fail "empty base_output_directory wrote under /"; rm -rf "/meshtrain_test_bad_$$"; }
expect_bad "config is a directory" "$tmp/cfg" "is a directory" -- train "$tmp/cfg"
expect_bad "missing checkpoint says so" "$tmp/nockpt" "does not exist" -- train "$run" load_checkpoint="$tmp/nockpt"
expect_bad "both starting points" "load_checkpoint" "load_parameters_path" -- \
    train "$run" load_checkpoint="$tmp/out/keep/checkpoints/step_2" load_parameters_path="$tmp/out/keep/checkpoints/step_2"
expect_bad "tokenizer_path is a directory" "tokenizer_path" "is a directory" -- \
    sample "$run" load_checkpoint="$tmp/out/keep/checkpoints/step_2" tokenizer_path="$tmp/data"
# A tokenizer far smaller than the model's vocabulary (more than padding): another
# model's tokenizer, refused before sampling (config.json says vocab_size 8192).
sed 's/^vocab_size: 64$/vocab_size: 8192/' "$tmp/cfg/models/tiny.yml" > "$tmp/cfg/models/tiny8k.yml"
"$bin" train "$run" model_name=tiny8k base_output_directory="$tmp/o8k" steps=1 eval_interval=0 \
    > "$tmp/o8k.log" 2>&1 || fail "the 8192-id model did not train: $(cat "$tmp/o8k.log")"
python3 - "$tmp" <<'PY'
import sys
t = sys.argv[1]
with open(t + "/small.vocab", "w") as f:
    f.write("<unk>\t0\n<s>\t0\n</s>\t0\n" + "".join("p%d\t0\n" % i for i in range(597)))
PY
expect_bad "tokenizer smaller than the model" "tokenizer_path" "600" "8192" -- \
    sample "$run" load_checkpoint="$tmp/o8k/keep/checkpoints/step_1" tokenizer_path="$tmp/small.vocab" prompt_ids=1
# sample's model is the checkpoint's: a top_k within its 8192 ids but past the config
# model's 64 samples (the config's model file describes another model)
python3 -c 'print("<unk>\t0\n<s>\t0\n</s>\t0\n" + "".join("p%d\t0\n" % i for i in range(8189)), end="")' \
    > "$tmp/v8k.vocab"
"$bin" sample "$run" load_checkpoint="$tmp/o8k/keep/checkpoints/step_1" tokenizer_path="$tmp/v8k.vocab" \
    prompt_ids=1 sample_length=2 top_k=100 > "$tmp/s8k.out" 2>&1 ||
    fail "sample top_k=100 of the 8192-id checkpoint with a 64-id config model: $(cat "$tmp/s8k.out")"
expect_bad "top_k beyond the 8192-id checkpoint" "top_k" "8193" "vocab_size 8192" -- \
    sample "$run" load_checkpoint="$tmp/o8k/keep/checkpoints/step_1" tokenizer_path="$tmp/v8k.vocab" \
    prompt_ids=1 top_k=8193
expect_bad "packing separator beyond the vocabulary" "packing_separator_id" "99999" "vocab_size" -- \
    train "$run" packing=true packing_separator_id=99999 base_output_directory="$tmp/out2"
# An empty entry inside a list is an error naming the key (as train_files=a.bin, is).
expect_bad "empty prompt_ids entry" "prompt_ids" "1,,2" "empty entry" -- \
    sample "$run" load_checkpoint="$tmp/out/keep/checkpoints/step_2" prompt_ids=1,,2
expect_bad "trailing prompt_ids comma" "prompt_ids" "empty entry" -- \
    sample "$run" load_checkpoint="$tmp/out/keep/checkpoints/step_2" prompt_ids=1,2,
# MESHTRAIN_PYTHON set to something that cannot run: the user's input, named (exit 2).
MESHTRAIN_PYTHON=/nonexistent/python expect_bad "MESHTRAIN_PYTHON missing" "MESHTRAIN_PYTHON" "/nonexistent/python" -- \
    prepare --help
MESHTRAIN_PYTHON="$tmp/cfg" expect_bad "MESHTRAIN_PYTHON a directory" "MESHTRAIN_PYTHON" -- prepare --help
MESHTRAIN_PYTHON=no-such-python-here expect_bad "MESHTRAIN_PYTHON not on PATH" "MESHTRAIN_PYTHON" "PATH" -- \
    prepare --help
# prepare --help cites what a user has (llm.c's writer), not a design file they lack.
"$bin" prepare --help > "$tmp/prep_help.out" 2>&1 || fail "prepare --help failed: $(cat "$tmp/prep_help.out")"
grep -q "DESIGN.md" "$tmp/prep_help.out" && fail "prepare --help cites DESIGN.md"
grep -q "data_common.py" "$tmp/prep_help.out" || fail "prepare --help does not cite llm.c's data_common.py"
# ... and names the command the user ran, not the script behind it.
grep -q "prepare_data" "$tmp/prep_help.out" && fail "prepare --help names the script: $(grep prepare_data "$tmp/prep_help.out")"
head -1 "$tmp/prep_help.out" | grep -q "^usage: meshtrain prepare " || fail "prepare --help: $(head -1 "$tmp/prep_help.out")"
expect_bad "override first" "steps=20" "CONFIG.yml must come first" -- train steps=20 "$run"
# A missing model file: each directory tried once, by its real path.
# From the config's own directory ./configs/models and <CONFIG dir>/configs/models are one.
(cd "$tmp/cfg" && "$bin" train run.yml model_name=nope > /dev/null 2> "$tmp/nope.err")
tried="$(sed -n 's/.* in //p' "$tmp/nope.err" | tr ',' '\n' | sed 's/^ *//')"
[ "$(echo "$tried" | sort | uniq -d)" = "" ] || fail "model_name=nope lists a directory twice: $(cat "$tmp/nope.err")"
echo "$tried" | grep -qv '^/' && fail "model_name=nope lists a relative path: $(cat "$tmp/nope.err")"
# Model files: a missing dimension is named as missing; run keys are refused.
printf 'decoder_block: llama2\nvocab_size: 64\n' > "$tmp/cfg/models/nowidth.yml"
expect_bad "model file without base_emb_dim" "base_emb_dim" "missing" "nowidth.yml" -- train "$run" model_name=nowidth
sed 's/^vocab_size: 64$/vocab_size: 64\nsteps: 3/' "$tmp/cfg/models/tiny.yml" > "$tmp/cfg/models/runkey.yml"
expect_bad "run key in a model file" "steps" "runkey.yml" "run key" -- train "$run" model_name=runkey
# YAML: a key set twice in one file.
printf 'model_name: tiny\nsteps: 3\nlog_period: 1\nsteps: 5\n' > "$tmp/cfg/dup.yml"
expect_bad "duplicate key" "steps" "dup.yml" "lines 2 and 4" -- train "$tmp/cfg/dup.yml" base_output_directory="$tmp/out2"
# Values: decimal floats only, bools true|false only, did-you-mean ignores case.
expect_bad "hex float" "learning_rate" "0x10" -- train "$run" learning_rate=0x10
expect_bad "bool yes" "logits_via_embedding" "yes" -- train "$run" logits_via_embedding=yes
expect_bad "upper-case key" "STEPS" "did you mean 'steps'" -- train "$run" STEPS=20
# Sizes whose byte counts overflow int64 are bad input naming the key; a huge batch
# that does fit is planned without allocating it (plan needs no memory of its size).
expect_bad "overflowing batch" "per_device_batch_size" -- plan "$run" per_device_batch_size=100000000000000
# 1e9 x 8 tokens: a host array of 4 bytes per token would be 32 GB.
"$bin" plan "$run" per_device_batch_size=1000000000 > "$tmp/plan.out" 2>&1 || fail "plan of a 1e9 batch: $(cat "$tmp/plan.out")"
# plan: --json anywhere; a model file given as CONFIG prints its own name.
"$bin" plan --json "$run" > "$tmp/plan.json" 2>&1 && grep -q '"model_name": "tiny"' "$tmp/plan.json" ||
    fail "plan --json CONFIG: $(cat "$tmp/plan.json")"
"$bin" plan "$tmp/cfg/models/tiny.yml" > "$tmp/plan.out" 2>&1 && head -1 "$tmp/plan.out" | grep -q ": tiny," ||
    fail "plan MODEL.yml does not print the model used: $(head -1 "$tmp/plan.out")"

# Help lists the keys with their defaults and docs.
"$bin" --help > "$tmp/help.out" 2>&1 || fail "--help failed"
grep -q "learning_rate" "$tmp/help.out" && grep -q "0.0003" "$tmp/help.out" || fail "--help does not list learning_rate and its default"
"$bin" train --help > "$tmp/help.out" 2>&1 || fail "train --help failed"
grep -q "gradient_accumulation_steps" "$tmp/help.out" || fail "train --help does not list the keys"

mt_finish "ok"
