#!/usr/bin/env bash
# tests/test_mpi_resume.sh BUILD_DIR: `meshtrain train` under mpirun with dp2 x tp2,
# ZeRO-1 and 2 micro-batches (4 ranks), and with fsdp2 x tp2, dp2 x fsdp2 and cp2 x
# fsdp2 (parameters sharded over fsdp, the optimizer shards nested inside them over data
# x context: the checkpoint gathers both, the resume scatters them back):
#  - its losses equal the single-process run on the same global batch (4 sequences x 2
#    micro-batches) within each step's derived fp32 bound (fp32 sums in another order;
#    tests/lib.sh mt_fp32_bounds, computed with the CPU tool: the bound is the math's;
#    was 1e-5);
#  - its step-2 checkpoint (model.safetensors, and train_state.safetensors with the
#    AdamW moments gathered from the ZeRO-1 shards) equals the single-process one
#    within derived per-tensor bounds (mpi_layout bounds, REF/tensor_bounds.txt: the
#    elementwise gradient difference bound carried through AdamW and through the
#    moments' recursions, as a relative norm; 1.3e-6 to 3.9e-3 for the parameters,
#    8.5e-4 to 2.2e-3 for the moments; measured at most 0.0082 of them; was 1e-5);
#  - resuming from that checkpoint under the same layout reproduces steps 3..4 of the
#    uninterrupted run bitwise (loss and grad_norm printed with %.17g in metrics.jsonl);
#  - the dp2 x tp2 and the dp2 x fsdp2 checkpoints load as load_parameters_path into
#    runs of other layouts (one process, and cp2 over 2 ranks) with learning_rate 0:
#    their first losses agree within the derived step-1 bound at the loaded parameters
#    (was 1e-5) and the checkpoints they write hold the loaded parameters bitwise.
# adam_eps = 1e-5 for the reason given in tests/test_mpi_layouts.sh.
# With a second argument `cuda` (tests/test_emu_mpi_resume.sh) every run uses
# meshtrain-emu with backend=cuda (checkpoints written from and loaded into device
# shards); the same checks.
set -u
. "$(dirname "$0")/lib.sh"
backend="${2:-cpu}"
mt_build_backend test_mpi_resume.sh "${1:-}" "$backend"
mt_need_tools mpi_layout
tool=${tools[0]}
mt_need_mpirun
py=/usr/bin/python3
$py -c "import numpy" 2>/dev/null || { echo "no numpy for $py: skipped"; exit 77; }
mt_mpi_env

mt_tmp
echo "tmp=$tmp" >&2

mt_tiny_model "$tmp/cfg/models/tinyl.yml" llama
"$tool" data "$tmp/data" || exit 1
mt_run_yml tinyl <<YML
max_target_length: 16
gradient_accumulation_steps: 2
steps: 4
learning_rate: 0.0003
adam_eps: 1e-05
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 2
log_period: 1
backend: $backend
seed: 5
YML
"$bin" train "$tmp/cfg/run.yml" run_name=single per_device_batch_size=4 > "$tmp/single.log" 2>&1 ||
    fail "single run: $(tail -3 "$tmp/single.log")"
layout_tool=$tool
mt_fp32_bounds sref 4 per_device_batch_size=4 backend=cpu
mt_fp32_bounds sref2 2 per_device_batch_size=4 backend=cpu # the step-2 checkpoint's tensors
# check NAME ARGS...: a 4-rank run NAME and its resume NAME_resumed against the single run
check() {
local name=$1; shift
mpirun --oversubscribe -np 4 "$bin" train "$tmp/cfg/run.yml" run_name=$name "$@" > "$tmp/$name.log" 2>&1 ||
    fail "$name run: $(tail -5 "$tmp/$name.log")"
mpirun --oversubscribe -np 4 "$bin" train "$tmp/cfg/run.yml" run_name=${name}_resumed "$@" \
    load_checkpoint="$tmp/out/$name/checkpoints/step_2" > "$tmp/${name}_res.log" 2>&1 ||
    fail "$name resumed run: $(tail -5 "$tmp/${name}_res.log")"
echo "== $name"
$py - "$tmp/out" "$name" "$tmp/sref.bounds" "$tmp/sref2/tensor_bounds.txt" <<'PY' || fail "$name comparison"
import json, struct, sys
import numpy as np
out, name = sys.argv[1], sys.argv[2]
bound = {int(l.split()[0]): float(l.split()[1]) for l in open(sys.argv[3])}
tb = {}
for l in open(sys.argv[4]):
    n, bp, bm, bv = l.split()
    tb[n], tb[n + ".adam_m"], tb[n + ".adam_v"] = float(bp), float(bm), float(bv)
def rows(run):
    return [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl") if '"loss"' in l]
single, par, res = rows("single"), rows(name), rows(name + "_resumed")
bad = 0
for a, b in zip(par, single):
    e = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    print(f"step {a['step']}: loss {a['loss']:.9f} single {b['loss']:.9f} rel {e:.1e} (bound {bound[a['step']]:.1e})")
    if e > bound[a["step"]]: bad += 1
tail = [r for r in par if r["step"] > 2]
if [(r["step"], r["loss"], r["grad_norm"]) for r in tail] != [(r["step"], r["loss"], r["grad_norm"]) for r in res]:
    print("resumed run differs:", tail, res); bad += 1
else:
    print("resumed steps 3..4 bitwise equal")
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n)); data = f.read()
    t = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        t[k] = np.frombuffer(data[a:b], dtype=np.float32)
    return t
