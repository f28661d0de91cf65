#!/usr/bin/env bash
# tests/test_cli_rundir.sh BUILD_DIR: `meshtrain train` and its run directory
# <base_output_directory>/<run_name>/ on a tiny model and tiny synthetic shards:
#  - re-running into a directory that holds a run, without load_checkpoint, exits 2
#    before any work, naming the checkpoint to resume from; nothing is touched; a run
#    directory another process holds (its .lock) exits 2 the same way, naming the lock
#    first even when the directory also holds a run (with or without load_checkpoint);
#  - resuming from an earlier checkpoint cuts metrics.jsonl back to the resumed step
#    (no duplicated rows) and drops a partial last line (a crash mid-write) with a
#    warning naming the file and line; a corrupt row elsewhere exits 2 naming the file
#    and the line, changing nothing;
#  - a file named checkpoints, an empty base_output_directory, load_checkpoint together
#    with load_parameters_path: exit 2 at start-up naming the key / path;
#  - resuming with another model (config.json differs), another batch shape, a broken
#    or missing config.json: exit 2 naming the file and the field / key;
#  - resuming at the last step says the run is complete; the resume news is printed once;
#  - a checkpoint write that fails (file size limit: a short write, like a full disk)
#    exits 1 and leaves no step_N.tmp/; `make demo` samples only complete checkpoints.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_rundir.sh "${1:-}"
mt_need_python3

mt_tmp

