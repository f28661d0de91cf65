#!/usr/bin/env bash
# tests/test_cli_estimate.sh BUILD_DIR: `meshtrain plan` (per-tensor table, --json,
# no data and no device needed, one rank of a 1024-device job; the live-at-peak and
# all-entries columns; fsdp layouts are the trainer's own plan (fsdp with tensor, data
# and context, and with parameter host offload: `train` runs them all); what the
# trainer refuses exits 2 naming the key; an unknown model_name's message) and
# `meshtrain estimate` (the three modes, the commands file, speed, the Pareto list and
# its fit invariant, bad input).
set -u
. "$(dirname "$0")/lib.sh"
build="$1"
bin="$build/meshtrain"
src="$(pwd)"
base="$src/configs/base.yml"
[ -x "$bin" ] || { echo "no $bin"; exit 1; }
mt_sys_python
mt_tmp
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
# llama has no post-MLP norm: mlpwo is never saved, as estimate's rows say (it said "device")
assert all(x["remat"]["mlpwo"] == "never_saved" for x in (f, k, o)), [x["remat"]["mlpwo"] for x in (f, k, o)]
assert k["per_device"]["recompute_scratch"] == 0 and f["per_device"]["recompute_scratch"] > 0
assert k["host"]["total"] == 0
# minimal_offloaded: everything but context on the host
host = sum(4 * L * e for n, e in want.items() if n not in ("decoder_layer_input", "context"))
assert o["host"]["activations"] == host, (o["host"], host)
assert f["peak_bytes"] < k["peak_bytes"]
PY

# --- the table's two columns: bytes live at the peak phase, and all of a row's entries
# (any phase). docs/memory.md's model (Llama block, d 512, 8 heads x 64, mlp 2048, 4
# layers, vocab 32000, seq 512), one device, grad_dtype bfloat16, 2 micro-batches: the
# gradient is the bf16 accumulator (2 bytes x numel, live all step) plus fp32 windows
# never live together: the largest layer parameter (a layer's gradient goes over one
# parameter at a time), model.norm, one vocabulary chunk of lm_head (the loss phase)
# and one of the embedding (its backward), and the reduce chunk of the largest
# parameter (the embedding). The gradient windows make num_vocab_chunks=auto cut the
# vocabulary into C = ceil(V D / weight) chunks, weight the largest layer parameter
# (models/model.h), here 16 of 2000 rows. The peak is the last layer's backward, where
# the accumulator and the layer parameter window are live. ---
small="model_name=llama2-7b base_emb_dim=512 base_num_query_heads=8 base_num_kv_heads=8 head_dim=64
 base_mlp_dim=2048 base_num_decoder_layers=4 vocab_size=32000 max_target_length=512 per_device_batch_size=1
 gradient_accumulation_steps=2 grad_dtype=bfloat16"
