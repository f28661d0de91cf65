#!/usr/bin/env bash
# tests/test_cli_plan_offload.sh BUILD_DIR: remat, activation offload, parameter and
# optimizer host offload together with ZeRO-1 and gradient accumulation under mpirun
# (CPU backend), using the layout tool of tests/test_mpi_layouts.sh.
#
# Offloading and rematerialising change where bytes live, never the arithmetic, so a
# run with remat_policy=minimal_offloaded (or a custom mix), parameter_memory_host_offload
# and optimizer_memory_host_offload must give BITWISE the losses, step-1 gradients (which reach the optimizer in the
# ZeRO-1 shard layout: mpi_layout gathers them from the shards) and step-3
# parameters of the same layout keeping everything on the device (tolerance 0), and
# match the single-process run within the layout tests' derived fp32 bounds (mpi_layout
# compare ... derived with the reference's perturbed run ref_kappa; was 1e-5). `meshtrain plan` for the
# layout puts the optimizer shard and the parameters in host memory, and only two layer
# windows plus the embedding/norm window of parameters on the device (in both the
# all-entries and the live-at-peak figures for the optimizer).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_plan_offload.sh "${1:-}"
mt_need_tools mpi_layout
tool=${tools[0]}
mt_need_mpirun
mt_mpi_env
mt_sys_python

mt_tmp

mt_tiny_model "$tmp/cfg/models/tinyg2.yml" gemma2 3
mt_layout_cfg tinyg2
run1() { local name=$1; shift; "$tool" run "$tmp/$name" "$cfg" "$@" > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"; }
run2() { local name=$1; shift; mpi 2 "$tool" run "$tmp/$name" "$cfg" "$@" > "$tmp/$name.log" 2>&1 || fail "$name: mpirun: $(tail -5 "$tmp/$name.log")"; }
cmp() { "$tool" compare "$tmp/$2" "$tmp/$1" "$3" > "$tmp/$1.cmp" 2>&1 || { fail "$1 vs $2 (tol $3)"; cat "$tmp/$1.cmp"; }; }

z="ici_data_parallelism=2 shard_optimizer_over_data=true per_device_batch_size=1 gradient_accumulation_steps=4"
run1 ref per_device_batch_size=8
"$tool" run-kappa "$tmp/ref_kappa" "$cfg" per_device_batch_size=8 > "$tmp/ref_kappa.log" 2>&1 ||
    fail "ref perturbed: $(tail -3 "$tmp/ref_kappa.log")"
# single process: optimizer in the host pool, everything offloaded or recomputed
run1 one_off per_device_batch_size=8 optimizer_memory_host_offload=true parameter_memory_host_offload=true \
    remat_policy=minimal_offloaded
cmp one_off ref 0
for sched in once every; do
    run2 "z_$sched" $z gradient_accumulation_reduce=$sched
    run2 "z_${sched}_off" $z gradient_accumulation_reduce=$sched optimizer_memory_host_offload=true \
        parameter_memory_host_offload=true remat_policy=minimal_offloaded
    run2 "z_${sched}_full" $z gradient_accumulation_reduce=$sched parameter_memory_host_offload=true \
        remat_policy=custom query_proj=offload context=device mlpwi_1=offload
    cmp "z_${sched}_off" "z_$sched" 0
    cmp "z_${sched}_full" "z_$sched" 0
    cmp "z_${sched}_off" ref derived
    grep "^worst ratio" "$tmp/z_${sched}_off.cmp" | sed "s/^/z_${sched}_off vs one process: /"
done

# the plan of that layout: the optimizer shard on the host, none on the device
"$bin" plan "$cfg" $z optimizer_memory_host_offload=true parameter_memory_host_offload=true \
    remat_policy=minimal_offloaded num_devices=2 --json \
    > "$tmp/plan.json" 2> "$tmp/plan.err" || fail "plan: $(cat "$tmp/plan.err")"
"$bin" plan "$cfg" $z num_devices=2 --json > "$tmp/plan0.json" 2> "$tmp/plan.err" || fail "plan: $(cat "$tmp/plan.err")"
$py - "$tmp/plan.json" "$tmp/plan0.json" <<'PY' || fail "plan json: $(cat "$tmp/plan.json")"
import json, sys
p, q = (json.load(open(f)) for f in sys.argv[1:3])
n = p["num_params"]
shard = (n + 1) // 2
# m and v of the shard, and the AdamW segment table: 24 bytes per parameter tensor
# (train/optimizer.h; Gemma 2: 4 norms and 7 matrices per layer, embedding, final norm)
opt = 8 * shard + 24 * (11 * 3 + 2)
assert p["mesh"]["data"] == 2 and p["mesh"]["fsdp"] == 1, p["mesh"]
assert p["per_device"]["optimizer"] == 0, p["per_device"]
assert p["host"]["optimizer"] == opt, (p["host"], shard)
assert q["per_device"]["optimizer"] == opt, q["per_device"]
assert p["host"]["activations"] > 0 and q["host"]["total"] == 0
assert p["host"]["parameters"] == 4 * n, (p["host"], n)
assert q["per_device"]["parameters"] == 4 * n
# the device keeps two layer windows and the embedding/norm window
L, D, F, H, KV, Dh = 3, 32, 64, 4, 2, 8
layer = D * H * Dh + 2 * D * KV * Dh + H * Dh * D + 3 * D * F + 4 * D
assert p["per_device"]["parameters"] == 4 * (2 * layer + (n - L * layer)), (p["per_device"], layer, n)
assert p["peak_bytes"] < q["peak_bytes"]
# the AdamW moments are held over the whole step: live at the peak phase too
assert p["per_device_live_at_peak"]["optimizer"] == 0, p["per_device_live_at_peak"]
assert q["per_device_live_at_peak"]["optimizer"] == opt, q["per_device_live_at_peak"]
PY

mt_finish ok
