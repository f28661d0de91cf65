#!/usr/bin/env bash
# tests/test_cli_estimate_inputs.sh BUILD_DIR: estimate / sample / train inputs from a
# new user's trial, on a tiny Llama and synthetic shards made here:
#  1. a failed estimate (exit 2) changes no file: good, failing, good, failing leaves
#     the last good commands file, and a remat_commands_from_estimator.previous.txt of
#     the user's own, as they were; the message says the old file is an earlier run's;
#  2. hbm_gib beyond 2^63 bytes (1e19, 1e30, 2^33 + 1 GiB) exits 2 naming hbm_gib and
#     the range (the GiB -> bytes conversion wrapped to "0 bytes"); 2^33 GiB runs;
#     hbm_gib=-1 and 0 exit 2 saying > 0 (-1 said ">= 0", and 0 is refused too);
#  3. the commands file's lines start with the binary as invoked (here a relative
#     path, and a config path with a space, quoted): a line runs as written (eval)
#     from the directory estimate ran in and trains;
#  4. estimate says its step model is a GPU's when backend=cpu (text and --json);
#  5. sample_length past 2^31 - 2 exits 2 naming sample_length (it named
#     max_target_length); a KV cache that cannot be allocated exits 1 naming
#     sample_length; a train plan that cannot be allocated exits 1 with the plan's
#     bytes, `meshtrain plan` and the keys that size it, writing nothing;
#  6. bools: true/false in any case, yes/1 refused naming the key;
#  7. one process (no mpirun) ended by SIGINT / SIGTERM: status 130 / 143 (128 + signal).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_estimate_inputs.sh "${1:-}"
mt_sys_python
export OMP_NUM_THREADS=1

mt_tmp
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
# enough tokens for a step of the batch section 3's estimate picks at hbm_gib=0.01 (199
# rows of 16 since the layer backward's scratch shrank; room for a smaller plan still)
mt_shards "$tmp/data" 7 train_000.bin=8000 val_000.bin=400
printf '<unk>\t0\n<s>\t0\n</s>\t0\n' > "$tmp/data/tokenizer.vocab"
for i in $(seq 3 63); do printf '\xe2\x96\x81t%d\t-%d\n' "$i" "$i"; done >> "$tmp/data/tokenizer.vocab"
mt_run_yml <<YML
tokenizer_path: $tmp/data/tokenizer.vocab
per_device_batch_size: 2
max_target_length: 16
steps: 2
eval_interval: 0
checkpoint_period: 0
log_period: 1
backend: cpu
YML
mkdir -p "$tmp/work"
cd "$tmp/work" || exit 1

# expect RC NAME PATTERN COMMAND...: exit RC with PATTERN in stderr ($tmp/e)
expect() {
    local want=$1 name=$2 pat=$3; shift 3
    "$@" > "$tmp/o" 2> "$tmp/e"; local rc=$?
    [ $rc -eq "$want" ] || { fail "$name: exit $rc, expected $want: $(cat "$tmp/e")"; return; }
    grep -q -- "$pat" "$tmp/e" || fail "$name: message lacks '$pat': $(cat "$tmp/e")"
}
cmds=remat_commands_from_estimator.txt

