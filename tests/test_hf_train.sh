#!/usr/bin/env bash
# tests/test_hf_train.sh BUILD_DIR: `meshtrain train ... load_parameters_path=DIR`
# fine-tunes from a Hugging Face model directory (tests/reference/hf_tiny_dir.py: a
# tiny Gemma 2 in bfloat16, as one model.safetensors and as 3 shards with
# model.safetensors.index.json; written with the Python standard library):
#  - with learning_rate 0 the step-2 checkpoint holds exactly the directory's weights
#    (so they were loaded, not initialised), from the single file and from the shards;
#  - both layouts give bitwise the same losses;
#  - with a learning rate the loss goes down and the checkpoint differs from the start;
#  - when scripts/setup-hf-venv.sh's transformers is there, it loads the fine-tuned
#    checkpoint with no missing or unexpected keys.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_hf_train.sh "${1:-}"
tiny="$src/tests/reference/hf_tiny_dir.py"
mt_need_python3

mt_tmp

mkdir -p "$tmp/cfg/models" "$tmp/data"
python3 "$tiny" yml > "$tmp/cfg/models/tiny-gemma2.yml"
python3 "$tiny" write "$tmp/hf1" bf16 1
python3 "$tiny" write "$tmp/hf3" bf16 3
[ -f "$tmp/hf3/model.safetensors.index.json" ] || fail "no sharded directory was written"
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny-gemma2
base_output_directory: $tmp/out
dataset_path: $tmp/data
per_device_batch_size: 2
max_target_length: 16
steps: 2
learning_rate: 0
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 2
log_period: 1
seed: 3
YML
python3 - "$tmp/data" <<'PY'
import struct, sys, random
d = sys.argv[1]
rng = random.Random(5)
def tokens(n):
    out = []
    while len(out) < n:
        out.append(2)
        for i in range(rng.randrange(5, 20)):
            out.append(3 + (i * 5 + rng.randrange(2)) % 61)
    return out[:n]
def shard(path, toks):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
shard(d + "/train_000.bin", tokens(600))
shard(d + "/val_000.bin", tokens(200))
PY

losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$tmp/out/$1/metrics.jsonl"; }

# lr 0: the weights stay those loaded (AdamW's decay is scaled by the lr too).
mt_train frozen1 load_parameters_path="$tmp/hf1" || exit 1
mt_train frozen3 load_parameters_path="$tmp/hf3" || exit 1
python3 "$tiny" same "$tmp/out/frozen1/checkpoints/step_2" "$tmp/hf1" ||
    fail "the checkpoint of an lr-0 run from hf1 does not hold hf1's weights"
python3 "$tiny" same "$tmp/out/frozen3/checkpoints/step_2" "$tmp/hf3" ||
    fail "the checkpoint of an lr-0 run from the sharded hf3 does not hold its weights"
[ "$(losses frozen1)" = "$(losses frozen3)" ] || fail "single-file and sharded loads differ: $(losses frozen1) vs $(losses frozen3)"
# A run that does not load starts from its own initialisation: different losses.
mt_train scratch || exit 1
[ "$(losses scratch)" != "$(losses frozen1)" ] || fail "load_parameters_path had no effect on the loss"

# Fine-tuning: the loss decreases and the weights move.
mt_train tune load_parameters_path="$tmp/hf3" steps=12 learning_rate=0.01 checkpoint_period=12 || exit 1
python3 - "$tmp/out/tune/metrics.jsonl" "$(losses frozen1)" <<'PY' || fail "fine-tuning did not start from the loaded loss or did not lower it"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first_frozen = float(sys.argv[2].split()[0])
assert rows[0]["loss"] == first_frozen, (rows[0]["loss"], first_frozen)  # same weights, same batch
assert rows[-1]["loss"] < rows[0]["loss"] - 0.05, (rows[0]["loss"], rows[-1]["loss"])
PY
python3 "$tiny" same "$tmp/out/tune/checkpoints/step_12" "$tmp/hf3" >/dev/null &&
    fail "fine-tuning left the weights unchanged"

# transformers (if its environment exists) loads the fine-tuned checkpoint cleanly.
venv="${MT_HF_VENV:-$src/.venv-hf}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import transformers" >/dev/null 2>&1; then
    TRANSFORMERS_VERBOSITY=error PYTHONWARNINGS=ignore "$venv/bin/python" - "$tmp/out/tune/checkpoints/step_12" <<'PY' ||
import sys, torch, transformers
m, info = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True, dtype=torch.float32)
assert type(m).__name__ == "Gemma2ForCausalLM", type(m).__name__
assert not any(info.values()), info
PY
        fail "transformers could not load the fine-tuned checkpoint cleanly"
else
    echo "note: no transformers environment at $venv; the transformers load check was not run"
fi

mt_finish "ok: fine-tuning from a Hugging Face directory (single file and sharded, bf16)"
