#!/usr/bin/env bash
# tests/test_cli_estimate.sh BUILD_DIR: `meshtrain plan` (per-tensor table, --json,
# no data and no device needed, one rank of a 1024-device job) and `meshtrain
# estimate` (the three modes, the commands file, speed, bad input).
set -u
build="$1"
bin="$build/meshtrain"
src="$(pwd)"
base="$src/configs/base.yml"
[ -x "$bin" ] || { echo "no $bin"; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cd "$tmp"
nodata="dataset_path=$tmp/no/such/dir"

# --- plan: no data, JSON fields consistent with the shapes ---
"$bin" plan "$base" $nodata remat_policy=full --json > full.json 2> err || fail "plan full: $(cat err)"
"$bin" plan "$base" $nodata remat_policy=minimal_with_context --json > keep.json 2> err || fail "plan keep: $(cat err)"
"$bin" plan "$base" $nodata remat_policy=minimal_offloaded --json > off.json 2> err || fail "plan off: $(cat err)"
$py - <<'PY' || fail "plan --json checks"
import json
f, k, o = (json.load(open(n)) for n in ("full.json", "keep.json", "off.json"))
# llama3-tiny (configs/models/llama3-tiny.yml): d 256, 8 heads x 32, 2 kv heads, mlp 688, 4 layers; base batch 8 x 256
L, N, D, QD, KVD, F, H, B, T = 4, 8 * 256, 256, 256, 64, 688, 8, 8, 256
want = {"decoder_layer_input": N * D, "query_proj": N * QD, "key_proj": N * KVD, "value_proj": N * KVD,
        "context": N * QD + B * H * T, "out_proj": N * D, "mlpwi_0": N * F, "mlpwi_1": N * F, "mlpwo": 0}
for name, elems in want.items():
    assert k["saved"][name] == 4 * L * elems, (name, k["saved"][name], 4 * L * elems)
    if name != "decoder_layer_input":
        assert f["saved"][name] == 0, name
assert f["remat"]["query_proj"] == "remat" and o["remat"]["query_proj"] == "offload"
assert k["per_device"]["recompute_scratch"] == 0 and f["per_device"]["recompute_scratch"] > 0
assert k["host"]["total"] == 0
# minimal_offloaded: everything but context on the host
host = sum(4 * L * e for n, e in want.items() if n not in ("decoder_layer_input", "context"))
assert o["host"]["activations"] == host, (o["host"], host)
assert f["peak_bytes"] < k["peak_bytes"]
PY

# --- plan one rank of a 1024-device 405B job ---
"$bin" plan "$base" $nodata model_name=llama3.1-405b num_devices=1024 max_target_length=2048 \
    remat_policy=full --json > big.json 2> err || fail "plan 405b: $(cat err)"
$py -c "import json; p = json.load(open('big.json')); assert p['mesh']['fsdp'] == 1024; assert p['num_params'] > 4e11; assert p['per_device']['parameters'] * 1024 >= 4 * p['num_params']" || fail "405b plan json"
"$bin" plan "$base" $nodata model_name=llama3.1-405b num_devices=1000 ici_tensor_parallelism=3 > /dev/null 2> err
[ $? -eq 2 ] || fail "a mesh that does not divide must exit 2"

# --- estimate: mode 1 (batch and policy), fast, runnable commands ---
start=$(date +%s.%N)
"$bin" estimate "$base" $nodata model_name=llama3.1-405b num_devices=1024 hbm_gib=95 max_target_length=2048 \
    > est.out 2> err || fail "estimate 405b: $(cat err)"
end=$(date +%s.%N)
$py -c "import sys; t = $end - $start; print('405b estimate %.3f s' % t); sys.exit(0 if t < 2.0 else 1)" || fail "estimate too slow"
[ -s remat_commands_from_estimator.txt ] || fail "no remat_commands_from_estimator.txt"
budget=$((95 * 1024 * 1024 * 1024))
n=0
while read -r line; do
    case "$line" in "#"*|"") continue ;; esac
    n=$((n + 1))
    set -- $line
    [ "$1 $2" = "meshtrain train" ] || fail "not a train command: $line"
    shift 3
    peak=$("$bin" plan "$base" "$@" --json | $py -c "import json, sys; print(json.load(sys.stdin)['peak_bytes'])") \
        || fail "command does not plan: $line"
    [ "$peak" -le "$budget" ] || fail "command over budget ($peak > $budget): $line"
done < remat_commands_from_estimator.txt
[ "$n" -ge 1 ] || fail "no commands"

# --- mode 2: fixed batch, lightest policy that fits ---
"$bin" estimate "$base" $nodata model_name=gemma2-9b num_devices=8 hbm_gib=141 max_target_length=8192 \
    per_device_batch_size=2 > est2.out 2> err || fail "estimate fixed batch: $(cat err)"
[ "$(grep -c '^meshtrain train' remat_commands_from_estimator.txt)" -eq 1 ] || fail "mode 2 gives one command"
grep -q "per_device_batch_size=2 " remat_commands_from_estimator.txt || fail "mode 2 keeps the batch"

# --- mode 3: a fixed tensor is left alone ---
"$bin" estimate "$base" $nodata model_name=gemma2-9b num_devices=8 hbm_gib=141 max_target_length=8192 \
    remat_policy=custom mlpwi_0=device > est3.out 2> err || fail "estimate custom: $(cat err)"
total=$(grep -c '^meshtrain train' remat_commands_from_estimator.txt)
kept=$(grep -c 'mlpwi_0=device' remat_commands_from_estimator.txt)
[ "$total" -ge 1 ] && [ "$total" -eq "$kept" ] || fail "mlpwi_0=device not respected ($kept of $total)"

# --- bad input: exit 2 with the reason named ---
expect2() { # expect2 PATTERN args...
    local pat="$1"; shift
    "$bin" estimate "$base" $nodata "$@" > out 2> err; rc=$?
    [ $rc -eq 2 ] || fail "estimate $* exited $rc, expected 2"
    grep -q -- "$pat" err || fail "estimate $*: message lacks '$pat': $(cat err)"
}
expect2 "hbm_gib" hbm_gib=0
expect2 "hbm_gib" hbm_gib=-3
expect2 "query_projection" hbm_gib=8 remat_policy=custom query_projection=remat
expect2 "keep" hbm_gib=8 remat_policy=custom query_proj=keep
expect2 "does not fit" model_name=llama3.1-8b hbm_gib=1 per_device_batch_size=64 max_target_length=8192
grep -q "bytes" err || fail "no-fit message gives no bytes: $(cat err)"
expect2 "does not fit" model_name=llama3.1-8b hbm_gib=0.5
expect2 "decoder_layer_input" hbm_gib=8 remat_policy=custom decoder_layer_input=remat

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "ok"
