#!/usr/bin/env bash
# tests/test_cli_user_trial.sh BUILD_DIR: regressions from a fresh user's trial of the
# README, on a tiny model and tiny synthetic shards generated here:
#  1. resuming from an older checkpoint while later ones exist is refused (exit 2,
#     naming them) before anything is written; from the latest, or into a new
#     run_name, it runs;
#  2. train refuses num_devices that differs from the world (1 process);
#  3. a failed estimate changes no file (an earlier job's commands file stays as it
#     was, and the message says it is an earlier run's); a good one writes it whole
#     (no .tmp left);
#  5. resuming on a different dataset names the dataset (shard counts differ);
#  6. eval_steps beyond the val split evaluates each window once, says so once, and
#     metrics report the real token count;
#  7. sample refuses a model_name that is not the checkpoint's model;
#  8. a key repeated on the command line is refused;
#  9. estimate --json prints one JSON object (rows, budget, time, commands);
# 10. estimate without hbm_gib says it is required; an integer out of int64 says
#     out of range; for Llama the estimate table does not call mlpwo "remat".
# A second trial, checkpoints and resume (every refusal exits 2 and changes no file):
# 11. resuming a run directory from a checkpoint of another history (its checkpoints
#     carry another run_id; without ids: load_checkpoint is not one of its own; or, with
#     no checkpoint, metrics.jsonl holds rows up to the resumed step) is refused; in
#     place from its own newest it runs and keeps the run_id; a branch gets a new one;
# 12. a checkpoint mixing two checkpoints' files is refused naming the odd file (by
#     step, or by checkpoint id for two saves of one step); load_parameters_path reads
#     model.safetensors alone and is not checked;
# 13. step_N.tmp (an unfinished save) is refused as incomplete, naming the newest
#     complete checkpoint next to it;
# 14. a directory step_9 holding step 4 is refused;
# 15. a file step_99 and an empty directory step_50 are no checkpoints;
# 16. a checkpoint write failing mid-run exits 1;
# 17. SIGTERM / SIGINT of one process print one line naming the checkpoint to resume
#     from (which resumes), exit 143 / 130.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_user_trial.sh "${1:-}"
mt_sys_python

mt_tmp

mkdir -p "$tmp/cfg/models" "$tmp/data" "$tmp/data2"
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
# another model: one more layer
sed 's/base_num_decoder_layers: 2/base_num_decoder_layers: 3/' "$tmp/cfg/models/tiny.yml" > "$tmp/cfg/models/tiny3.yml"
mt_run_yml <<YML
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

# ---- 3. a failed estimate: every file left as it was, the old one named as earlier ----
cp remat_commands_from_estimator.txt earlier.txt
expect2 "estimate no fit" "does not fit" "$bin" estimate "$cfg" dataset_path= hbm_gib=0.0000001
cmp -s earlier.txt remat_commands_from_estimator.txt || fail "failed estimate changed the earlier commands file"
[ -e remat_commands_from_estimator.previous.txt ] && fail "failed estimate renamed the earlier commands file"
grep -q "earlier estimate, not this one" "$tmp/e" || fail "failed estimate: the old file is not named as earlier: $(cat "$tmp/e")"

# ---- checkpoint identity and resume histories (second trial) ----
# snap DIR: one line that changes when any file or name under DIR changes
snap() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum; find . | sort) | md5sum; }
# meta FILE KEY: a safetensors file's __metadata__[KEY] ("" when absent)
meta() {
    "$py" - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
print(json.loads(b[8:8 + n]).get("__metadata__", {}).get(sys.argv[2], ""))
PY
}
# strip_ids FILE...: remove the identity keys, as in a checkpoint written before them
strip_ids() {
    "$py" - "$@" <<'PY'
import json, struct, sys
for p in sys.argv[1:]:
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); m = h.get("__metadata__", {})
    for k in ("run_id", "checkpoint_id", "meshtrain_run_id", "meshtrain_checkpoint_id", "meshtrain_step"):
        m.pop(k, None)
    hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
    open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
}
out="$tmp/out"

