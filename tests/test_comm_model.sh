#!/usr/bin/env bash
# tests/test_comm_model.sh BUILD_DIR: bench/comm_model.py (the byte and FLOP model behind
# docs/multi_gpu.md) against the trainer (label cpu).
#
# `comm_model.py --estimate BIN` runs `meshtrain estimate` with each case's layout, batch
# and policy fixed and compares its collective bytes (rank 0's, by the trainer's own
# formula: train/trainer.h mt_trainer_plan_ex) to the byte and its FLOPs (the trainer's
# mfu formula plus the recompute) within 1e-6 against the script's own restatement of
# those formulas; it exits 1 on any difference. Until this test the check ran by hand
# only, and it had been failing for the fsdp cases since the vocabulary came in chunks
# (the chunked loss gathers lm_head three times; the script counted once). The measured
# route, `--check`, runs under mpirun and stays a manual check (docs/multi_gpu.md).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_comm_model.sh "${1:-}"
mt_need_python3
failures=0
out="$(python3 "$src/bench/comm_model.py" --estimate "$bin" 2>&1)" || fail "comm_model.py --estimate: $out"
echo "$out"
grep -q "^| (b) fsdp 8 |" <<< "$out" || fail "comm_model.py --estimate printed no fsdp case"
mt_finish "bench/comm_model.py agrees with the trainer's bytes and FLOPs"