"$bin" plan "$base" $nodata $small > cols.out 2> err || fail "plan columns: $(cat err)"
"$bin" plan "$base" $nodata $small --json > cols.json 2> err || fail "plan columns --json: $(cat err)"
$py - <<'PY' || fail "plan columns: $(cat cols.out)"
import json
D, QD, KVD, F, L, V = 512, 512, 512, 2048, 4, 32000
layer = D * QD + 2 * D * KVD + QD * D + 3 * D * F + 2 * D
weight = max(D * QD, D * KVD, D * F)
numel = L * layer + 2 * V * D + D
C = -(-V * D // weight)
Vc = -(-V // C)
assert (C, Vc) == (16, 2000), (C, Vc)
acc, tail, vocab, chunk = 2 * numel, 4 * D, 4 * Vc * D, 4 * max(V * D, D * F, D * QD)
total, live = acc + 4 * weight + tail + 2 * vocab + chunk, acc + 4 * weight
p = json.load(open("cols.json"))
assert p["num_params"] == numel, (p["num_params"], numel)
assert p["peak_phase"] == L + 2, p["peak_phase"]  # phase L + 2: layer L - 1's backward
assert p["num_vocab_chunks"] == C and p["num_vocab_tiling"] >= 1, (p["num_vocab_chunks"], p["num_vocab_tiling"])
pl, pt = p["per_device_live_at_peak"], p["per_device"]
assert pt["gradients_and_accumulators"] == total, (pt, total)
assert pl["gradients_and_accumulators"] == live, (pl, live)
assert set(pl) == set(pt) - {"layer_kept"}, (sorted(pl), sorted(pt))
assert set(p["saved_live_at_peak"]) == set(p["saved"])
assert sum(pl.values()) == p["live_at_peak_bytes"], (sum(pl.values()), p["live_at_peak_bytes"])
assert sum(v for k, v in pt.items() if k != "layer_kept") == sum(p["total"].values())
assert pl["gradients_and_accumulators"] == p["live_at_peak"]["grads"]
lines = open("cols.out").read().splitlines()
head = [l for l in lines if l.startswith("  device buffers")][0]
assert "live at peak (phase %d)" % p["peak_phase"] in head and "all entries" in head, head
def row(label):
    l = [l for l in lines if l.startswith("  " + label + "  ")][0]
    return [int(w) for w in l[len(label) + 2:].split() if w.isdigit()]
assert row("gradients and accumulators")[:2] == [live, total], row("gradients and accumulators")
assert row("sum of buffers")[0] == p["live_at_peak_bytes"], row("sum of buffers")
assert row("peak (arena size)")[0] == p["peak_bytes"]
PY

# --- what the trainer refuses for every layout (MT_ERR_UNSUPPORTED: master weights are
# fp32) exits 2 naming the key, on an fsdp job too: plan, and estimate with the fsdp
# axis given (held, not searched) ---
for cmd in plan estimate; do
    "$bin" $cmd "$base" $nodata model_name=llama3.1-8b num_devices=16 max_target_length=2048 weight_dtype=bfloat16 \
        ici_fsdp_parallelism=16 hbm_gib=80 > out 2> err
    rc=$?
    [ $rc -eq 2 ] || fail "$cmd weight_dtype=bfloat16 on fsdp 16 exited $rc, expected 2: $(cat err)"
    grep -q "weight_dtype=bfloat16" err || fail "$cmd weight_dtype=bfloat16: message lacks the key: $(cat err)"
done

# --- plan one rank of a 1024-device 405B job: the trainer's own fsdp plan ---
"$bin" plan "$base" $nodata model_name=llama3.1-405b num_devices=1024 max_target_length=2048 \
    remat_policy=full --json > big.json 2> err || fail "plan 405b: $(cat err)"
$py -c "import json; p = json.load(open('big.json')); assert p['mesh']['fsdp'] == 1024; assert p['num_params'] > 4e11; assert p['per_device']['parameters'] * 1024 >= 4 * p['num_params']" || fail "405b plan json"
"$bin" plan "$base" $nodata model_name=llama3.1-405b num_devices=1000 ici_tensor_parallelism=3 > /dev/null 2> err
[ $? -eq 2 ] || fail "a mesh that does not divide must exit 2"

# --- fsdp layouts: the trainer's plan (fsdp, fsdp x tensor, data x fsdp, context x
# fsdp, fsdp with parameter host offload: `train` runs them all; tests/test_mpi_plan_fsdp.sh
# compares the plan with what `train` allocates under mpirun) ---
m8="model_name=llama3.1-8b num_devices=16 max_target_length=2048"
for lay in "ici_fsdp_parallelism=-1" "ici_fsdp_parallelism=-1 ici_tensor_parallelism=2" \
    "ici_data_parallelism=2 ici_fsdp_parallelism=-1" "ici_context_parallelism=2 ici_fsdp_parallelism=-1" \
    "ici_fsdp_parallelism=-1 parameter_memory_host_offload=true" "ici_fsdp_parallelism=-1 dtype=bfloat16" \
    "ici_fsdp_parallelism=-1 ici_tensor_parallelism=2 dtype=bfloat16"; do
    "$bin" plan "$base" $nodata $m8 $lay > lay.out 2> err || fail "plan $lay: $(cat err)"
    grep -q "exactly what \`train\` allocates" lay.out || fail "plan $lay is not the trainer's: $(sed -n 2p lay.out)"
    "$bin" estimate "$base" $nodata $m8 $lay hbm_gib=80 > lay.est 2> err || fail "estimate $lay: $(cat err)"
    grep -q "^plans: the trainer's own" lay.est || fail "estimate $lay: its plans are not the trainer's: $(grep ^plans lay.est)"
done
# data 2 x fsdp 4 on 8 devices: the trainer's plan, its optimizer state
# 1/8 of AdamW's 8 bytes per parameter (shards nested in the fsdp shards, rank 0's
# sub-shard ceil(ceil(N / 4) / 2) floats) plus the AdamW segment table, 24 bytes per
# parameter tensor (train/optimizer.h; 32 layers of 2 norms and 7 matrices, embedding,
# final norm, lm_head)
"$bin" plan "$base" $nodata model_name=llama3.1-8b max_target_length=2048 num_devices=8 ici_data_parallelism=2 \
    ici_fsdp_parallelism=4 --json > d2f4.json 2> err || fail "plan data 2 x fsdp 4: $(cat err)"
$py -c "
import json; p = json.load(open('d2f4.json')); n = p['num_params']
assert p['mesh']['data'] == 2 and p['mesh']['fsdp'] == 4, p['mesh']
assert p['per_device']['optimizer'] == 8 * -(-(-(-n // 4)) // 2) + 24 * (9 * 32 + 3), (p['per_device']['optimizer'], n)
" || fail "plan data 2 x fsdp 4: $(head -c 600 d2f4.json)"

# --- an unknown model_name names each directory searched once, no configs/configs ---
"$bin" plan "$base" $nodata model_name=no-such-model > /dev/null 2> err
[ $? -eq 2 ] || fail "unknown model_name must exit 2"
grep -q "no-such-model" err || fail "unknown model_name: message lacks the name: $(cat err)"
grep -q "$src/configs/models" err || fail "unknown model_name: message lacks $src/configs/models: $(cat err)"
grep -q "configs/configs" err && fail "unknown model_name: doubled search path: $(cat err)"

# check_rows OUT BUDGET_BYTES: the estimator's invariant on a mode-1 output (table OUT,
# commands in ./remat_commands_from_estimator.txt, same order):
#  - per layout the Pareto list: no row has a batch >= and a modelled step <= another
#    row of its layout, one of them strictly (the step is printed with 7 significant
#    digits);
#  - each row's command carries its layout's ici_* keys, plans (`meshtrain plan`: the
#    trainer accepts the layout) on that mesh within the budget, and the same policy
#    at batch + 1 does not (the walk's batches are maxima).
check_rows() {
    "$py" - "$1" "$2" "$bin" <<'PY'
import json, subprocess, sys
out, budget, binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []  # (layout, (data, fsdp, context, tensor), batch, step s)
for line in open(out):
    f = line.split()
    if len(f) > 12 and f[0].isdigit():
        rows.append((int(f[1]), tuple(int(x) for x in f[2:6]), int(f[6]), float(f[9])))
# a line is [mpirun -np N] BINARY train CONFIG key=value ... (BINARY: this binary's
# path as invoked): plan takes CONFIG key=value ...
cmds = []
for l in open("remat_commands_from_estimator.txt"):
    f = l.split()
    if f[:2] == ["mpirun", "-np"]:
        f = f[3:]
    if f[:2] == [binary, "train"]:
        cmds.append(f[2:])
assert rows and len(rows) == len(cmds), (len(rows), len(cmds))
bad = 0
for i, (l, _, b, t) in enumerate(rows):
    for j, (l2, _, b2, t2) in enumerate(rows):
        if i != j and l == l2 and b2 >= b and t2 <= t and (b2 > b or t2 < t):
            print("row %d (batch %d, %g s) is dominated by row %d (batch %d, %g s)" % (i + 1, b, t, j + 1, b2, t2))
            bad += 1
def peak(args, dims=None):
    r = subprocess.run([binary, "plan"] + args + ["--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    if dims:
        m = p["mesh"]
        assert (m["data"], m["fsdp"], m["context"], m["tensor"]) == dims, (m, dims)
    return p["peak_bytes"]
for i, args in enumerate(cmds):
    b, dims = rows[i][2], rows[i][1]
    assert "per_device_batch_size=%d" % b in args, (b, args)
    for k, v in zip(("data", "fsdp", "context", "tensor"), dims):
        assert "ici_%s_parallelism=%d" % (k, v) in args, (k, v, args)
    p = peak(args, dims)
    p1 = peak([a if not a.startswith("per_device_batch_size=") else "per_device_batch_size=%d" % (b + 1) for a in args])
    print("row %d: batch %d peak %d, batch %d peak %d, budget %d" % (i + 1, b, p, b + 1, p1, budget))
    if p > budget:
        print("row %d over budget" % (i + 1)); bad += 1
    if p1 <= budget:
        print("row %d: batch %d fits too: not the largest" % (i + 1, b + 1)); bad += 1
sys.exit(1 if bad else 0)
PY
}

# --- estimate: mode 1 (batch and policy), fast, the Pareto list, runnable commands ---
# llama3.1-405b on 1024 devices at hbm_gib=95 (docs/estimates/) when it fits (exit 2
# with "does not fit" otherwise), and at a budget with room to walk: the full-remat
# plan of batch 1 plus 4 x what batch 2 adds to it. Their time (target: under 2 s each)
# is a benchmark, bench/estimate_time.sh, not a check here: a shared machine's wall
# time is noise.
gib=$((1024 * 1024 * 1024))
big="model_name=llama3.1-405b num_devices=1024 max_target_length=2048"
peak_of() { "$bin" plan "$@" --json | $py -c "import json, sys; print(json.load(sys.stdin)['peak_bytes'])"; }
pk() { peak_of "$base" $nodata $big remat_policy=full per_device_batch_size=$1; }
p1=$(pk 1); p2=$(pk 2)
roomy=$(( (p1 + 4 * (p2 - p1) + gib - 1) / gib ))
for hbm in 95 $roomy; do
    "$bin" estimate "$base" $nodata $big hbm_gib=$hbm > est.out 2> err
    rc=$?
    if [ $rc -ne 0 ]; then
        [ $hbm -eq 95 ] && grep -q "does not fit" err || fail "estimate 405b hbm_gib=$hbm: $(cat err)"
        continue
    fi
    cat est.out
    grep -q "^plans: the trainer's own" est.out || fail "405b estimate: plans not the trainer's"
    [ -s remat_commands_from_estimator.txt ] || fail "no remat_commands_from_estimator.txt"
    check_rows est.out $((hbm * gib)) || fail "405b estimate rows (hbm_gib=$hbm)"
done
[ "$(grep -cE "^(mpirun -np [0-9]+ )?$bin train " remat_commands_from_estimator.txt)" -ge 2 ] \
    || fail "405b at hbm_gib=$roomy: fewer than 2 Pareto rows"

for conf in "model_name=gemma2-9b num_devices=8 max_target_length=8192 hbm_gib=141" \
            "model_name=llama3.1-8b num_devices=8 max_target_length=4096 hbm_gib=96 ici_fsdp_parallelism=-1 ici_tensor_parallelism=2"; do
    "$bin" estimate "$base" $nodata $conf > est.out 2> err || { fail "estimate $conf: $(cat err)"; continue; }
    cat est.out
    hb=${conf##*hbm_gib=}; hb=${hb%% *}
    check_rows est.out $((hb * gib)) || fail "estimate rows: $conf"
done

# --- mode 2: fixed batch, lightest policy that fits ---
"$bin" estimate "$base" $nodata model_name=gemma2-9b num_devices=8 hbm_gib=141 max_target_length=8192 \
    per_device_batch_size=2 > est2.out 2> err || fail "estimate fixed batch: $(cat err)"
# one row per listed layout (at most 5), each at the given batch
nl=$(grep -cE "^(mpirun -np [0-9]+ )?$bin train " remat_commands_from_estimator.txt)
[ "$nl" -ge 1 ] && [ "$nl" -le 5 ] || fail "mode 2 gives one command per listed layout, got $nl"
[ "$(grep -c "per_device_batch_size=2 " remat_commands_from_estimator.txt)" -eq "$nl" ] || fail "mode 2 keeps the batch"
[ "$(awk '$1 ~ /^[0-9]+$/ && NF > 12 {print $2}' est2.out | sort -u | wc -l)" -eq "$nl" ] \
    || fail "mode 2: not one row per layout: $(cat est2.out)"
# mode 2 at full depth: the 405b on one fsdp 1024 mesh at batch 1, budgets 80 to 95 GiB.
# Each run lists a row whose own plan (`meshtrain plan` of its command) fits the budget,
# or exits 2 "does not fit" only when full remat's plan does not. The step back from
# all-device stops at the first policy whose exact full-depth plan fits: the 2-3 layer
# extrapolation is a lower bound of the packed arena, and at hbm_gib=85 a policy that
# fit by it was over at full depth (the row was then dropped and "does not fit" said).
one405="model_name=llama3.1-405b num_devices=1024 max_target_length=2048 per_device_batch_size=1
 ici_fsdp_parallelism=1024 ici_data_parallelism=1 ici_context_parallelism=1 ici_tensor_parallelism=1"
full=$(peak_of "$base" $nodata $one405 remat_policy=full)
for hbm in 80 85 90 95; do
    rm -f remat_commands_from_estimator.txt
    "$bin" estimate "$base" $nodata $one405 hbm_gib=$hbm > est4.out 2> err
    rc=$?
    if [ $rc -eq 2 ]; then
        grep -q "does not fit" err && [ "$full" -gt $((hbm * gib)) ] \
            || fail "mode 2 405b hbm_gib=$hbm: exit 2 with full remat at $full bytes: $(cat err)"
        continue
    fi
    [ $rc -eq 0 ] || fail "mode 2 405b hbm_gib=$hbm exited $rc: $(cat err)"
    cmd=$(grep -m1 " train " remat_commands_from_estimator.txt | sed 's/.* train //')
    # shellcheck disable=SC2086
    p=$(peak_of $cmd)
    echo "mode 2 405b hbm_gib=$hbm: row plan $p bytes, budget $((hbm * gib))"
    [ "$p" -le $((hbm * gib)) ] || fail "mode 2 405b hbm_gib=$hbm: the row's plan $p is over the budget"
done

# --- mode 3: a fixed tensor is left alone ---
"$bin" estimate "$base" $nodata model_name=gemma2-9b num_devices=8 hbm_gib=141 max_target_length=8192 \
    remat_policy=custom mlpwi_0=device > est3.out 2> err || fail "estimate custom: $(cat err)"
total=$(grep -cE "^(mpirun -np [0-9]+ )?$bin train " remat_commands_from_estimator.txt)
kept=$(grep -c 'mlpwi_0=device' remat_commands_from_estimator.txt)
[ "$total" -ge 1 ] && [ "$total" -eq "$kept" ] || fail "mlpwi_0=device not respected ($kept of $total)"
check_rows est3.out $((141 * gib)) || fail "estimate rows with mlpwi_0=device fixed"

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

mt_finish "ok"
