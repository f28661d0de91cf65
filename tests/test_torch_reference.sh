#!/bin/bash
# tests/test_torch_reference.sh BUILD_DIR: compare the C decoder (logits, loss, every
# parameter gradient, 5 AdamW losses) against the independent float64 PyTorch
# implementation tests/reference/torch_decoder.py, for tiny llama3 / gemma / gemma2 /
# gemma3 models, each held to a bound derived for its fp32 side (tests/reference/
# bounds.py: lambda sqrt(S) u kappa, the condition kappa evaluated in float64 by the
# script; MT_REF_PLANT=4 moves every C value by 4 bounds and fails every check). Exit 0
# when all match, 1 on any mismatch or failure, 77 (skipped) when Debian's
# /usr/bin/python3 cannot import torch.
set -u
BUILD=${1:?usage: test_torch_reference.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
TOOL="$BUILD/tests/tools/model_dump"

if ! "$PY" -c "import torch, numpy" >/dev/null 2>&1; then
    echo "skip: $PY cannot import torch and numpy"
    exit 77
fi
if [ ! -x "$TOOL" ]; then
    echo "FAIL: $TOOL not built"
    exit 1
fi
WORK=$(mktemp -d /tmp/mt_torch_ref.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

status=0
for preset in ${MT_REF_PRESETS:-llama3 gemma gemma2 gemma3}; do
    if ! OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$TOOL" "$preset" "$WORK/$preset"; then
        echo "FAIL: model_dump $preset"
        status=1
        continue
    fi
    if ! "$PY" "$SRC/tests/reference/torch_decoder.py" "$WORK/$preset"; then
        status=1
    fi
done
exit $status