# 11. (trial 2, defect 1) resuming a run directory from another run's checkpoint: t1
# holds step_2, 4, 6 and metrics; ck's step_6 is another history. Refused, nothing
# changed; in place from its own newest it runs and keeps t1's run id; a branch into a
# new run_name gets a new one.
"$bin" train "$cfg" run_name=t1 steps=6 eval_interval=0 seed=11 > "$tmp/o" 2>&1 || fail "train t1: $(cat "$tmp/o")"
s1=$(snap "$out/t1")
expect2 "resume t1 from ck's step_6" "another history" \
    "$bin" train "$cfg" run_name=t1 steps=8 eval_interval=0 load_checkpoint="$ck/step_6"
grep -q "run 't1'" "$tmp/e" && grep -q "$out/t1/checkpoints/step_6" "$tmp/e" \
    || fail "resume t1 from ck: does not name run t1 and its own newest checkpoint: $(cat "$tmp/e")"
[ "$(snap "$out/t1")" = "$s1" ] || fail "resume t1 from ck: t1 changed although the run was refused"
# metrics.jsonl of another run and no checkpoint: its rows 0..6 would be kept
mkdir -p "$out/mo" && cp "$out/t1/metrics.jsonl" "$out/mo/"
s1=$(snap "$out/mo")
expect2 "resume into metrics of another run" "metrics.jsonl" \
    "$bin" train "$cfg" run_name=mo steps=8 eval_interval=0 load_checkpoint="$ck/step_6"
