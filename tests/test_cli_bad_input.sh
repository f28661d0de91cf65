#!/usr/bin/env bash
# tests/test_cli_bad_input.sh BUILD_DIR: `meshtrain train` on bad input exits 2 with
# a stderr message naming the problem (the key, the value, the file), and writes
# nothing: no output directory is created and an existing run's files are untouched.
# Tiny shards are generated here (python3 standard library only).
set -u
build="${1:?usage: test_cli_bad_input.sh BUILD_DIR}"
bin="$build/meshtrain"
[ -x "$bin" ] || { echo "no $bin"; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mkdir -p "$tmp/cfg/models" "$tmp/data" "$tmp/bad_magic" "$tmp/truncated" "$tmp/big_token"
cat > "$tmp/cfg/models/tiny.yml" <<'YML'
decoder_block: llama2
vocab_size: 64
base_emb_dim: 32
base_num_query_heads: 4
base_num_kv_heads: 2
head_dim: 8
base_mlp_dim: 64
base_num_decoder_layers: 1
mlp_activations: ["silu", "linear"]
YML
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny
run_name: keep
base_output_directory: $tmp/out
dataset_path: $tmp/data
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
expect_bad "enum value" "dtype" "float32|bfloat16" -- train "$run" dtype=fp8
expect_bad "range" "per_device_batch_size" -- train "$run" per_device_batch_size=0
expect_bad "bfloat16 on cpu" "bfloat16" -- train "$run" backend=cpu dtype=bfloat16
expect_bad "missing model file" "nope.yml" -- train "$run" model_name=nope
expect_bad "missing config" "absent.yml" -- train "$tmp/cfg/absent.yml"
expect_bad "missing data dir" "$tmp/nodata" -- train "$run" dataset_path="$tmp/nodata"
expect_bad "missing data dir (new run)" "$tmp/nodata" -- train "$run" dataset_path="$tmp/nodata" base_output_directory="$tmp/out2"
expect_bad "shard with wrong magic" "bad_magic/train_000.bin" "magic" -- train "$run" dataset_path="$tmp/bad_magic"
expect_bad "truncated shard" "truncated/train_000.bin" -- train "$run" dataset_path="$tmp/truncated"
expect_bad "token id beyond the vocabulary" "vocab_size" -- train "$run" dataset_path="$tmp/big_token"
expect_bad "missing checkpoint" "$tmp/nockpt" -- train "$run" load_checkpoint="$tmp/nockpt"
expect_bad "not key=value" "steps" -- train "$run" steps
expect_bad "unknown command" "frobnicate" -- frobnicate "$run"

# Help lists the keys with their defaults and docs.
"$bin" --help > "$tmp/help.out" 2>&1 || fail "--help failed"
grep -q "learning_rate" "$tmp/help.out" && grep -q "0.0003" "$tmp/help.out" || fail "--help does not list learning_rate and its default"
"$bin" train --help > "$tmp/help.out" 2>&1 || fail "train --help failed"
grep -q "gradient_accumulation_steps" "$tmp/help.out" || fail "train --help does not list the keys"

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "ok"
