#!/usr/bin/env bash
# The extended reproduction (docs/reproduction-extended): every variant the claims table
# names, the learning-rate stability study in a regime where the baseline can become
# unstable, and HyGA's low-rank width sweep, folded into one report; then the real-model
# study with every arm (its own report in $OUT/pretrained) and its arms at W 64
# ($OUT/pretrained-w64). Sets up .venv if
# needed. OUT (default runs/reproduction-extended) holds one directory per part; a second
# call reuses finished runs. STEPS fixes the training steps of the variant and rank runs
# (default: what the default `gatedattn reproduce` fitted on the machine that made the
# committed report); SEEDS the seeds of each variant (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
OUT=${OUT:-runs/reproduction-extended}
STEPS=${STEPS:-270}
SEEDS=${SEEDS:-2}
# 1. stability: 12 layers at d_model 128, no q/k norm, learning rates from 0.03 to 0.8 (first spike, first divergence)
gatedattn reproduce --study lr --preset tiny --set train.model.n_layers=12 --set train.model.attention.qk_norm=false \
    --seq-len 128 --batch-size 8 --steps 300 --lrs 0.03,0.1,0.2,0.4,0.8 --out "$OUT/lr" "$@"
# 2. HyGA's low-rank inner width against gate cost, next to the full-rank G1 gate
gatedattn reproduce --study rank --ranks 8,16,32,64 --seeds 1 --steps "$STEPS" --out "$OUT/rank" "$@"
# 3. every variant, with the two studies above folded into its claims table (natural text: --with-text)
gatedattn reproduce --with-text --variants baseline,gated,gated-headwise,hyga-lowrank,hyga-sink,sink --seeds "$SEEDS" \
    --steps "$STEPS" --no-mechanism --no-pretrained --fold "$OUT/lr" --fold "$OUT/rank" --out "$OUT/main" "$@"
# 4. the real-model study with every arm: the sink from 0 beside the measured start, the sink with a bias (the first
#    token's mass and value apart), the elementwise gate beside the headwise one
gatedattn reproduce --study pretrained --set arms=sink,sink-zero,sink-bias,gate-headwise,gate,control \
    --out "$OUT/pretrained" "$@"
# 5. the arms at W 64, where dropping the first token costs more than twice what it costs at the default's W 128
gatedattn reproduce --study pretrained --set window=64 --set arms=sink,sink-bias,gate-headwise,control \
    --out "$OUT/pretrained-w64" "$@"
