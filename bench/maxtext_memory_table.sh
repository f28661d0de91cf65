#!/usr/bin/env bash
# bench/maxtext_memory_table.sh [MESHTRAIN]: the per-device memory table MaxText measured
# for its grad_dtype change, next to `meshtrain plan` of the same job (issue 19).
#
# MaxText's figures (peak HBM per device, MiB; a 4-layer model, d_model 512, 8 heads of 64,
# MLP 2048, vocabulary 32000, sequence 512, compiled for v5e-8 with MaxText's default mesh
# there, fsdp 8; weights float32, activations bfloat16) are the seed's, quoted in the
# issue; nothing here reruns MaxText. meshtrain plans one rank of the same mesh
# (num_devices=8 ici_fsdp_parallelism=8) with dtype=bfloat16 weight_dtype=float32,
# MaxText's default remat_policy (full: MaxText's configs/base.yml; the seed's runs set no
# other), num_vocab_tiling and num_vocab_chunks auto (their defaults) and each row's
# per_device_batch_size / gradient_accumulation_steps / grad_dtype: the trainer's own
# plan, which the arena equals to the byte (tests/test_plan_remat.c). Each row twice: with
# meshtrain's defaults, and with its two memory keys that trade fsdp bytes for memory
# (LEAN: param_window_unit=weight, parameter windows of a weight instead of a layer, and
# grad_window_chunks=4, a weight's gradient handed to the reduce-scatter in 4 row blocks;
# docs/memory.md).
# Prints a markdown table: the row, MaxText MiB, meshtrain MiB and meshtrain / MaxText
# with the defaults, then with LEAN, and the LEAN plan's largest categories at the peak.
# Exit 0 when every plan ran.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build/meshtrain}"
[ -x "$bin" ] || { echo "no $bin: build it first (make build)"; exit 1; }
cd "$root" || exit 1
model="dataset_path=/none model_name=llama2-7b base_emb_dim=512 base_num_query_heads=8 base_num_kv_heads=8
  head_dim=64 base_mlp_dim=2048 base_num_decoder_layers=4 vocab_size=32000 max_target_length=512"
mesh="num_devices=8 ici_fsdp_parallelism=8 dtype=bfloat16 weight_dtype=float32 remat_policy=full"
lean="param_window_unit=weight grad_window_chunks=4"
echo "| row | MaxText MiB | meshtrain MiB | / MaxText | meshtrain lean MiB | / MaxText | lean at its peak (MiB) |"
echo "|---|---:|---:|---:|---:|---:|---|"
rc=0
while read -r name maxtext args; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086
    if ! json="$("$bin" plan configs/base.yml $model $mesh $args --json 2> /tmp/mt_table.err)" ||
       ! jlean="$("$bin" plan configs/base.yml $model $mesh $args $lean --json 2> /tmp/mt_table.err)"; then
        echo "| $name | $maxtext | plan failed: $(tail -1 /tmp/mt_table.err) | | | | |"
        rc=1
        continue
    fi
    python3 - "$name" "$maxtext" "$json" "$jlean" <<'PY'
import json, sys
name, maxtext, p, q = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
mib, lean = p["peak_bytes"] / 2**20, q["peak_bytes"] / 2**20
live = q["per_device_live_at_peak"]
parts = ", ".join("%s %.1f" % (k, v / 2**20) for k, v in sorted(live.items(), key=lambda kv: -kv[1])[:4] if v)
print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |" % (name, maxtext, mib, mib / maxtext, lean, lean / maxtext, parts))
PY
done <<'ROWS'
ga=1_pdbs=4 361.28 per_device_batch_size=4 gradient_accumulation_steps=1
ga=4_pdbs=1 148.71 per_device_batch_size=1 gradient_accumulation_steps=4
ga=1_pdbs=1 113.82 per_device_batch_size=1 gradient_accumulation_steps=1
ga=2_pdbs=1 165.88 per_device_batch_size=1 gradient_accumulation_steps=2
ga=2_pdbs=1_bf16_accumulator 148.63 per_device_batch_size=1 gradient_accumulation_steps=2 grad_dtype=bfloat16
ROWS
exit $rc
