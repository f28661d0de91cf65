#!/usr/bin/env bash
# tests/test_cli_backend_refusals.sh BUILD_DIR: what the CUDA backend cannot run is
# refused at start-up with exit 2 and a message naming the key (issue 12). The
# refusals are made from the backend's capabilities (kernels/backend.h
# mt_backend_kind_caps) and the config before any device is probed, so they hold on a
# machine without a GPU and in a build without CUDA alike: weight_dtype other than
# float32 (master weights are fp32 on every backend). Keys that run entirely through
# ops (dtype=bfloat16, shard_optimizer_over_data, grad_dtype=bfloat16 with
# accumulation, and since issue 14 parameter_memory_host_offload and
# optimizer_memory_host_offload: the host pool is page-locked memory the kernels reach)
# are not refused for that reason: the run then fails only for want of a device
# (exit 2, "backend=cuda"), or trains where one is visible.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_backend_refusals.sh "${1:-}"
mt_need_python3

mt_tmp
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama 1
mt_shards "$tmp/data" 1 train_000000.bin=3000 val_000000.bin=600
mt_run_yml <<YML
run_name: r
per_device_batch_size: 2
max_target_length: 8
steps: 1
eval_interval: 0
YML

# refused KEY=VALUE...: exit 2, stderr names the first key
refused() {
    local key=${1%%=*}
    "$bin" train "$tmp/cfg/run.yml" backend=cuda "$@" > "$tmp/out.log" 2> "$tmp/err.log"
    local rc=$?
    [ "$rc" -eq 2 ] || fail "backend=cuda $*: exit $rc, want 2 ($(tail -2 "$tmp/err.log"))"
    grep -q "$key" "$tmp/err.log" || fail "backend=cuda $*: message does not name $key: $(cat "$tmp/err.log")"
    [ ! -e "$tmp/out/r/metrics.jsonl" ] || fail "backend=cuda $*: a run started"
}
refused weight_dtype=bfloat16

# allowed through ops: without a device the only complaint is the device itself
allowed() {
    "$bin" train "$tmp/cfg/run.yml" backend=cuda "$@" > "$tmp/out.log" 2> "$tmp/err.log"
    local rc=$?
    [ "$rc" -eq 0 ] && return
    grep -q "shard_optimizer_over_data\|dtype\|host_offload" "$tmp/err.log" &&
        fail "backend=cuda $* refused: $(cat "$tmp/err.log")"
    grep -q "backend=cuda" "$tmp/err.log" || fail "backend=cuda $*: no-device message: $(cat "$tmp/err.log")"
    [ "$rc" -eq 2 ] || fail "backend=cuda $*: no device: exit $rc, want 2"
}
allowed dtype=bfloat16 shard_optimizer_over_data=true grad_dtype=bfloat16 gradient_accumulation_steps=2
allowed parameter_memory_host_offload=true optimizer_memory_host_offload=true

# more than one rank on cuda runs (issue 14); where it cannot bind one GPU per rank it
# stops with exit 2 naming the counts (this machine: no device visible, or fewer
# devices than the 2 ranks), and is not refused for being multi-rank
if command -v mpirun >/dev/null; then
    mt_mpi_env
    mpi 2 "$bin" train "$tmp/cfg/run.yml" backend=cuda ici_data_parallelism=2 per_device_batch_size=1 \
        > "$tmp/out.log" 2> "$tmp/err.log"
    rc=$?
    grep -q "with 2 ranks" "$tmp/err.log" && fail "2 ranks on cuda refused as multi-rank: $(tail -3 "$tmp/err.log")"
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 2 ] || fail "backend=cuda with 2 ranks: exit $rc, want 0 or 2 ($(tail -2 "$tmp/err.log"))"
        grep -q "no CUDA device is visible\|2 ranks run on this node but it has 1 visible CUDA device" "$tmp/err.log" ||
            fail "2 ranks: message: $(tail -3 "$tmp/err.log")"
    fi
fi
mt_finish "test_cli_backend_refusals: ok"
