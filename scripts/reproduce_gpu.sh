#!/usr/bin/env bash
# The GPU scale-up of the main job's natural-text part: the `base` preset (12 layers, d_model 512) on the
# default corpus, baseline vs gated, for as many tokens as MINUTES (default 8) allow, with
# bf16 where the GPU has it and torch.compile. Writes $OUT (default docs/reproduction-gpu).
# Nothing is pip-installed: run it where PyTorch (CUDA) and this package are importable.
#
#   bash scripts/reproduce_gpu.sh                 # on a GPU machine
#   DEVICE=cpu bash scripts/reproduce_gpu.sh --quick --data DIR --out DIR   # the same pipeline, tiny, on a CPU
#
# Extra arguments go to `gatedattn reproduce`. The default corpus holds 4.2 M training
# tokens, so hundreds of millions of tokens are many passes over it; the report says how
# many tokens each variant saw.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
if [ "${1:-}" = "--quick" ]; then
    shift
    SIZE=(--quick --preset tiny)
    OUT=${OUT:-runs/reproduction-gpu-quick}
else
    SIZE=(--preset base --seq-len 512 --batch-size 64 --budget-minutes "${MINUTES:-8}" --set text.compile=on)
    OUT=${OUT:-docs/reproduction-gpu}
fi
exec "$PY" -m gatedattn.cli reproduce "${SIZE[@]}" --with-text --variants baseline,gated --no-mechanism --no-pretrained --set "text.train.device=$DEVICE" --out "$OUT" "$@"
