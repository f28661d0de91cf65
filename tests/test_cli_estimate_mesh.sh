#!/usr/bin/env bash
# tests/test_cli_estimate_mesh.sh BUILD_DIR: `meshtrain estimate ... num_devices=N` also
# searches the mesh (train/estimate.h mt_estimate_mesh). For several models and N:
#  - every listed row's layout is a factorisation of N that the trainer accepts: its
#    command carries the row's ici_* keys and `meshtrain plan` of that command (the
#    trainer's own layout checks and plan) succeeds on the same mesh; the top row's
#    plan has exactly the device bytes the row claims, within the budget;
#  - dtype=bfloat16 (which runs on every layout) refuses no more layouts than float32;
#  - ici_* keys given on the command line are held (not searched), -1 fills the rest;
#  - a bad num_devices (0, negative, not a number) exits 2 naming the key.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_estimate_mesh.sh "${1:-}"
mt_sys_python
mt_tmp
base="$src/configs/base.yml"
cd "$tmp" || exit 1
nodata="dataset_path=$tmp/no/such/dir"
gib=$((1024 * 1024 * 1024))

# check NAME HELD N ARGS...: estimate --json with ARGS; HELD is "data=V fsdp=V ..." for
# the axes that must stay as given (V = any: free but not checked)
check() {
    local name="$1" held="$2" n="$3"; shift 3
    "$bin" estimate "$base" $nodata num_devices="$n" "$@" --json > est.json 2> err \
        || { fail "$name: estimate exited $?: $(cat err)"; return; }
    "$py" - "$bin" "$base" "$nodata" "$n" "$held" <<'PY' || fail "$name: $(head -c 2000 est.json)"
import json, subprocess, sys
binary, base, nodata, n, held = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
e = json.load(open("est.json"))
rows = e["rows"]
assert rows, "no rows"
want = dict(kv.split("=") for kv in held.split()) if held else {}
bad = 0
for r in rows:
    m = r["mesh"]
    dims = (m["data"], m["fsdp"], m["context"], m["tensor"])
    assert dims[0] * dims[1] * dims[2] * dims[3] == n, (dims, n)
    for axis, v in want.items():
        assert v == "any" or m[axis] == int(v), ("held axis moved", axis, v, dims)
    words = r["command"].split()
    for k, v in zip(("data", "fsdp", "context", "tensor"), dims):
        assert "ici_%s_parallelism=%d" % (k, v) in words, ("command lacks the layout", k, v, r["command"])
    args = words[words.index("train") + 2:]  # after CONFIG
    p = subprocess.run([binary, "plan", base] + args + ["--json"], capture_output=True, text=True)
    if p.returncode != 0:
        print("row %d (%s): the trainer refuses it: %s" % (r["rank"], dims, p.stderr.strip()))
        bad += 1
        continue
    pm = json.loads(p.stdout)
    assert tuple(pm["mesh"][k] for k in ("data", "fsdp", "context", "tensor")) == dims, (pm["mesh"], dims)
    if r["rank"] == 1:
        assert pm["peak_bytes"] == r["device_bytes"], ("top row: plan", pm["peak_bytes"], "row", r["device_bytes"])
        assert pm["peak_bytes"] <= e["budget_bytes"], ("top row over budget", pm["peak_bytes"], e["budget_bytes"])
ms = e["mesh_search"]
assert ms["refused"] + ms["no_fit"] + ms["bounded"] + ms["searched"] == ms["candidates"], ms
assert sorted(ms["held_axes"]) == sorted(want), (ms["held_axes"], want)
print("%d rows of %d layouts; %s" % (len(rows), ms["listed"], ms))
sys.exit(1 if bad else 0)
PY
}