[ "$(snap "$out/mo")" = "$s1" ] || fail "resume into metrics of another run: mo changed"
# checkpoints written before the ids: judged by where load_checkpoint is
cp -r "$out/t1" "$out/t1old" && mkdir -p "$tmp/sigold" && cp -r "$ck/step_6" "$tmp/sigold/step_6"
strip_ids "$out"/t1old/checkpoints/step_*/*.safetensors "$tmp"/sigold/step_6/*.safetensors
s1=$(snap "$out/t1old")
expect2 "resume t1old from an id-less foreign checkpoint" "another history" \
    "$bin" train "$cfg" run_name=t1old steps=8 eval_interval=0 load_checkpoint="$tmp/sigold/step_6"
[ "$(snap "$out/t1old")" = "$s1" ] || fail "resume t1old from a foreign checkpoint: t1old changed"
"$bin" train "$cfg" run_name=t1old steps=8 eval_interval=0 load_checkpoint="$out/t1old/checkpoints/step_6" \
    > "$tmp/o" 2>&1 || fail "resume id-less t1old in place: $(cat "$tmp/o")"
# in place from its own newest: runs, the history id is kept
"$bin" train "$cfg" run_name=t1 steps=8 eval_interval=0 load_checkpoint="$out/t1/checkpoints/step_6" \
    > "$tmp/o" 2>&1 || fail "resume t1 in place: $(cat "$tmp/o")"
id2=$(meta "$out/t1/checkpoints/step_2/train_state.safetensors" run_id)
[ -n "$id2" ] && [ "$(meta "$out/t1/checkpoints/step_8/train_state.safetensors" run_id)" = "$id2" ] \
    || fail "resume t1 in place: step_8's run_id is not step_2's ($id2)"
[ "$(meta "$out/t1/checkpoints/step_8/model.safetensors" meshtrain_run_id)" = "$id2" ] \
    || fail "t1 step_8: model.safetensors' meshtrain_run_id is not the run's"
[ "$(meta "$out/ck_branch/checkpoints/step_4/train_state.safetensors" run_id)" != \
  "$(meta "$ck/step_2/train_state.safetensors" run_id)" ] || fail "a branch into a new run_name kept the run id"
# a branch stopped before its first checkpoint: its rows are all after the resumed
# step, so the same command runs again
mkdir -p "$out/br" && grep -E '^\{"step": (7|8),' "$ck/../metrics.jsonl" > "$out/br/metrics.jsonl"
"$bin" train "$cfg" run_name=br steps=8 eval_interval=0 load_checkpoint="$ck/step_6" > "$tmp/o" 2>&1 \
    || fail "resume a branch that has only later metrics rows: $(cat "$tmp/o")"

# 12. (defect 2) files of two checkpoints in one directory: refused naming the file
mkdir -p "$tmp/mix"
cp -r "$ck/step_4" "$tmp/mix/step_4" && cp "$ck/step_6/model.safetensors" "$tmp/mix/step_4/"
expect2 "model.safetensors of step 6 in step_4" "$tmp/mix/step_4/model.safetensors" \
    "$bin" train "$cfg" run_name=mix steps=12 load_checkpoint="$tmp/mix/step_4"
grep -q "does not belong" "$tmp/e" || fail "mixed model: not said: $(cat "$tmp/e")"
mkdir -p "$tmp/mix/ts" && cp -r "$ck/step_4" "$tmp/mix/ts/step_4"
cp "$ck/step_6/train_state.safetensors" "$tmp/mix/ts/step_4/"
expect2 "train_state of step 6 in step_4" "$tmp/mix/ts/step_4/train_state.safetensors" \
    "$bin" train "$cfg" run_name=mix steps=12 load_checkpoint="$tmp/mix/ts/step_4"
# same step, another save (the branch's step_4)
mkdir -p "$tmp/mix/same" && cp -r "$ck/step_4" "$tmp/mix/same/step_4"
cp "$out/ck_branch/checkpoints/step_4/model.safetensors" "$tmp/mix/same/step_4/"
expect2 "model.safetensors of another save of step 4" "checkpoint id" \
    "$bin" train "$cfg" run_name=mix steps=12 load_checkpoint="$tmp/mix/same/step_4"
[ -e "$out/mix" ] && fail "mixed checkpoints: the refused run wrote $out/mix"
# load_parameters_path reads model.safetensors alone: a mixed directory is fine there
"$bin" train "$cfg" run_name=mixp steps=1 load_parameters_path="$tmp/mix/step_4" > "$tmp/o" 2>&1 \
    || fail "load_parameters_path of a directory with another step's train state: $(cat "$tmp/o")"

# 13. (defect 5) step_N.tmp is an unfinished save, even with every file in it
mkdir -p "$tmp/inc/checkpoints" && cp -r "$ck/step_4" "$tmp/inc/checkpoints/step_4"
cp -r "$ck/step_6" "$tmp/inc/checkpoints/step_6.tmp"
expect2 "resume from step_6.tmp" "incomplete checkpoint" \
    "$bin" train "$cfg" run_name=inc steps=12 load_checkpoint="$tmp/inc/checkpoints/step_6.tmp"
grep -q "$tmp/inc/checkpoints/step_4" "$tmp/e" || fail "step_6.tmp: newest complete one not named: $(cat "$tmp/e")"
[ -e "$out/inc" ] && fail "step_6.tmp: the refused run wrote $out/inc"
expect2 "sample from step_6.tmp" "incomplete checkpoint" \
    "$bin" sample "$cfg" load_checkpoint="$tmp/inc/checkpoints/step_6.tmp"

# 14. (defect 10) step_9 holding step 4
mkdir -p "$tmp/ren" && cp -r "$ck/step_4" "$tmp/ren/step_9"
expect2 "step_9 holding step 4" "named step_9" \
    "$bin" train "$cfg" run_name=ren steps=12 load_checkpoint="$tmp/ren/step_9"
grep -q "step 4" "$tmp/e" || fail "step_9: the recorded step is not named: $(cat "$tmp/e")"

# 15. (defect 6) junk named step_N is no checkpoint: a file step_99 and an empty
# directory step_50 next to t1's step_2..8
cp -r "$out/t1" "$out/j" && : > "$out/j/checkpoints/step_99" && mkdir "$out/j/checkpoints/step_50"
s1=$(snap "$out/j")
expect2 "fresh run into j" "load_checkpoint=$out/j/checkpoints/step_8 " "$bin" train "$cfg" run_name=j
[ "$(snap "$out/j")" = "$s1" ] || fail "fresh run into j changed it"
"$bin" train "$cfg" run_name=j steps=10 eval_interval=0 load_checkpoint="$out/j/checkpoints/step_8" > "$tmp/o" 2>&1 \
    || fail "resume j from its newest checkpoint despite junk: $(cat "$tmp/o")"

# 16. (defect 7) a write that fails mid-run is a runtime failure (exit 1): step_4.tmp
# cannot be cleared (it holds a directory; root ignores permissions, so a read-only
# checkpoints/ cannot stand in here)
"$bin" train "$cfg" run_name=w steps=2 eval_interval=0 > "$tmp/o" 2>&1 || fail "train w: $(cat "$tmp/o")"
mkdir -p "$out/w/checkpoints/step_4.tmp/sub"
"$bin" train "$cfg" run_name=w steps=4 eval_interval=0 load_checkpoint="$out/w/checkpoints/step_2" > "$tmp/o" 2> "$tmp/e"
rc=$?
[ $rc -eq 1 ] || fail "checkpoint write failing mid-run: exit $rc, expected 1: $(cat "$tmp/e")"
grep -q "step_4.tmp" "$tmp/e" || fail "checkpoint write failing mid-run: path not named: $(cat "$tmp/e")"
if [ "$(id -u)" != 0 ]; then # found at start: bad input (exit 2), nothing written
    rm -rf "$out/w/checkpoints/step_4.tmp" && chmod a-w "$out/w/checkpoints"
    s1=$(snap "$out/w")
    expect2 "read-only checkpoints/ at start" "$out/w/checkpoints" \
        "$bin" train "$cfg" run_name=w steps=4 eval_interval=0 load_checkpoint="$out/w/checkpoints/step_2"
    [ "$(snap "$out/w")" = "$s1" ] || fail "read-only checkpoints/: w changed"
    chmod u+w "$out/w/checkpoints"
fi

# 17. (defect 9) a single process stopped by a signal says so and names the checkpoint
# to resume from, which resumes. stop PID SIG: send SIG, give it 10 s to end (a
# background job starts with SIGINT ignored unless the program handles it), then
# SIGKILL; rc = its exit status.
stop() {
    kill -"$2" "$1"
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && { kill -KILL "$1"; fail "SIG$2 did not stop the run in 10 s"; }
    wait "$1"; rc=$?
}
"$bin" train "$cfg" run_name=sg steps=1000000 eval_interval=0 checkpoint_period=2 log_period=1000000 \
    > "$tmp/sg.out" 2> "$tmp/sg.err" &
pid=$!
for _ in $(seq 600); do [ -d "$out/sg/checkpoints/step_4" ] && break; sleep 0.1; done
stop $pid TERM
[ $rc -eq 143 ] || fail "SIGTERM: exit $rc, expected 143"
grep -q "^meshtrain: stopped by SIGTERM; the newest checkpoint is step [0-9]*: resume with load_checkpoint=" "$tmp/sg.err" \
    || fail "SIGTERM: no line: $(cat "$tmp/sg.err")"
resume=$(sed -n 's/.*load_checkpoint=//p' "$tmp/sg.err")
n=${resume##*step_}
[ -f "$resume/train_state.safetensors" ] || fail "SIGTERM: named checkpoint '$resume' is not there"
"$bin" train "$cfg" run_name=sg steps=$((n + 1)) eval_interval=0 checkpoint_period=2 load_checkpoint="$resume" \
    > "$tmp/o" 2>&1 || fail "resume from the checkpoint SIGTERM named: $(cat "$tmp/o")"
"$bin" train "$cfg" run_name=sgi steps=1000000 eval_interval=0 checkpoint_period=0 log_period=1000000 \
    > "$tmp/sg.out" 2> "$tmp/sg.err" &
pid=$!
for _ in $(seq 600); do [ -s "$out/sgi/metrics.jsonl" ] && break; sleep 0.1; done
stop $pid INT
[ $rc -eq 130 ] || fail "SIGINT: exit $rc, expected 130"
grep -q "^meshtrain: stopped by SIGINT; no checkpoint was saved yet" "$tmp/sg.err" || fail "SIGINT: no line: $(cat "$tmp/sg.err")"

mt_finish "ok"