mt_tiny_model "$tmp/cfg/models/tiny.yml" llama 1
mt_run_yml <<YML
run_name: r
per_device_batch_size: 2
max_target_length: 8
steps: 4
eval_interval: 2
eval_steps: 1
checkpoint_period: 2
log_period: 1
YML
python3 - "$tmp/data" <<'PY'
import struct, sys, random
d = sys.argv[1]
def shard(path, count):
    rng = random.Random(count)
    toks = [rng.randrange(64) for _ in range(count)]
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, count
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % count, *toks))
shard(d + "/train_000.bin", 2000)
shard(d + "/val_000.bin", 500)
PY
run="$tmp/cfg/run.yml"
snapshot() { (cd "$tmp/out" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . | sort); }
# steps RUN: the "step" of every row of metrics.jsonl, one line.
steps() { python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$tmp/out/$1/metrics.jsonl"; }
# expect RC DESC PATTERN... -- ARGS: exit code RC and every PATTERN in stderr.
expect() {
    local want="$1" desc="$2"; shift 2
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$bin" "$@" > "$tmp/x.out" 2> "$tmp/x.err"
    local rc=$?
    [ "$rc" -eq "$want" ] || { fail "$desc: exit code $rc, expected $want ($(cat "$tmp/x.out" "$tmp/x.err"))"; return; }
    for p in "${pats[@]}"; do
        grep -qF -- "$p" "$tmp/x.err" || fail "$desc: stderr does not mention '$p': $(cat "$tmp/x.err")"
    done
}

"$bin" train "$run" > "$tmp/first.out" 2>&1 || { cat "$tmp/first.out"; fail "the first run failed"; exit 1; }
[ "$(steps r)" = "0 1 2 3 4" ] || fail "first run's metrics rows: $(steps r)"
before="$(snapshot)"

# Bug 1: an existing run is never silently overwritten.
expect 2 "re-run into an existing run" "$tmp/out/r already holds a run" \
    "load_checkpoint=$tmp/out/r/checkpoints/step_4" "run_name" -- train "$run"
[ "$before" = "$(snapshot)" ] || fail "re-run changed the existing run directory"
# ... also when only a checkpoint is there (a run that died before metrics? no: checkpoints only)
mkdir -p "$tmp/out/onlyck/checkpoints/step_2"
expect 2 "run dir with a checkpoint only" "already holds a run" "step_2" -- train "$run" run_name=onlyck
# one process per run directory: while another holds <run dir>/.lock (flock(1) here, as
# a second train started at once would) a train exits 2 naming it and writes nothing
mkdir -p "$tmp/out/busy"
flock -o "$tmp/out/busy/.lock" sleep 30 &  # -o: flock itself holds it, not sleep
holder=$!
for _ in $(seq 50); do flock -n "$tmp/out/busy/.lock" true 2> /dev/null || break; sleep 0.1; done
expect 2 "run dir locked by another process" "$tmp/out/busy is in use by another meshtrain process" "run_name" \
    -- train "$run" run_name=busy
[ -z "$(ls "$tmp/out/busy")" ] || fail "a refused run wrote into the locked run directory: $(ls "$tmp/out/busy")"
kill "$holder" 2> /dev/null; wait "$holder" 2> /dev/null
"$bin" train "$run" run_name=busy steps=1 > /dev/null 2>&1 || fail "training after the lock was released failed"
# ... and the lock is reported first when the directory also holds a run: "already holds
# a run; resume with load_checkpoint=..." sent the user into the same lock. Both without
# and with load_checkpoint, and nothing there changes.
cp -a "$tmp/out/r" "$tmp/out/busyrun"
flock -o "$tmp/out/busyrun/.lock" sleep 30 &
holder=$!
for _ in $(seq 50); do flock -n "$tmp/out/busyrun/.lock" true 2> /dev/null || break; sleep 0.1; done
busy_before="$(cd "$tmp/out/busyrun" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . | sort)"
for resume in "" "load_checkpoint=$tmp/out/busyrun/checkpoints/step_4"; do
    expect 2 "locked run dir holding a run ${resume:+(resume)}" \
        "$tmp/out/busyrun is in use by another meshtrain process" -- train "$run" run_name=busyrun steps=6 $resume
    grep -q "already holds a run" "$tmp/x.err" && fail "locked run dir ${resume:+(resume)}: the run, not the lock, was reported: $(cat "$tmp/x.err")"
done
[ "$busy_before" = "$(cd "$tmp/out/busyrun" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . | sort)" ] ||
    fail "a refused run changed the locked run directory"
kill "$holder" 2> /dev/null; wait "$holder" 2> /dev/null
# an empty run directory is fine to train into
mkdir -p "$tmp/out/empty"
"$bin" train "$run" run_name=empty steps=1 > /dev/null 2>&1 || fail "training into an empty run directory failed"

# Bug 6: a file named checkpoints is found at start-up, before training.
mkdir -p "$tmp/out/ckfile" && echo x > "$tmp/out/ckfile/checkpoints"
expect 2 "checkpoints is a file" "$tmp/out/ckfile/checkpoints" "not a directory" -- train "$run" run_name=ckfile
[ ! -e "$tmp/out/ckfile/metrics.jsonl" ] || fail "checkpoints-is-a-file: training ran before the check"

# Bug 3: empty path keys.
rn="meshtrain_test_rundir_$$"
expect 2 "empty base_output_directory" "base_output_directory" -- train "$run" base_output_directory= run_name="$rn"
[ ! -e "/$rn" ] || { fail "empty base_output_directory wrote /$rn"; rm -rf "/$rn"; }
expect 2 "empty run_name" "run_name" -- train "$run" run_name=
expect 2 "empty dataset_path" "dataset_path" -- train "$run" dataset_path= run_name=nodata

# Bug 9: two starting points.
expect 2 "load_checkpoint and load_parameters_path" "load_checkpoint" "load_parameters_path" -- \
    train "$run" run_name=both load_checkpoint="$tmp/out/r/checkpoints/step_2" \
    load_parameters_path="$tmp/out/r/checkpoints/step_2"

# Bug 2: resume from step 2 of run r: rows 3, 4 are replaced, not duplicated, and a
# partial last line is dropped. While step_4 (a later checkpoint) exists the resume is
# refused (two histories would mix, tests/test_cli_user_trial.sh); removing it is the
# documented way to branch in place.
printf '{"step": 5, "loss": 1.2' >> "$tmp/out/r/metrics.jsonl"
expect 2 "resume with a later checkpoint" "step_4" "run_name" -- \
    train "$run" load_checkpoint="$tmp/out/r/checkpoints/step_2"
rm -rf "$tmp/out/r/checkpoints/step_4"
# A corrupt row that is not a torn last line (an edit, another program's bytes) is bad
# input: exit 2 naming the file and the line, the file and the run directory unchanged
# (it was dropped without a word, and with it the step it held).
cp "$tmp/out/r/metrics.jsonl" "$tmp/metrics.kept"
for bad in 3 6; do
    python3 - "$tmp/out/r/metrics.jsonl" "$bad" <<'PY'
import sys
path, bad = sys.argv[1], int(sys.argv[2])
lines = open(path).read().split("\n")  # rows 0..4, then the torn line (no newline)
if bad == 3:
    lines[2] = '{"step": 2, "loss": oops}'  # a middle row
else:
    lines[5] = 'not a row'                  # a complete last line (it ends in a newline)
    lines.append("")
open(path, "w").write("\n".join(lines))
PY
    cp "$tmp/out/r/metrics.jsonl" "$tmp/metrics.bad"
    before="$(snapshot)"
    expect 2 "resume over a corrupt metrics row (line $bad)" "$tmp/out/r/metrics.jsonl" "line $bad" -- \
        train "$run" load_checkpoint="$tmp/out/r/checkpoints/step_2"
    cmp -s "$tmp/out/r/metrics.jsonl" "$tmp/metrics.bad" || fail "a corrupt metrics row (line $bad): the file changed"
    [ "$before" = "$(snapshot)" ] || fail "a corrupt metrics row (line $bad): the run directory changed"
    cp "$tmp/metrics.kept" "$tmp/out/r/metrics.jsonl"
done
# A torn last line (a crash while it was written) is dropped with a warning naming the
# file and the line.
"$bin" train "$run" load_checkpoint="$tmp/out/r/checkpoints/step_2" > "$tmp/res.out" 2>&1 ||
    fail "resume failed: $(cat "$tmp/res.out")"
grep -q "warn.*$tmp/out/r/metrics.jsonl.* line 6: .*cut short.*dropped" "$tmp/res.out" ||
    fail "resume dropped the torn last line without a warning naming file and line: $(cat "$tmp/res.out")"
[ "$(steps r)" = "0 1 2 3 4" ] || fail "resumed run's metrics rows: $(steps r) (expected 0 1 2 3 4)"
[ ! -e "$tmp/out/r/metrics.jsonl.tmp" ] || fail "metrics.jsonl.tmp left behind"
# Bug 11: the resume news once.
[ "$(grep -ci "resum" "$tmp/res.out")" -eq 1 ] || fail "resume news not printed exactly once: $(cat "$tmp/res.out")"

# Bug 11: resuming at the last step says so and does nothing.
before="$(snapshot)"
"$bin" train "$run" load_checkpoint="$tmp/out/r/checkpoints/step_4" > "$tmp/done.out" 2>&1 ||
    fail "resume at the last step failed: $(cat "$tmp/done.out")"
grep -q "already complete" "$tmp/done.out" || fail "resume at the last step: no 'already complete': $(cat "$tmp/done.out")"
[ "$before" = "$(snapshot)" ] || fail "resume at the last step changed the run directory"

# Bug 11: the data position of a checkpoint belongs to its batch shape.
expect 2 "resume with another batch" "per_device_batch_size" "train_state.safetensors" -- \
    train "$run" run_name=r2 load_checkpoint="$tmp/out/r/checkpoints/step_2" per_device_batch_size=4
expect 2 "resume with another sequence length" "max_target_length" -- \
    train "$run" run_name=r2 load_checkpoint="$tmp/out/r/checkpoints/step_2" max_target_length=16

# Bug 4: the checkpoint's config.json is read and compared.
expect 2 "resume with another width" "config.json" "hidden_size" "base_emb_dim" "32" "64" -- \
    train "$run" run_name=r2 load_checkpoint="$tmp/out/r/checkpoints/step_2" base_emb_dim=64
expect 2 "resume with another vocabulary" "config.json" "vocab_size" -- \
    train "$run" run_name=r2 load_checkpoint="$tmp/out/r/checkpoints/step_2" vocab_size=128
cp -r "$tmp/out/r/checkpoints/step_2" "$tmp/badjson" && echo '{"model_type": "llama", ' > "$tmp/badjson/config.json"
expect 2 "broken config.json" "$tmp/badjson/config.json" -- train "$run" run_name=r2 load_checkpoint="$tmp/badjson"
cp -r "$tmp/out/r/checkpoints/step_2" "$tmp/nojson" && rm "$tmp/nojson/config.json"
expect 2 "missing config.json" "$tmp/nojson/config.json" "missing" -- train "$run" run_name=r2 load_checkpoint="$tmp/nojson"
expect 2 "missing checkpoint directory" "$tmp/nockpt" "does not exist" -- train "$run" run_name=r2 load_checkpoint="$tmp/nockpt"
[ ! -e "$tmp/out/r2" ] || fail "a refused resume created its run directory"
# sample: a model-shape override that the checkpoint contradicts.
expect 2 "sample with another width" "base_emb_dim" "512" "32" -- \
    sample "$run" load_checkpoint="$tmp/out/r/checkpoints/step_4" base_emb_dim=512

# Bug 5: a checkpoint write that fails is a runtime failure (exit 1) and leaves no
# step_N.tmp. A file size limit of 16 KiB lets metrics.jsonl grow but cuts
# model.safetensors (~40 KB) short, as a full disk would; SIGXFSZ is ignored so the
# write returns an error instead of killing the process.
(trap '' XFSZ; ulimit -f 16; exec "$bin" train "$run" run_name=full) > "$tmp/full.out" 2> "$tmp/full.err"
rc=$?
[ "$rc" -eq 1 ] || fail "failed checkpoint write: exit code $rc, expected 1 ($(cat "$tmp/full.err"))"
grep -q "checkpoint" "$tmp/full.err" || fail "failed checkpoint write: message: $(cat "$tmp/full.err")"
ls "$tmp/out/full/checkpoints" 2>/dev/null | grep -q tmp && fail "a step_N.tmp directory was left behind"

# A run directory that cannot be created is bad input found at start-up (exit 2),
# naming the key; directories made while finding out are removed again.
expect 2 "base_output_directory under /proc" "base_output_directory" "/proc/meshtrain_nope" -- \
    train "$run" base_output_directory=/proc/meshtrain_nope
[ ! -e /proc/meshtrain_nope ] || fail "/proc/meshtrain_nope exists"
: > "$tmp/afile"
expect 2 "a file in base_output_directory's path" "base_output_directory" "$tmp/afile" -- \
    train "$run" base_output_directory="$tmp/afile/sub"
long="$(printf 'n%.0s' $(seq 300))"
expect 2 "run_name too long for the file system" "run_name" -- \
    train "$run" base_output_directory="$tmp/mk/sub" run_name="$long"
[ ! -e "$tmp/mk" ] || fail "a refused run directory left $tmp/mk behind"

# A run that died in start-up left an empty metrics.jsonl and no checkpoint: not a
# run, so the same run_name starts afresh.
mkdir -p "$tmp/out3/dead"
: > "$tmp/out3/dead/metrics.jsonl"
"$bin" train "$run" base_output_directory="$tmp/out3" run_name=dead > "$tmp/dead.out" 2>&1 ||
    fail "rerun over an empty metrics.jsonl: $(cat "$tmp/dead.out")"
[ "$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' \
    "$tmp/out3/dead/metrics.jsonl")" = "0 1 2 3 4" ] || fail "rerun over an empty metrics.jsonl: rows $(cat "$tmp/out3/dead/metrics.jsonl")"

# Bug 5: `make demo` samples the newest complete checkpoint (step_<digits>), never a
# step_N.tmp left by a crash. The Makefile's recipe runs with a stand-in meshtrain
# that leaves step_2, step_10 and step_12.tmp (deps, build, corpus not remade: -o).
src="$(cd "$(dirname "$0")/.." && pwd)"
if command -v make > /dev/null && [ -f "$src/Makefile" ]; then
    cat > "$tmp/fake.sh" <<'SH'
case "$1" in
train) mkdir -p "$DEMO/checkpoints/step_2" "$DEMO/checkpoints/step_10" "$DEMO/checkpoints/step_12.tmp" ;;
sample) echo "SAMPLE $*" ;;
esac
SH
    DEMO="$tmp/demo" make -s -C "$src" -o deps -o build -o corpus demo MESHTRAIN="sh $tmp/fake.sh" \
        DEMO_RUN="$tmp/demo" > "$tmp/demo.out" 2>&1
    grep -q "load_checkpoint=$tmp/demo/checkpoints/step_10\$" "$tmp/demo.out" ||
        fail "make demo did not sample step_10: $(cat "$tmp/demo.out")"
fi

mt_finish "ok"
