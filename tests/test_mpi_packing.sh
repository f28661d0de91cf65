#!/usr/bin/env bash
# tests/test_mpi_packing.sh BUILD_DIR: document masking (packing=true, models/model.h
# mt_model_layout packing) under context parallelism equals the single-process run with
# masking on, for both ways the keys reach a rank: all-gathered (default) and passed in
# a ring (context_parallel_strategy=ring). The key segment ids travel with the keys: each
# rank derives every row's id from the whole window it is given and lays them out in the
# order its K/V arrive (gathered, or one ring block at a time). Llama, Gemma 2 and Gemma 4
# (KV sharing, per-layer inputs).
#
# Same bounds as tests/test_mpi_layouts.sh: losses of steps 1..3, mean gradients after
# step 1 and parameters after step 3 within the derived fp32 bounds (mpi_layout compare
# ... derived: the layouts only change the order of fp32 sums; each reference is run
# again perturbed, REF_kappa, for the condition; measured at most 0.01 of the bounds;
# was 1e-5 relative for everything). The windows are 32 tokens of
# mpi_layout's synthetic shards (token t appears about once in 13 positions), with
# separator 3: about two documents start inside each window, in any chunk. The packed
# reference must differ from the unpacked one (else masking did nothing and the test
# could not fail).
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_mpi_packing.sh BUILD_DIR}"
mt_need_tools mpi_layout
tool=${tools[0]}
mt_need_mpirun
mt_mpi_env

mt_tmp

mt_tiny_model "$tmp/cfg/models/tinyl.yml" llama
mt_tiny_model "$tmp/cfg/models/tinyg2.yml" gemma2
mt_tiny_model "$tmp/cfg/models/tinyg4.yml" gemma4 5
mt_layout_cfg tinyl
pk="max_target_length=32 packing=true packing_separator_id=3"

ref() {
    local name=$1; shift
    "$tool" run "$tmp/$name" "$cfg" "$@" > "$tmp/$name.log" 2>&1 || fail "reference $name: $(tail -3 "$tmp/$name.log")"
    "$tool" run-kappa "$tmp/${name}_kappa" "$cfg" "$@" > "$tmp/${name}_kappa.log" 2>&1 ||
        fail "reference $name, perturbed: $(tail -3 "$tmp/${name}_kappa.log")"
}
layout() {
    local name=$1 refn=$2 np=$3; shift 3
    if ! mpi "$np" "$tool" run "$tmp/$name" "$cfg" "$@" > "$tmp/$name.log" 2>&1; then
        fail "$name: mpirun failed: $(tail -5 "$tmp/$name.log")"; return
    fi
    if "$tool" compare "$tmp/$refn" "$tmp/$name" derived > "$tmp/$name.cmp" 2>&1; then
        echo "$name == $refn ($(grep "^worst ratio" "$tmp/$name.cmp"))"
    else
        fail "$name vs $refn"; cat "$tmp/$name.cmp"
    fi
}

# shellcheck disable=SC2086 # $pk is a list of key=value words
{
ref packed per_device_batch_size=4 $pk
ref plain per_device_batch_size=4 max_target_length=32
ref packed_g2 model_name=tinyg2 per_device_batch_size=2 num_vocab_tiling=4 $pk
if "$tool" compare "$tmp/plain" "$tmp/packed" derived > "$tmp/plain.cmp" 2>&1; then
    fail "packing=true gives the unpacked run: masking had no effect"
fi
layout cp2 packed 2 per_device_batch_size=4 ici_context_parallelism=2 $pk
layout cp2_ring packed 2 per_device_batch_size=4 ici_context_parallelism=2 context_parallel_strategy=ring $pk
layout cp4_ring_gemma2 packed_g2 4 model_name=tinyg2 per_device_batch_size=2 num_vocab_tiling=4 \
    ici_context_parallelism=4 context_parallel_strategy=ring $pk
layout dp2xcp2 packed 4 per_device_batch_size=2 ici_data_parallelism=2 ici_context_parallelism=2 $pk
# gemma4 (KV sharing: a sharing layer attends to its donor's K/V under the same
# segments; per-layer inputs; window 4 every 2nd layer): all-gather and ring
ref packed_g4 model_name=tinyg4 per_device_batch_size=4 num_vocab_tiling=4 $pk
layout cp2_gemma4 packed_g4 2 model_name=tinyg4 per_device_batch_size=4 num_vocab_tiling=4 ici_context_parallelism=2 $pk
layout cp4_ring_gemma4 packed_g4 4 model_name=tinyg4 per_device_batch_size=4 num_vocab_tiling=4 \
    ici_context_parallelism=4 context_parallel_strategy=ring $pk
}

mt_finish "context parallelism with document masking agrees"
