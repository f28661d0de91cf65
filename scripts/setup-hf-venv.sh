#!/usr/bin/env bash
# scripts/setup-hf-venv.sh [VENV_DIR]: create the Python environment that the Hugging
# Face parity test (tests/test_hf_parity.sh) runs transformers in, and that
# `meshtrain prepare` (scripts/prepare_data.py: tokenizers, pyarrow for Parquet,
# Debian's python3-sentencepiece through --system-site-packages) runs in. Default
# .venv-hf at the repository root. Idempotent: an environment that already has the pinned
# versions is left alone (a stamp file records them).
#
# Why a PyPI torch: transformers with Gemma 3 (>= 4.50) imports torch.distributed.tensor
# and other torch 2 APIs, so Debian's python3-torch 1.13 cannot run it. PyPI's Linux
# x86_64 torch wheel is the CUDA build and pulls the nvidia-* runtime wheels: about
# 3.5 GB downloaded, 5.3 GB installed, ~4 minutes here on a fresh cache (it runs on
# the CPU all the same). Debian's numpy is reused (--system-site-packages).
#
# Pinned: torch 2.5.1, transformers 4.57.6 (supports llama, gemma, gemma2, gemma3 and
# writes safetensors by default), safetensors 0.8.0, tokenizers 0.22.2,
# huggingface_hub 0.36.2; for prepare, pyarrow 21.0.0 (EXTRA_PINS: an environment
# made before it was added gets it by one pip install, torch is not reinstalled).
# Exit 0 when the environment is ready, non-zero otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-$ROOT/.venv-hf}
PY=/usr/bin/python3
PINS="torch==2.5.1 transformers==4.57.6 safetensors==0.8.0 tokenizers==0.22.2 huggingface_hub==0.36.2"
EXTRA_PINS="pyarrow==21.0.0"
STAMP="$VENV/.meshtrain-pins"

check_prepare() { # the packages scripts/prepare_data.py imports
    "$VENV/bin/python" -c "import tokenizers, pyarrow.parquet, sentencepiece" || {
        echo "setup-hf-venv: $VENV cannot import tokenizers, pyarrow and sentencepiece (sentencepiece: apt-get" \
             "install python3-sentencepiece, scripts/install-deps.sh)" >&2
        exit 1
    }
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS $EXTRA_PINS" ] && [ -x "$VENV/bin/python" ]; then
    echo "setup-hf-venv: $VENV is ready ($PINS $EXTRA_PINS)"
    exit 0
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && [ -x "$VENV/bin/python" ]; then
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q $EXTRA_PINS
    check_prepare
    echo "$PINS $EXTRA_PINS" > "$STAMP"
    echo "setup-hf-venv: $VENV is ready (added $EXTRA_PINS)"
    exit 0
fi
if [ ! -x "$PY" ]; then
    echo "setup-hf-venv: $PY not found (Debian's python3 with python3-venv is needed)" >&2
    exit 1
fi
if ! "$PY" -c "import numpy" >/dev/null 2>&1; then
    echo "setup-hf-venv: $PY cannot import numpy (apt-get install python3-numpy)" >&2
    exit 1
fi
rm -rf "$VENV"
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q $PINS $EXTRA_PINS
"$VENV/bin/python" - <<'PY'
import torch, transformers, safetensors
from transformers import LlamaForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM  # noqa: F401
print("setup-hf-venv: torch", torch.__version__, "transformers", transformers.__version__,
      "safetensors", safetensors.__version__)
PY
check_prepare
echo "$PINS $EXTRA_PINS" > "$STAMP"
