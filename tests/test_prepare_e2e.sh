#!/usr/bin/env bash
# tests/test_prepare_e2e.sh BUILD_DIR: the README's path for fine-tuning a Hugging Face
# model on one's own text, end to end, on a tiny model and a tokenizer.json made here
# (nothing is downloaded):
#  1. tests/reference/tokenizer_kinds.py tiny: a 64-id BPE tokenizer.json ("<s> $A </s>"
#     per document) with the `tokenizers` library; tests/reference/hf_tiny_dir.py: a
#     tiny Gemma 2 model directory of the same vocabulary;
#  2. `meshtrain prepare` on a directory of text files and a JSONL file: llm.c-named
#     shards (<name>_train_000000.bin, <name>_val_000000.bin, uint16, magic 20240520
#     version 1) whose tokens are exactly the library's encoding of each document,
#     BOS and EOS included, split by the documented seeded hash; the same command again
#     gives byte-identical shards; --shard-size splits a split into several shards;
#  3. `meshtrain train ... load_parameters_path=<model dir> dataset_path=<shards>`:
#     the loss goes down;
#  4. `meshtrain sample ... tokenizer_path=tokenizer.json prompt="the cat"` (greedy):
#     the text starts with the prompt, and prompt_ids of the same ids gives the same
#     text;
#  5. export: the checkpoint directory plus tokenizer.json is a Hugging Face model
#     directory: transformers (when scripts/setup-hf-venv.sh's environment has it)
#     loads it and its greedy continuation of the prompt decodes to meshtrain's text.
# Exit 77 (skipped) without the environment's `tokenizers` (MT_HF_VENV).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_prepare_e2e.sh "${1:-}"
mt_need_hf_venv
export MESHTRAIN_PYTHON="$py"
mt_tmp

# 1. tokenizer, model, text
"$py" "$src/tests/reference/tokenizer_kinds.py" tiny "$tmp/tokenizer.json" 64 > /dev/null 2>&1 ||
    { fail "tokenizer_kinds.py tiny failed"; mt_finish ""; }
python3 "$src/tests/reference/hf_tiny_dir.py" write "$tmp/hf" f32 1
mkdir -p "$tmp/cfg/models" "$tmp/text/more"
python3 "$src/tests/reference/hf_tiny_dir.py" yml > "$tmp/cfg/models/tiny-gemma2.yml"
python3 - "$tmp/text" <<'PY'
import json, random, sys
d = sys.argv[1]
rng = random.Random(1)
words = "the cat sat on mat a dog ate hat man and to be or not".split()
def doc():
    return " ".join(["the cat sat on the mat"] + [rng.choice(words) for _ in range(rng.randrange(4, 12))])
for i in range(30):
    open("%s/doc%02d.txt" % (d, i), "w").write(doc() + "\n")
with open(d + "/more/rows.jsonl", "w") as f:
    for i in range(30):
        f.write(json.dumps({"id": i, "body": doc()}) + "\n")
PY

# 2. prepare (text files: one document each; the JSONL's "body" field)
prep() { "$bin" prepare --tokenizer "$tmp/tokenizer.json" --field body --val-every 5 --seed 3 "$@"; }
prep --output "$tmp/data" --name mine "$tmp/text" > "$tmp/prep.out" 2> "$tmp/prep.err" ||
    fail "prepare failed: $(cat "$tmp/prep.out" "$tmp/prep.err")"
for f in mine_train_000000.bin mine_val_000000.bin mine_prepare.json; do
    [ -f "$tmp/data/$f" ] || fail "prepare did not write $f: $(ls "$tmp/data")"
done
[ -s "$tmp/prep.err" ] && fail "prepare wrote to stderr that is not a terminal (a progress bar?): $(cat "$tmp/prep.err")"
"$py" - "$tmp" <<'PY' || fail "the shards are not the library's encoding of the documents"
import glob, hashlib, json, os, struct, sys
from tokenizers import Tokenizer
t = sys.argv[1]
tok = Tokenizer.from_file(t + "/tokenizer.json")
docs = [open(p).read() for p in sorted(glob.glob(t + "/text/*.txt"))]
docs += [json.loads(l)["body"] for l in open(t + "/text/more/rows.jsonl")]
want = {"train": [], "val": []}
for d in docs:  # the documented split: BLAKE2b-64(seed le64 + text) % val_every == 0 -> val
    h = int.from_bytes(hashlib.blake2b(struct.pack("<q", 3) + d.encode(), digest_size=8).digest(), "little")
    ids = tok.encode(d).ids
    assert ids[0] == 2 and ids[-1] == 1, ids  # <s> ... </s>: the post-processor's
    want["val" if h % 5 == 0 else "train"] += ids
for split in ("train", "val"):
    raw = open("%s/data/mine_%s_000000.bin" % (t, split), "rb").read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[:3] == (20240520, 1, len(want[split])), (split, hdr[:3], len(want[split]))
    got = list(struct.unpack("<%dH" % hdr[2], raw[1024:]))
    assert got == want[split], (split, got[:20], want[split][:20])
    assert len(want[split]) > 40, (split, len(want[split]))
s = json.load(open(t + "/data/mine_prepare.json"))
assert s["documents"]["train"] + s["documents"]["val"] == 60 and s["vocab_size"] == 64, s
PY
prep --output "$tmp/data2" --name mine "$tmp/text" > /dev/null 2>&1 || fail "prepare (again) failed"
cmp -s "$tmp/data/mine_train_000000.bin" "$tmp/data2/mine_train_000000.bin" &&
    cmp -s "$tmp/data/mine_val_000000.bin" "$tmp/data2/mine_val_000000.bin" || fail "prepare is not deterministic"
