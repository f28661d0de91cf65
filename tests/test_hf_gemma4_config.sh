#!/usr/bin/env bash
# tests/test_hf_gemma4_config.sh BUILD_DIR: transformers reads the Gemma 4 config.json
# files meshtrain writes as the models they were written from (issue 18). Every
# tests/fuzz_corpus/hf_config/gemma4_*.json (written by transformers 5.5.4 and 5.17.0)
# is read and written back by tests/tools/hf_config_check --keep; then
# tests/reference/hf_gemma4_config.py, in transformers 5.17 (scripts/setup-hf5-overlay.sh),
# builds Gemma4ForCausalLM from the original and from meshtrain's file and requires the
# same parameter names and shapes, layer types, head dims, MLP widths, KV sharing,
# RoPE frequencies and scales. Exit 77 (skipped) without the overlay.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
mt_build "$0" "${1:-}" tests/tools/hf_config_check
mt_need_hf5
mt_tmp
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
seeds=("$src"/tests/fuzz_corpus/hf_config/gemma4_*.json)
[ -f "${seeds[0]}" ] || { echo "FAIL: no gemma4 seeds"; exit 1; }
"$bin" --keep "$tmp" "${seeds[@]}" | sed "s|$src/||" || fail "meshtrain refused or changed a gemma4 config.json"
pairs=()
for s in "${seeds[@]}"; do pairs+=("$s" "$tmp/$(basename "$s")"); done
"$py" "$src/tests/reference/hf_gemma4_config.py" "${pairs[@]}" | sed "s|$tmp/||" ||
    fail "transformers reads meshtrain's gemma4 config.json as another model"
mt_finish "transformers reads meshtrain's Gemma 4 config.json files as the original models"
