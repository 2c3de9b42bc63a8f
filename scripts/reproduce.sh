#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the mechanism study (Bigram-Backcopy) and
# the real-model study (the bundled SmolLM2-135M) and write one report
# (runs/reproduce/report.md). Extra arguments go to `gatedattn reproduce` (e.g. --quick,
# --with-text for the natural-text part, --set pretrained.arms=sink,sink-bias,control).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
gatedattn reproduce "$@"