prep --output "$tmp/data3" --shard-size 100 "$tmp/text" > /dev/null 2>&1 || fail "prepare --shard-size 100 failed"
n3=$(ls "$tmp/data3" | grep -c '^data3_train_0000[0-9][0-9].bin$')
[ "$n3" -ge 3 ] || fail "--shard-size 100 wrote $n3 train shards: $(ls "$tmp/data3")"
cat "$tmp/data3"/data3_train_*.bin | cmp -s - /dev/null && fail "no shards"

# 3. fine-tune from the Hugging Face directory on the prepared shards
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny-gemma2
base_output_directory: $tmp/out
run_name: ft
dataset_path: $tmp/data
tokenizer_path: $tmp/tokenizer.json
per_device_batch_size: 2
max_target_length: 16
steps: 30
learning_rate: 0.01
warmup_steps_fraction: 0
eval_interval: 15
eval_steps: 1
checkpoint_period: 30
log_period: 10
seed: 3
backend: cpu
YML
"$bin" train "$tmp/cfg/run.yml" load_parameters_path="$tmp/hf" > "$tmp/train.out" 2>&1 || fail "train failed: $(tail -5 "$tmp/train.out")"
ck="$tmp/out/ft/checkpoints/step_30"
[ -f "$ck/model.safetensors" ] || { fail "no checkpoint $ck: $(tail -5 "$tmp/train.out")"; mt_finish ""; }
python3 - "$tmp/out/ft/metrics.jsonl" <<'PY' || fail "the loss did not go down: $(cat "$tmp/out/ft/metrics.jsonl" | head -3)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loss = [r["loss"] for r in rows if "loss" in r]
assert len(loss) == 30 and sum(loss[-5:]) / 5 < loss[0] - 0.5, loss
assert any("val_loss" in r for r in rows)
PY

# 4. sample with a text prompt, and with the same ids
"$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" prompt="the cat" temperature=0 sample_length=8 \
    > "$tmp/s1.out" 2> "$tmp/s1.err" || fail "sample prompt= failed: $(cat "$tmp/s1.err")"
[[ "$(cat "$tmp/s1.out")" == "the cat"* ]] || fail "sample's text does not start with the prompt: '$(cat "$tmp/s1.out")'"
ids=$("$py" -c 'import sys; from tokenizers import Tokenizer; print(",".join(map(str, Tokenizer.from_file(sys.argv[1]).encode("the cat").ids[:-1])))' "$tmp/tokenizer.json")
"$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" prompt_ids="$ids" temperature=0 sample_length=8 \
    > "$tmp/s2.out" 2> "$tmp/s2.err" || fail "sample prompt_ids= failed: $(cat "$tmp/s2.err")"
cmp -s "$tmp/s1.out" "$tmp/s2.out" || fail "prompt='the cat' and prompt_ids=$ids differ: '$(cat "$tmp/s1.out")' vs '$(cat "$tmp/s2.out")'"
"$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" temperature=0 sample_length=8 > "$tmp/s3.out" 2>&1 ||
    fail "sample without a prompt (BOS from the post-processor) failed: $(cat "$tmp/s3.out")"

# bad prompts exit 2 naming the key
bad_sample() { # NEEDLE ARGS...
    local needle="$1"; shift
    "$bin" sample "$tmp/cfg/run.yml" load_checkpoint="$ck" "$@" > "$tmp/sb.out" 2>&1
    local rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$needle" "$tmp/sb.out" || fail "sample $*: exit $rc, '$(cat "$tmp/sb.out")'"
}
bad_sample "'prompt' and 'prompt_ids'" prompt="the" prompt_ids=2
bad_sample "'2x'" prompt_ids="2,2x"
bad_sample "prompt_ids" prompt_ids="2,64"
python3 -c 'import sys; open(sys.argv[1], "w").write("".join("p%d\t0\n" % i for i in range(64)))' "$tmp/only.vocab"
bad_sample "only.model" tokenizer_path="$tmp/only.vocab" prompt="the"

# 5. export: the checkpoint + tokenizer.json is a Hugging Face model directory
if "$py" -c "import transformers, torch" 2>/dev/null; then
    cp "$tmp/tokenizer.json" "$ck/"
    "$py" - "$ck" "$ids" "$tmp/s1.out" <<'PY' || fail "transformers' greedy continuation differs from meshtrain sample's"
import sys, torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
ck, ids, want = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], open(sys.argv[3]).read().rstrip("\n")
m = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32, attn_implementation="eager").eval()
tok = PreTrainedTokenizerFast(tokenizer_file=ck + "/tokenizer.json")
x = torch.tensor([ids])
with torch.no_grad():
    for _ in range(8):
        nxt = int(m(x).logits[0, -1].argmax())
        if nxt in (0, 1, 2, 3):  # special tokens stop meshtrain's sampling too
            break
        x = torch.cat([x, torch.tensor([[nxt]])], 1)
got = tok.decode(x[0].tolist(), skip_special_tokens=True)
print("transformers:", repr(got), "meshtrain:", repr(want))
assert got == want
PY
else
    echo "note: no transformers in $venv: the export check was skipped"
fi
mt_finish "prepare -> train from a Hugging Face directory -> sample with a prompt -> export: ok"