# ---- 1. a failed estimate changes no file ----
echo "the user's own notes" > remat_commands_from_estimator.previous.txt
cp remat_commands_from_estimator.previous.txt own.txt
"$bin" estimate "$cfg" hbm_gib=0.01 > /dev/null 2> "$tmp/e" || fail "estimate good 1: $(cat "$tmp/e")"
cp $cmds good1.txt
expect 2 "estimate fail 1" "does not fit" "$bin" estimate "$cfg" hbm_gib=0.0000001
grep -q "earlier estimate, not this one" "$tmp/e" || fail "fail 1: old file not named as earlier: $(cat "$tmp/e")"
cmp -s $cmds good1.txt || fail "fail 1 changed ./$cmds"
"$bin" estimate "$cfg" hbm_gib=0.01 per_device_batch_size=3 > /dev/null 2> "$tmp/e" || fail "estimate good 2: $(cat "$tmp/e")"
cp $cmds good2.txt
cmp -s good1.txt good2.txt && fail "good 2 wrote the same commands as good 1 (test cannot tell them apart)"
expect 2 "estimate fail 2" "hbm_gib" "$bin" estimate "$cfg" hbm_gib=0
cmp -s $cmds good2.txt || fail "fail 2 changed ./$cmds"
expect 2 "estimate fail 3" "no_such_key" "$bin" estimate "$cfg" hbm_gib=1 no_such_key=1
cmp -s $cmds good2.txt || fail "fail 3 changed ./$cmds"
cmp -s remat_commands_from_estimator.previous.txt own.txt || fail "a failed estimate overwrote .previous.txt"
[ -e $cmds.tmp ] && fail "a temporary commands file was left"
rm -f $cmds
expect 2 "estimate fail, no old file" "does not fit" "$bin" estimate "$cfg" hbm_gib=0.0000001
grep -q "earlier" "$tmp/e" && fail "no old file, yet the message speaks of one: $(cat "$tmp/e")"
[ -e $cmds ] && fail "a failed estimate wrote ./$cmds"

# ---- 2. hbm_gib out of range ----
for v in -1 0; do
    expect 2 "hbm_gib=$v" "hbm_gib" "$bin" estimate "$cfg" hbm_gib=$v
    grep -q "> 0" "$tmp/e" || fail "hbm_gib=$v: the message does not say > 0: $(cat "$tmp/e")"
    grep -q ">= 0" "$tmp/e" && fail "hbm_gib=$v: the message offers 0: $(cat "$tmp/e")"
done
for v in 1e19 1e30 8589934593; do
    expect 2 "hbm_gib=$v" "hbm_gib" "$bin" estimate "$cfg" hbm_gib=$v
    grep -q "8589934592" "$tmp/e" || fail "hbm_gib=$v: the range is not given: $(cat "$tmp/e")"
    grep -q "(0 bytes)" "$tmp/e" && fail "hbm_gib=$v: wrapped to 0 bytes: $(cat "$tmp/e")"
done
"$bin" estimate "$cfg" hbm_gib=8589934592 --json > max.json 2> "$tmp/e" || fail "hbm_gib=2^33 (the maximum): $(cat "$tmp/e")"
"$py" -c "import json, sys; j = json.load(open('max.json')); sys.exit(j['budget_bytes'] != 2**63)" \
    || fail "hbm_gib=2^33: budget is not 2^63 bytes: $(head -c 300 max.json)"

