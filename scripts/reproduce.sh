#!/usr/bin/env bash
# The main job: set up .venv if needed, then train baseline and gated models on the
# bundled corpus and write the report (runs/reproduce/report.md). Extra arguments go to
# `gatedattn reproduce` (e.g. --quick, --seeds 3, --variants baseline,gated,hyga-lowrank).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
gatedattn reproduce "$@"
