#!/bin/bash
# tests/test_hf_parity.sh BUILD_DIR: meshtrain against Hugging Face transformers' own
# modelling code (LlamaForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
# Gemma3ForCausalLM, Gemma3ForConditionalGeneration), pinned in
# scripts/setup-hf-venv.sh: transformers 4.57.6 on torch 2.5.1 (CPU, float32, eager
# attention); and Gemma4ForCausalLM in transformers 5.17 (scripts/setup-hf5-overlay.sh,
# first on PYTHONPATH over the same torch; the gemma4 families are skipped with a
# message when the overlay is missing).
#
# For each tiny random family config (llama3 with GQA and llama3 RoPE scaling; gemma
# with MQA and head_dim 256; gemma2 with GQA, a sliding window 4 < T = 13 and small
# soft-caps; gemma3 with GQA, head_dim 256, window 5 < T, QK-norm, local/global RoPE;
# gemma3mm, the same text model inside a Gemma3ForConditionalGeneration with a tiny
# vision tower (config.json "gemma3" with text_config; meshtrain loads the text
# weights only); gemma4 with KV sharing, per-layer inputs, head_dim 16 / 32 with
# proportional RoPE, window 5 < T, double-wide MLPs and random layer_scalars;
# gemma4mm, that text model inside a Gemma4ForConditionalGeneration with tiny vision
# and audio towers (model.language_model.* names, towers skipped) and, as the published
# files have them, k/v tensors for the sharing layers (ignored);
# vocabularies 67 / 61 / 53 / 59 / 71, which the 3 loss tiles do not divide):
#   1. transformers makes the model and saves it with save_pretrained (safetensors);
#   2. meshtrain (tests/tools/hf_parity) reads config.json + model.safetensors and
#      computes logits, loss and every parameter gradient: compared to transformers'
#      within the derived fp32 bounds of tests/reference/hf_parity.py (2 lambda sqrt(S) u
#      kappa per quantity, the condition evaluated on a float64 copy; were 1e-4 and 1e-3);
#   3. the checkpoint meshtrain saves holds bitwise the values it loaded; transformers'
#      sharded save (model.safetensors.index.json) loads to the same values, and its
#      bfloat16 and float16 saves load to bitwise their float32 values (torch's casts);
#   4. round trip: meshtrain saves the model (mt_checkpoint_save_model), transformers
#      loads it with no missing / unexpected / mismatched keys and saves it again, and
#      meshtrain reads that back: the same config and bitwise the same parameters.
# Exit 0 when all pass, 1 on any failure, 77 (skipped) when the environment from
# scripts/setup-hf-venv.sh is missing (MT_HF_VENV overrides its path, default .venv-hf).
set -u
BUILD=${1:?usage: test_hf_parity.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MT_HF_VENV:-$SRC/.venv-hf}
PY="$VENV/bin/python"
TOOL="$BUILD/tests/tools/hf_parity"
REF="$SRC/tests/reference/hf_parity.py"

if [ ! -x "$PY" ] || ! "$PY" -c "import torch, transformers, safetensors" >/dev/null 2>&1; then
    echo "skip: no transformers environment at $VENV (run scripts/setup-hf-venv.sh)"
    exit 77
fi
if [ ! -x "$TOOL" ]; then
    echo "FAIL: $TOOL not built"
    exit 1
fi
WORK=$(mktemp -d /tmp/mt_hf_parity.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore

FAMS4=${MT_HF_FAMILIES:-llama3 gemma gemma2 gemma3 gemma3mm} # transformers 4.57.6
FAMS5=${MT_HF5_FAMILIES:-gemma4 gemma4mm}                    # transformers 5.17 (the overlay)
OVERLAY=${MT_HF5_OVERLAY:-$SRC/.venv-hf5-overlay}
if [ -n "$FAMS5" ] && ! PYTHONPATH="$OVERLAY" "$PY" -c "from transformers import Gemma4ForCausalLM" >/dev/null 2>&1; then
    echo "skip $FAMS5: no transformers 5 overlay at $OVERLAY (run scripts/setup-hf5-overlay.sh)"
    FAMS5=""
fi
FAMS="$FAMS4 $FAMS5"
py4() { "$PY" "$@"; }
py5() { PYTHONPATH="$OVERLAY${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$@"; }
args=""
for grp in 4 5; do
    fams=$FAMS4
    [ $grp = 5 ] && fams=$FAMS5
    [ -n "${fams// /}" ] || continue
    # shellcheck disable=SC2086  # fams is a list of words
    if ! args=$(py$grp "$REF" make "$WORK" $fams); then
        echo "FAIL: transformers could not make the models $fams"
        exit 1
    fi
done
status=0
for fam in $FAMS; do
    # shellcheck disable=SC2086  # args is "B T TILES"
    if ! "$TOOL" run "$WORK/$fam/hf" "$WORK/$fam/mt" $args; then
        echo "FAIL $fam: meshtrain could not load or run the transformers checkpoint"
        status=1
    fi
done
# Compare, and let transformers load meshtrain's checkpoints and save them again.
# shellcheck disable=SC2086
[ -z "${FAMS4// /}" ] || py4 "$REF" check "$WORK" $FAMS4 || status=1
# shellcheck disable=SC2086
[ -z "$FAMS5" ] || py5 "$REF" check "$WORK" $FAMS5 || status=1
for fam in $FAMS; do
    [ -f "$WORK/$fam/mt/ckpt/model.safetensors" ] || continue
    if ! "$TOOL" same "$WORK/$fam/hf" "$WORK/$fam/mt/ckpt" >/dev/null; then
        "$TOOL" same "$WORK/$fam/hf" "$WORK/$fam/mt/ckpt"
        echo "FAIL $fam: meshtrain's checkpoint does not hold the values it loaded"
        status=1
    fi
    # transformers' sharded layout, and its bf16 / f16 files against their float32 values.
    [ -f "$WORK/$fam/hf_sharded/model.safetensors.index.json" ] ||
        { echo "FAIL $fam: transformers did not shard the model (raise the test's model size?)"; status=1; }
    for pair in hf:hf_sharded hf_bf16:hf_bf16_f32 hf_f16:hf_f16_f32; do
        if ! "$TOOL" same "$WORK/$fam/${pair%%:*}" "$WORK/$fam/${pair##*:}" >/dev/null; then
            "$TOOL" same "$WORK/$fam/${pair%%:*}" "$WORK/$fam/${pair##*:}"
            echo "FAIL $fam: meshtrain loads ${pair%%:*} and ${pair##*:} differently"
            status=1
        fi
    done
    [ -f "$WORK/$fam/rt/model.safetensors" ] || continue
    if "$TOOL" same "$WORK/$fam/mt/ckpt" "$WORK/$fam/rt" >/dev/null; then
        echo "ok   $fam: round trip meshtrain -> transformers -> meshtrain bitwise identical"
    else
        "$TOOL" same "$WORK/$fam/mt/ckpt" "$WORK/$fam/rt"
        echo "FAIL $fam: round trip changed the model"
        status=1
    fi
done
exit $status
