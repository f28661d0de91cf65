#!/usr/bin/env bash
# scripts/setup-hf5-overlay.sh [VENV_DIR [OVERLAY_DIR]]: a transformers 5.x that has
# Gemma 4 (models/gemma4), for the Gemma 4 parity tests, without a second torch.
#
# The environment of scripts/setup-hf-venv.sh (VENV_DIR, default .venv-hf) keeps
# transformers 4.57.6 for the llama / gemma 1-3 parity tests. This script installs
# transformers 5.17.0 and the newer packages it needs with `pip install --target` into
# OVERLAY_DIR (default .venv-hf5-overlay at the repository root); a test puts that
# directory first on PYTHONPATH and runs VENV_DIR's python, so the overlay's
# transformers runs on the venv's torch 2.5.1 and numpy (neither is in the overlay).
#
# Why 5.17.0: Gemma 4 first ships in transformers 5.5.0; 5.18.0 and later call
# torch.accelerator (torch >= 2.6) on import and 5.20.0 and later require torch >= 2.6,
# so 5.17.0 is the newest release that runs on the pinned torch 2.5.1 (checked: 5.5.4
# and 5.17.0 import and run a Gemma4ForCausalLM forward/backward here, 5.19.0 fails on
# torch.accelerator). It is also the version on the project's GPU machine.
#
# The pins below are pip's resolution of transformers==5.17.0 on 2026-12-01, less
# numpy (the venv's 1.24.2 is kept: scipy and torch 2.5.1 there are built for it);
# they are installed with --no-deps so that the overlay is exactly this list.
# Idempotent: an overlay whose stamp records these pins is left alone. Exit 0 when the
# overlay imports Gemma4ForCausalLM, non-zero otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-$ROOT/.venv-hf}
OVERLAY=${2:-$ROOT/.venv-hf5-overlay}
PINS5="transformers==5.17.0 huggingface_hub==1.33.0 tokenizers==0.23.3 safetensors==0.8.0
annotated_doc==0.0.7 annotated_types==0.8.0 anyio==4.16.0 certifi==2026.10.19.post1 click==8.5.1
filelock==4.3.1 fsspec==2026.9.0 h11==0.16.0 hf_xet==1.8.0 httpcore==1.0.9 httpx==0.28.1
idna==3.20 markdown_it_py==4.3.0 mdurl==0.1.2 packaging==26.4 pydantic==2.14.4
pydantic_core==2.50.5 pygments==2.21.0 pyyaml==6.0.4 regex==2026.11.19 rich==15.0.0
shellingham==1.5.4 tqdm==4.70.1 typer==0.29.2 typing_extensions==4.16.0 typing_inspection==0.4.5"
PINS5=$(echo $PINS5) # one line
STAMP="$OVERLAY/.meshtrain-pins"

check() {
    PYTHONPATH="$OVERLAY" "$VENV/bin/python" - <<'PY'
import numpy, torch, transformers
from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration  # noqa: F401
import transformers.models.gemma4.modeling_gemma4  # noqa: F401  (the lazy import above defers errors)
assert transformers.__version__.startswith("5."), transformers.__version__
print("setup-hf5-overlay: transformers", transformers.__version__, "on torch", torch.__version__,
      "numpy", numpy.__version__)
PY
}

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup-hf5-overlay: no environment at $VENV (run scripts/setup-hf-venv.sh first)" >&2
    exit 1
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS5" ]; then
    check >/dev/null && { echo "setup-hf5-overlay: $OVERLAY is ready ($(echo "$PINS5" | cut -d' ' -f1))"; exit 0; }
fi
rm -rf "$OVERLAY"
# shellcheck disable=SC2086  # PINS5 is a list of words
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps --target "$OVERLAY" $PINS5
check
echo "$PINS5" > "$STAMP"