# ---- 3. the lines run as written, from here, with the binary as invoked ----
rel="$("$py" -c "import os, sys; print(os.path.relpath(sys.argv[1]))" "$bin")"
case "$rel" in */*) ;; *) rel="./$rel" ;; esac
mkdir -p "$tmp/my cfg"
cp -r "$tmp/cfg/models" "$tmp/my cfg/"
cp "$cfg" "$tmp/my cfg/run.yml"
"$rel" estimate "$tmp/my cfg/run.yml" hbm_gib=0.01 run_name=est > est.out 2> "$tmp/e" || fail "estimate (relative binary): $(cat "$tmp/e")"
line="$(grep -v '^#' $cmds | head -1)"
case "$line" in
"$rel train '$tmp/my cfg/run.yml' run_name=est "*) ;;
*) fail "line does not start with the binary as invoked and the quoted config: $line" ;;
esac
eval "$line" > run.out 2>&1 || fail "the estimator's line failed as written: $line: $(cat run.out)"
grep -q "step 2/2" run.out || fail "the estimator's line did not train: $(cat run.out)"

# ---- 4. the step model is a GPU's: said for backend=cpu ----
grep -q "backend=cpu" est.out || fail "estimate backend=cpu: no note on the step model: $(cat est.out)"
grep -q "H100" est.out || fail "estimate: the step model's device is not named: $(cat est.out)"
"$bin" estimate "$cfg" hbm_gib=0.01 backend=auto > gpu.out 2> "$tmp/e" || fail "estimate backend=auto: $(cat "$tmp/e")"
grep -q "backend=cpu" gpu.out && fail "estimate backend=auto: the cpu note is printed: $(cat gpu.out)"
"$bin" estimate "$cfg" hbm_gib=0.01 --json > est.json 2> "$tmp/e" || fail "estimate --json: $(cat "$tmp/e")"
"$py" -c "import json, sys; s = json.load(open('est.json'))['step_model']; sys.exit(s['applies_to_backend'] is not False or 'H100' not in s['device'])" \
    || fail "estimate --json backend=cpu: step_model lacks applies_to_backend=false / device: $(cat est.json)"

# ---- 5. sample_length and allocation failures ----
"$bin" train "$cfg" run_name=ck > "$tmp/o" 2>&1 || fail "train a checkpoint to sample: $(cat "$tmp/o")"
ck="$tmp/out/ck/checkpoints/step_2"
expect 2 "sample_length=2^31-1" "sample_length" "$bin" sample "$cfg" load_checkpoint="$ck" sample_length=2147483647
grep -q "2147483646" "$tmp/e" || fail "sample_length=2^31-1: the range is not given: $(cat "$tmp/e")"
grep -q "max_target_length" "$tmp/e" && fail "sample_length=2^31-1: names max_target_length: $(cat "$tmp/e")"
"$bin" sample "$cfg" load_checkpoint="$ck" sample_length=5 > "$tmp/o" 2> "$tmp/e" || fail "sample 5 tokens: $(cat "$tmp/e")"
# a KV cache a 4 GiB address space cannot hold: exit 1 naming sample_length. The
# largest sample_length (2^31 positions: about 512 GiB for this model) fails while the
# model is built; 5e7 positions (about 12 GiB) when the plan is allocated, which also
# gives the plan's bytes
for len in 2147483646 50000000; do
    (ulimit -v 4194304; exec "$bin" sample "$cfg" load_checkpoint="$ck" sample_length=$len) > "$tmp/o" 2> "$tmp/e"
    rc=$?
    [ $rc -eq 1 ] || fail "sample_length=$len under ulimit -v 4 GiB: exit $rc, expected 1: $(cat "$tmp/e")"
    grep -q "sample_length = $len" "$tmp/e" || fail "sample_length=$len: the allocation failure does not name sample_length: $(cat "$tmp/e")"
done
grep -q "needs [0-9]* bytes" "$tmp/e" || fail "sample_length=50000000: the allocation failure gives no bytes: $(cat "$tmp/e")"
# a train plan over 128 TiB (base_mlp_dim 2^36: 1.3e13 parameters) cannot be mapped at all
expect 1 "train plan too large" "meshtrain plan" "$bin" train "$cfg" run_name=oom base_mlp_dim=68719476736
for w in per_device_batch_size max_target_length base_mlp_dim bytes; do
    grep -q "$w" "$tmp/e" || fail "train allocation failure: message lacks '$w': $(cat "$tmp/e")"
done
[ -e "$tmp/out/oom" ] && fail "train allocation failure wrote $tmp/out/oom"

# ---- 6. bools ----
for v in true True TRUE false False; do
    "$bin" plan "$cfg" logits_via_embedding=$v > /dev/null 2> "$tmp/e" || fail "logits_via_embedding=$v refused: $(cat "$tmp/e")"
done
for v in yes 1 on; do
    expect 2 "logits_via_embedding=$v" "logits_via_embedding" "$bin" plan "$cfg" logits_via_embedding=$v
done

# ---- 7. one process ended by a signal: 128 + signal ----
"$py" - "$bin" "$cfg" <<'PY' || fail "signal exit status"
import signal, subprocess, sys, time
binary, cfg = sys.argv[1], sys.argv[2]
bad = 0
for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
    p = subprocess.Popen([binary, "train", cfg, "run_name=sig%d" % sig, "steps=100000", "checkpoint_period=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:  # wait for the first step line: the run is training
        if line.startswith("step "):
            break
    p.send_signal(sig)
    p.stdout.read()
    rc = p.wait(timeout=60)
    # killed by the signal (the shell shows 128 + sig) or exiting with 128 + sig itself
    if rc not in (-int(sig), code):
        print("signal %d: status %d, expected %d" % (sig, rc, code)); bad += 1
sys.exit(bad)
PY

mt_finish "ok"