# several models and device counts, every axis searched
check "llama3-tiny on 6" "" 6 hbm_gib=0.5
check "llama3.1-8b on 8" "" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80
check "gemma2-9b on 16" "" 16 model_name=gemma2-9b max_target_length=4096 hbm_gib=141
check "llama3.1-405b on 1024" "" 1024 model_name=llama3.1-405b max_target_length=2048 hbm_gib=95
# dtype=bfloat16 runs on every layout: its search refuses what float32's refuses (shapes)
check "llama3.1-8b on 8, hbm 141" "" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=141
cp est.json est32.json
check "llama3.1-8b bf16 on 8" "" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=141 dtype=bfloat16
"$py" -c "
import json; a = json.load(open('est32.json'))['mesh_search']; b = json.load(open('est.json'))['mesh_search']
assert (a['candidates'], a['refused']) == (b['candidates'], b['refused']), (a, b)" || fail "bf16: refuses other layouts than float32"
# grad_window_chunks > 1 refuses a tensor axis (models/model.h mt_model_check_memory_layout):
# the search counts those layouts as refused and lists the others (it stopped at the first
# tensor layout before); every row's command carries the key and plans (check)
check "llama3.1-8b on 8, gradient blocks" "" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 \
    grad_window_chunks=4
cp est.json estgwc.json
check "llama3.1-8b on 8, hbm 80" "" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80
"$py" -c "
import json; a = json.load(open('estgwc.json')); b = json.load(open('est.json'))
ra, rb = a['mesh_search']['refused'], b['mesh_search']['refused']
assert ra > rb, ('refused with blocks', ra, 'without', rb)
assert all('grad_window_chunks=4' in r['command'].split() for r in a['rows']), 'a command lacks the key'
assert all(r['mesh']['tensor'] == 1 for r in a['rows']), 'a row with a tensor axis'" \
    || fail "grad_window_chunks=4: tensor layouts not refused, or commands without the key"
# held axes: given on the command line, even at 1; -1 fills what the searched axes leave
check "tensor held at 2" "tensor=2" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 ici_tensor_parallelism=2
check "data and context held at 1" "data=1 context=1" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 \
    ici_data_parallelism=1 ici_context_parallelism=1
check "fsdp fills, tensor 2" "fsdp=any tensor=2" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 \
    ici_fsdp_parallelism=-1 ici_tensor_parallelism=2
# every axis given: one layout, the old single-mesh estimate
check "all held" "data=2 fsdp=4 context=1 tensor=1" 8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 \
    ici_data_parallelism=2 ici_fsdp_parallelism=4 ici_context_parallelism=1 ici_tensor_parallelism=1
"$py" -c "
import json; e = json.load(open('est.json'))
assert e['mesh_search']['candidates'] == 1 and e['mesh_search']['listed'] == 1, e['mesh_search']" \
    || fail "all axes given: not one layout"

# the commands file names the searched axes and gives each line its layout
"$bin" estimate "$base" $nodata num_devices=8 model_name=llama3.1-8b max_target_length=2048 hbm_gib=80 \
    > est.out 2> err || fail "estimate: $(cat err)"
head -1 remat_commands_from_estimator.txt | grep -q "axes searched: data fsdp context tensor" \
    || fail "commands file header: $(head -1 remat_commands_from_estimator.txt)"
grep -q "^mesh: data x fsdp x context x tensor = 8, axes searched" est.out || fail "no mesh line: $(cat est.out)"

# bad num_devices: exit 2 naming the key; a held axis that does not divide it too
for v in 0 -4 abc 2.5 ''; do
    "$bin" estimate "$base" $nodata hbm_gib=8 "num_devices=$v" > out 2> err; rc=$?
    [ $rc -eq 2 ] || fail "num_devices='$v': exit $rc, expected 2"
    grep -q "num_devices" err || fail "num_devices='$v': message lacks the key: $(cat err)"
done
"$bin" estimate "$base" $nodata hbm_gib=8 num_devices=8 ici_tensor_parallelism=3 > out 2> err; rc=$?
[ $rc -eq 2 ] || fail "num_devices=8 with tensor 3 held: exit $rc, expected 2"
grep -q "num_devices" err || fail "num_devices=8 with tensor 3: message lacks the key: $(cat err)"

mt_finish "ok: the mesh search's rows are layouts the trainer plans, held axes held, bad num_devices refused"
