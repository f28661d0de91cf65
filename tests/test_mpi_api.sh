#!/usr/bin/env bash
# tests/test_mpi_api.sh BUILD_DIR: the public API under mpirun with the caller's own
# MPI communicator (tests/tools/api_mpi.c calls MPI_Init, splits a communicator and
# passes it to mt_distributed_init). A dp2 session (2 ranks x batch 2) must print the
# losses of one process with batch 4 on the same data within each step's derived fp32
# bound (the same fp32 sums in another order; tests/lib.sh mt_fp32_bounds; was 1e-5),
# and the program must end cleanly with the caller's
# MPI_Finalize (the library installs no exit handler of its own in this mode).
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_mpi_api.sh BUILD_DIR}"
mt_need_tools api_mpi mpi_layout
tool=${tools[0]} layout=${tools[1]}
mt_need_mpirun
mt_mpi_env
mt_tmp
mkdir -p "$tmp/cfg/models"
mt_tiny_model "$tmp/cfg/models/tinyl.yml" llama
"$layout" data "$tmp/data" || exit 1
cat > "$tmp/cfg/run.yml" <<YML
model_name: tinyl
dataset_path: $tmp/data
base_output_directory: $tmp/out
max_target_length: 16
steps: 3
learning_rate: 0.001
warmup_steps_fraction: 0
eval_interval: 0
checkpoint_period: 0
backend: cpu
seed: 3
YML
"$tool" "$tmp/cfg/run.yml" run_name=one per_device_batch_size=4 > "$tmp/one.txt" 2> "$tmp/one.err" ||
    { echo "FAIL: single process: $(cat "$tmp/one.err")"; exit 1; }
timeout 120 mpirun --oversubscribe -np 2 "$tool" "$tmp/cfg/run.yml" run_name=two per_device_batch_size=2 \
    ici_data_parallelism=2 > "$tmp/two.txt" 2> "$tmp/two.err" ||
    { echo "FAIL: mpirun -np 2: $(tail -5 "$tmp/two.err")"; exit 1; }
cat "$tmp/one.txt" "$tmp/two.txt"
cfg="$tmp/cfg/run.yml" layout_tool=$layout failures=0
mt_fp32_bounds bref 3 per_device_batch_size=4 || exit 1
/usr/bin/python3 - "$tmp/one.txt" "$tmp/two.txt" "$tmp/bref.bounds" <<'PY'
import os, sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
bound = [float(l.split()[1]) for l in open(sys.argv[3])]
assert len(a) == 3 and len(b) == 3, "expected 3 steps from each run"
assert all(x[5] == "1" for x in a) and all(x[5] == "2" for x in b), "world sizes"
plant = float(os.environ.get("MT_CHECK_PLANT", "0"))  # moves b by this many bounds
ratio = max(abs(float(x[3]) * (1 + plant * e) - float(y[3])) / abs(float(x[3])) / e for x, y, e in zip(a, b, bound))
print(f"worst ratio of the relative loss difference to its derived bound {ratio:.3g} (bounds "
      + " ".join(f"{e:.1e}" for e in bound) + ")")
sys.exit(0 if ratio <= 1 else 1)
PY
