#!/usr/bin/env bash
# tests/test_mpi_api.sh BUILD_DIR: the public API under mpirun with the caller's own
# MPI communicator (tests/tools/api_mpi.c calls MPI_Init, splits a communicator and
# passes it to mt_distributed_init). A dp2 session (2 ranks x batch 2) must print the
# losses of one process with batch 4 on the same data to 1e-5 relative (the same fp32
# sums in another order), and the program must end cleanly with the caller's
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
/usr/bin/python3 - "$tmp/one.txt" "$tmp/two.txt" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
assert len(a) == 3 and len(b) == 3, "expected 3 steps from each run"
assert all(x[5] == "1" for x in a) and all(x[5] == "2" for x in b), "world sizes"
worst = max(abs(float(x[3]) - float(y[3])) / abs(float(x[3])) for x, y in zip(a, b))
print(f"worst relative loss difference {worst:.1e} (bound 1e-5)")
sys.exit(0 if worst <= 1e-5 else 1)
PY
