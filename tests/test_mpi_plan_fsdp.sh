#!/usr/bin/env bash
# tests/test_mpi_plan_fsdp.sh BUILD_DIR: `meshtrain plan` of an fsdp layout is what
# `meshtrain train` allocates on rank 0 of that layout under mpirun (the CPU backend).
# For fsdp 2 and fsdp 2 x tensor 2 on a tiny Llama (small enough that the banner's
# "memory plan N KiB" resolves 10 bytes), the plan's peak_bytes, formatted as train's
# banner formats its arena, equals the banner, and the plan says it is the trainer's
# own; so for data 2 x fsdp 2 and context 2 x fsdp 2 (optimizer shards nested in the
# fsdp shards), and data 2 x fsdp 2 with parameter host offload (the shard in the host
# pool: the banner's arena is the device part); and with dtype=bfloat16 (the compute
# copy's shard and bf16 windows, bf16 tensor / context buffers): fsdp 2 x tensor 2 with
# sequence parallelism, context 2 (ring) x fsdp 2, data 2 x fsdp 2 with parameter offload.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_mpi_plan_fsdp.sh "${1:-}"
mt_need_mpirun
mt_sys_python
mt_mpi_env

mt_tmp

mkdir -p "$tmp/cfg/models" "$tmp/data"
mt_tiny_model "$tmp/cfg/models/tinyf.yml" llama
cat > "$tmp/cfg/run.yml" <<YML
model_name: tinyf
base_output_directory: $tmp/out
dataset_path: $tmp/data
per_device_batch_size: 2
max_target_length: 16
steps: 1
eval_interval: 0
backend: cpu
seed: 1
YML
"$py" - "$tmp/data" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, n):
    toks = [1 + (i * 7) % 63 for i in range(n)]
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *toks))
shard(d + "/train_000.bin", 4000)
shard(d + "/val_000.bin", 1000)
PY

# the banner's format (train/main.c human_bytes)
human() { "$py" -c "
b = float($1); u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; i = 0
while b >= 1024.0 and i < 4: b /= 1024.0; i += 1
print(('%.2f %s' if i else '%.0f %s') % (b, u[i]))"; }

cd "$tmp" || exit 1
n=0
for lay in "2:ici_fsdp_parallelism=2" "4:ici_fsdp_parallelism=2 ici_tensor_parallelism=2" \
           "4:ici_fsdp_parallelism=2 ici_tensor_parallelism=2 remat_policy=full" \
           "4:ici_data_parallelism=2 ici_fsdp_parallelism=2" "4:ici_context_parallelism=2 ici_fsdp_parallelism=2" \
           "4:ici_data_parallelism=2 ici_fsdp_parallelism=2 parameter_memory_host_offload=true" \
           "4:ici_fsdp_parallelism=2 ici_tensor_parallelism=2 tensor_sequence_parallelism=true dtype=bfloat16" \
           "4:ici_context_parallelism=2 ici_fsdp_parallelism=2 context_parallel_strategy=ring dtype=bfloat16" \
           "4:ici_data_parallelism=2 ici_fsdp_parallelism=2 parameter_memory_host_offload=true dtype=bfloat16"; do
    np=${lay%%:*}; keys=${lay#*:}; n=$((n + 1))
    "$bin" plan "$tmp/cfg/run.yml" num_devices=$np $keys > plan.$n 2> err || { fail "plan $keys: $(cat err)"; continue; }
    grep -q "exactly what \`train\` allocates" plan.$n || fail "plan $keys: not the trainer's: $(sed -n 2p plan.$n)"
    peak=$("$bin" plan "$tmp/cfg/run.yml" num_devices=$np $keys --json |
           "$py" -c "import json, sys; print(json.load(sys.stdin)['peak_bytes'])")
    want=$(human "$peak")
    mpi "$np" "$bin" train "$tmp/cfg/run.yml" run_name=r$n $keys > train.$n 2>&1 \
        || { fail "train $keys under mpirun -np $np: $(tail -n 5 train.$n)"; continue; }
    got=$(sed -n 's/.*memory plan \(.*\)$/\1/p' train.$n | head -n 1)
    echo "$keys: plan peak $peak bytes = $want; train's arena: $got"
    [ "$got" = "$want" ] || fail "$keys: train allocates '$got', plan says '$want' ($peak bytes)"
done

mt_finish "fsdp plans = train's arena: ok"
