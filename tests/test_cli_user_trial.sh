#!/usr/bin/env bash
# tests/test_cli_user_trial.sh BUILD_DIR: regressions from a fresh user's trial of the
# README, on a tiny model and tiny synthetic shards generated here:
#  1. resuming from an older checkpoint while later ones exist is refused (exit 2,
#     naming them) before anything is written; from the latest, or into a new
#     run_name, it runs;
#  2. train refuses num_devices that differs from the world (1 process);
#  3. a failed estimate leaves no commands file under the usual name (the earlier
#     job's is renamed to .previous.txt); a good one writes it whole (no .tmp left);
#  5. resuming on a different dataset names the dataset (shard counts differ);
#  6. eval_steps beyond the val split evaluates each window once, says so once, and
#     metrics report the real token count;
#  7. sample refuses a model_name that is not the checkpoint's model;
#  8. a key repeated on the command line is refused;
#  9. estimate --json prints one JSON object (rows, budget, time, commands);
# 10. estimate without hbm_gib says it is required; an integer out of int64 says
#     out of range; for Llama the estimate table does not call mlpwo "remat".
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_cli_user_trial.sh BUILD_DIR}"
bin="$build/meshtrain"
[ -x "$bin" ] || { echo "no $bin"; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

tmp="$(mktemp -d)"
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
failures=0

mkdir -p "$tmp/cfg/models" "$tmp/data" "$tmp/data2"
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
# another model: one more layer
sed 's/base_num_decoder_layers: 2/base_num_decoder_layers: 3/' "$tmp/cfg/models/tiny.yml" > "$tmp/cfg/models/tiny3.yml"
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny
base_output_directory: $tmp/out
dataset_path: $tmp/data
tokenizer_path: $tmp/data/tokenizer.vocab
per_device_batch_size: 2
max_target_length: 16
steps: 10
learning_rate: 0.01
eval_interval: 5
eval_steps: 2
checkpoint_period: 2
log_period: 1
seed: 7
sample_length: 4
YML
"$py" - "$tmp/data" "$tmp/data2" <<'PY'
import struct, sys, random
rng = random.Random(1)
def tokens(n):
    return [1 + rng.randrange(63) for _ in range(n)]
def shard(path, toks):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
for d, sizes in ((sys.argv[1], (300, 400)), (sys.argv[2], (500,))):
    for i, n in enumerate(sizes):
        shard("%s/train_%03d.bin" % (d, i), tokens(n))
    shard(d + "/val_000.bin", tokens(200))  # 200 tokens: (200 - 1) // 32 = 6 windows of 2 x 16
    with open(d + "/tokenizer.vocab", "w", encoding="utf-8") as f:
        f.write("<unk>\t0\n<s>\t0\n</s>\t0\n")
        for i in range(3, 64):
            f.write("\u2581%s\t-%d\n" % (chr(ord('a') + i % 26), i))
PY
cfg="$tmp/cfg/run.yml"
ck="$tmp/out/ck/checkpoints"

# expect2 NAME PATTERN COMMAND...: exit 2 with PATTERN in stderr
expect2() {
    local name="$1" pat="$2"; shift 2
    "$@" > "$tmp/o" 2> "$tmp/e"; local rc=$?
    [ $rc -eq 2 ] || { fail "$name: exit $rc, expected 2: $(cat "$tmp/e")"; return; }
    grep -q -- "$pat" "$tmp/e" || fail "$name: message lacks '$pat': $(cat "$tmp/e")"
}

# ---- 1. older checkpoint with later ones in the run ----
"$bin" train "$cfg" run_name=ck > "$tmp/ck.out" 2>&1 || fail "train ck: $(cat "$tmp/ck.out")"
[ -d "$ck/step_10" ] || fail "train ck: no step_10"
sum_before=$(cat "$ck"/step_4/* "$tmp/out/ck/metrics.jsonl" | cksum)
expect2 "resume older" "step_10" "$bin" train "$cfg" run_name=ck steps=4 load_checkpoint="$ck/step_2"
grep -q "step_4" "$tmp/e" && grep -q "run_name" "$tmp/e" || fail "resume older: names neither step_4 nor run_name: $(cat "$tmp/e")"
[ "$(cat "$ck"/step_4/* "$tmp/out/ck/metrics.jsonl" | cksum)" = "$sum_before" ] \
    || fail "resume older: step_4 or metrics.jsonl changed although the run was refused"
# from the latest: runs on
"$bin" train "$cfg" run_name=ck steps=12 load_checkpoint="$ck/step_10" > "$tmp/o" 2>&1 || fail "resume latest: $(cat "$tmp/o")"
"$py" - "$tmp/out/ck/metrics.jsonl" <<'PY' || fail "resume latest: metrics steps are not 0..12"
import json, sys
steps = sorted({json.loads(l)["step"] for l in open(sys.argv[1])})
assert steps == list(range(13)), steps
PY
# an older checkpoint into a new run_name: runs
"$bin" train "$cfg" run_name=ck_branch steps=4 load_checkpoint="$ck/step_2" > "$tmp/o" 2>&1 \
    || fail "resume older into a new run_name: $(cat "$tmp/o")"

# ---- 2. num_devices is a plan/estimate key ----
expect2 "num_devices" "mpirun -np" "$bin" train "$cfg" run_name=nd num_devices=8
grep -q "num_devices" "$tmp/e" || fail "num_devices: key not named: $(cat "$tmp/e")"
[ -e "$tmp/out/nd" ] && fail "num_devices: the refused run wrote $tmp/out/nd"

# ---- 5. a different dataset on resume ----
expect2 "resume other dataset" "different dataset" \
    "$bin" train "$cfg" run_name=ds steps=12 dataset_path="$tmp/data2" load_checkpoint="$ck/step_6"
grep -q "dataset_path" "$tmp/e" || fail "resume other dataset: key not named: $(cat "$tmp/e")"

# ---- 6. eval_steps beyond the val split ----
"$bin" train "$cfg" run_name=ev steps=2 eval_interval=1 eval_steps=50 > "$tmp/ev.out" 2> "$tmp/ev.err" \
    || fail "eval_steps=50: $(cat "$tmp/ev.out" "$tmp/ev.err")"
[ "$(grep -c "eval_steps=50" "$tmp/ev.err")" -eq 1 ] || fail "eval_steps=50: not said exactly once: $(cat "$tmp/ev.err")"
# 6 windows x 2 sequences x 16 tokens (every token of a window has a label)
"$py" - "$tmp/out/ev/metrics.jsonl" <<'PY' || fail "eval_steps=50: val_tokens is not 6 x 2 x 16 = 192"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ev = [r for r in ev if "val_tokens" in r]
assert len(ev) == 3 and all(r["val_tokens"] == 192 for r in ev), ev
PY

# ---- 7. sample: model_name must be the checkpoint's model ----
expect2 "sample model_name" "model_name" "$bin" sample "$cfg" load_checkpoint="$ck/step_10" model_name=tiny3
grep -q "base_num_decoder_layers" "$tmp/e" || fail "sample model_name: differing key not named: $(cat "$tmp/e")"
"$bin" sample "$cfg" load_checkpoint="$ck/step_10" model_name=tiny > "$tmp/o" 2>&1 || fail "sample model_name=tiny: $(cat "$tmp/o")"

# ---- 8. a key twice on the command line ----
expect2 "repeated key" "'steps' is set twice" "$bin" train "$cfg" run_name=rep steps=1 steps=2
[ -e "$tmp/out/rep" ] && fail "repeated key: the refused run wrote $tmp/out/rep"

# ---- 10. messages ----
expect2 "int range" "out of range" "$bin" train "$cfg" run_name=big steps=99999999999999999999
grep -q "9223372036854775807" "$tmp/e" || fail "int range: range not given: $(cat "$tmp/e")"
cd "$tmp" || exit 1
expect2 "no hbm_gib" "needs hbm_gib" "$bin" estimate "$cfg" dataset_path=
"$bin" estimate "$cfg" dataset_path= hbm_gib=0.01 > est.out 2> est.err || fail "estimate tiny: $(cat est.err)"
# the table row's last field is mlpwo: Llama never saves it, so it is '-', not remat
"$py" - est.out <<'PY' || fail "estimate table: mlpwo is not '-' for Llama: $(cat est.out)"
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.split() and l.split()[0].isdigit()]
assert rows and all(r[-1] == "-" for r in rows), rows
PY
[ -s remat_commands_from_estimator.txt ] || fail "estimate: no commands file"
[ -e remat_commands_from_estimator.txt.tmp ] && fail "estimate: temporary commands file left"
grep -q "mlpwo=" remat_commands_from_estimator.txt && fail "estimate commands: mlpwo set for Llama"

# ---- 9. estimate --json ----
"$bin" estimate "$cfg" dataset_path= hbm_gib=0.01 --json > est.json 2> est.err || fail "estimate --json: $(cat est.err)"
"$py" - est.json remat_commands_from_estimator.txt <<'PY' || fail "estimate --json: bad object: $(cat est.json)"
import json, sys
j = json.load(open(sys.argv[1]))
cmds = [l.rstrip("\n") for l in open(sys.argv[2]) if not l.startswith("#")]
assert j["budget_bytes"] == int(0.01 * 2**30), j["budget_bytes"]
assert j["search_seconds"] >= 0 and j["plans_evaluated"] > 0
assert j["rows"] and [r["command"] for r in j["rows"]] == cmds, (j["rows"], cmds)
for r in j["rows"]:
    assert r["device_bytes"] <= j["budget_bytes"] and r["remat"]["mlpwo"] == "never_saved", r
PY

# ---- 3. a failed estimate: no stale commands file under the usual name ----
cp remat_commands_from_estimator.txt earlier.txt
expect2 "estimate no fit" "does not fit" "$bin" estimate "$cfg" dataset_path= hbm_gib=0.0000001
[ -e remat_commands_from_estimator.txt ] && fail "failed estimate left ./remat_commands_from_estimator.txt"
cmp -s earlier.txt remat_commands_from_estimator.previous.txt || fail "failed estimate lost the earlier commands file"
grep -q "previous" "$tmp/e" || fail "failed estimate: the rename is not said: $(cat "$tmp/e")"

mt_finish "ok"
