#!/usr/bin/env bash
# tests/test_cli_plan_bf16.sh BUILD_DIR: `meshtrain plan` of llama3.1-8b on one device at
# dtype=bfloat16 against a hand formula, category by category, and against the same plan
# at dtype=float32 (label cpu).
#
# The formula (models/model.h mt_model_layout dtype; docs/memory.md), P parameters, L layers,
# N = batch x seq rows, D d_model, QD = H x Dh, KVD = Hkv x Dh, F mlp_dim, V vocabulary,
# e = 2 bytes (bf16) or 4 (fp32), remat_policy minimal_with_context (every named tensor
# but mlpwo kept; llama has no post-MLP norm):
#   parameters    4P (fp32 master) + e P (compute copy, only when e = 2)
#   gradients     4P (fp32, one device: the full gradient)
#   optimizer     8P (AdamW m and v, fp32) + 24 (9L + 3) (the AdamW segment table: 24
#                 bytes per parameter tensor, train/optimizer.h)
#   saved, per layer: decoder_layer_input N D e, query_proj N QD e, key_proj and
#     value_proj N KVD e, context N QD e + B H T 4 (its logsumexp, fp32), out_proj N D e,
#     mlpwi_0 and mlpwi_1 N F e
#   loss tile     R V 4 (fp32 logits of a tile of R rows) + R V e (bf16 dlogits, only when
#                 e = 2): num_vocab_tiling=auto (models/model.h) takes the fewest tiles
#                 whose tile is no larger than one layer's parameters in the activation
#                 dtype, R = min(N, floor(layer e / (V (4 + e or 4)))) rows (the buffer; each
#                 of the T = ceil(N / R) tiles has at most R); one process without windows
#                 keeps the vocabulary whole (num_vocab_chunks 1)
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_plan_bf16.sh "${1:-}"
mt_need_python3
mt_tmp
args=(plan "$src/configs/base.yml" "dataset_path=$tmp/no/such/dir" model_name=llama3.1-8b max_target_length=2048
      per_device_batch_size=8 num_devices=1 remat_policy=minimal_with_context --json)
"$bin" "${args[@]}" dtype=bfloat16 > "$tmp/bf16.json" 2> "$tmp/err" || fail "plan bf16: $(cat "$tmp/err")"
"$bin" "${args[@]}" dtype=float32 > "$tmp/f32.json" 2> "$tmp/err" || fail "plan f32: $(cat "$tmp/err")"
python3 - "$tmp/bf16.json" "$tmp/f32.json" <<'PY' || fail "the bf16 plan differs from the hand formula"
import json, sys
P, L, B, T = 8030261248, 32, 8, 2048          # llama3.1-8b (configs/models/llama3.1-8b.yml)
D, H, Hkv, Dh, F, V = 4096, 32, 8, 128, 14336, 128256
N, QD, KVD = B * T, H * Dh, Hkv * Dh
layer = D * QD + 2 * D * KVD + QD * D + 3 * D * F + 2 * D
for path, e in ((sys.argv[1], 2), (sys.argv[2], 4)):
    p = json.load(open(path))
    assert p["dtype"] == ("bfloat16" if e == 2 else "float32"), p["dtype"]
    assert p["num_params"] == P, p["num_params"]
    row = V * (4 + (e if e == 2 else 0))
    R = min(N, max(1, layer * e // row))
    tiles = -(-N // R)
    assert (p["num_vocab_tiling"], p["num_vocab_chunks"]) == (tiles, 1), (p["num_vocab_tiling"], tiles)
    want = {
        "parameters": 4 * P + (e * P if e == 2 else 0),
        "gradients_and_accumulators": 4 * P,
        "optimizer": 8 * P + 24 * (9 * L + 3),
        "loss_tile": R * row,
    }
    saved = {
        "decoder_layer_input": N * D * e, "query_proj": N * QD * e, "key_proj": N * KVD * e,
        "value_proj": N * KVD * e, "context": N * QD * e + B * H * T * 4, "out_proj": N * D * e,
        "mlpwi_0": N * F * e, "mlpwi_1": N * F * e, "mlpwo": 0,
    }
    for k, v in want.items():
        assert p["per_device"][k] == v, (path, k, p["per_device"][k], v)
    for k, v in saved.items():
        assert p["saved"][k] == L * v, (path, k, p["saved"][k], L * v)
    print("%s: parameters %.2f GiB, saved %.2f GiB, peak %.2f GiB" % (
        p["dtype"], p["per_device"]["parameters"] / 2**30, p["per_device"]["saved_activations"] / 2**30,
        p["peak_bytes"] / 2**30))
PY
mt_finish "llama3.1-8b plan at bfloat16 and float32 equals the hand formula"