for f in ("model.safetensors", "train_state.safetensors"):
    A = load(f"{out}/{name}/checkpoints/step_2/{f}"); B = load(f"{out}/single/checkpoints/step_2/{f}")
    if A.keys() != B.keys(): print(f, "tensor names differ"); bad += 1; continue
    plant = float(__import__("os").environ.get("MT_CHECK_PLANT", "0"))  # A moved by this many bounds
    A = {k: A[k] * (1 + plant * tb.get(k, 0)) for k in A}
    rel = {k: float(np.linalg.norm(A[k].astype(np.float64) - B[k]) / max(np.linalg.norm(B[k].astype(np.float64)), 1e-30))
           for k in A}
    ratio = max((rel[k] / tb[k] if tb.get(k, 0) > 0 else (0.0 if rel[k] == 0 else np.inf)) for k in A)
    print(f"{f}: {len(A)} tensors, worst relative error {max(rel.values()):.2e}, worst ratio to its derived bound "
          f"{ratio:.3g} (bounds {min(tb.get(k, 0) for k in A):.1e} to {max(tb.get(k, 0) for k in A):.1e})")
    if ratio > 1: bad += 1
sys.exit(1 if bad else 0)
PY
}
check par ici_data_parallelism=2 ici_tensor_parallelism=2 shard_optimizer_over_data=true per_device_batch_size=2
check fsdp ici_fsdp_parallelism=2 ici_tensor_parallelism=2 per_device_batch_size=2
check dpfsdp ici_data_parallelism=2 ici_fsdp_parallelism=2 per_device_batch_size=1
check cpfsdp ici_context_parallelism=2 ici_fsdp_parallelism=2 per_device_batch_size=2

# Cross-layout load: a multi-rank run's step_2 parameters into a single process and
# into a cp2 run (2 ranks), one step at learning_rate 0 (AdamW then moves nothing).
xload() {
local from=$1
src="$tmp/out/$from/checkpoints/step_2"
"$bin" train "$tmp/cfg/run.yml" run_name=x_single_$from per_device_batch_size=4 steps=1 \
    learning_rate=0 load_parameters_path="$src" > "$tmp/x_single_$from.log" 2>&1 ||
    fail "load into single process: $(tail -3 "$tmp/x_single_$from.log")"
mpirun --oversubscribe -np 2 "$bin" train "$tmp/cfg/run.yml" run_name=x_cp2_$from per_device_batch_size=4 \
    steps=1 learning_rate=0 ici_context_parallelism=2 load_parameters_path="$src" \
    > "$tmp/x_cp2_$from.log" 2>&1 || fail "load into cp2: $(tail -3 "$tmp/x_cp2_$from.log")"
echo "== cross-layout load of $src"
mt_fp32_bounds "xb_$from" 3 per_device_batch_size=4 learning_rate=0 load_parameters_path="$src" backend=cpu
$py - "$tmp/out" "$src" "$from" "$tmp/xb_$from.bounds" <<'PY' || fail "cross-layout load comparison ($from)"
import json, sys
out, src, frm = sys.argv[1], sys.argv[2], sys.argv[3]
bound = float(open(sys.argv[4]).readline().split()[1])
def loss(run):
    return [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl") if '"loss"' in l][0]["loss"]
a, b = loss("x_single_" + frm), loss("x_cp2_" + frm)
e = abs(a - b) / abs(a)
print(f"first loss: single {a:.9f} cp2 {b:.9f} rel {e:.1e} (bound {bound:.1e})")
bad = e > bound
def blob(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little"); hdr = json.loads(f.read(n)); data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if k != "__metadata__"}
ref = blob(f"{src}/model.safetensors")
for run in ("x_single_" + frm, "x_cp2_" + frm):
    got = blob(f"{out}/{run}/checkpoints/step_1/model.safetensors")
    same = got.keys() == ref.keys() and all(got[k] == ref[k] for k in ref)
    print(f"{run}: parameters {'bitwise equal to' if same else 'DIFFER from'} the loaded checkpoint")
    bad |= not same
sys.exit(1 if bad else 0)
PY
}
xload par
xload dpfsdp

mt_finish "parallel checkpoints and resume agree"
