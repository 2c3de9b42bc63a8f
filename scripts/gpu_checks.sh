#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script. Run from the repository root on a machine
# with PyTorch (CUDA), transformers and pytest installed; nothing is pip-installed:
#
#   OUT=/some/dir bash scripts/gpu_checks.sh
#
# 1. the CUDA attention paths against the reference (tests/ops/test_ops.py -k cuda);
# 2. gatedattn bench on the GPU with bf16 where supported and torch.compile:
#    $OUT/bench-gpu.json (and the same as Markdown in $OUT/bench-gpu.md);
# 3. the GPU scale-up of the reproduction (scripts/reproduce_gpu.sh, 8 minutes): $OUT/repro-gpu/.
# Each step's output goes to $OUT/<step>.log; the script runs every step and exits non-zero
# if any failed (a missing CUDA test collection counts as a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-checks}
mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
failed=()

step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, remember failures
    local name=$1; shift
    echo "== $name: $*" | tee "$OUT/$name.log"
    local t0=$SECONDS
    "$@" 2>&1 | tee -a "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
    [ "$rc" -eq 0 ] || failed+=("$name")
}

"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda); \
sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

step cuda-tests "$PY" -m pytest -q tests/ops/test_ops.py tests/models/test_static_decode.py -k cuda
step bench "$PY" -m gatedattn.cli bench --device cuda --dtype auto --compile --json --out "$OUT/bench-gpu.json"
if [ -f "$OUT/bench-gpu.json" ]; then
    "$PY" -c "import json, sys; from gatedattn.bench.report import format_markdown; \
print(format_markdown(json.load(open(sys.argv[1]))))" "$OUT/bench-gpu.json" > "$OUT/bench-gpu.md"
fi
step repro env OUT="$OUT/repro-gpu" bash scripts/reproduce_gpu.sh

if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]} (logs in $OUT)"
    exit 1
fi
echo "all GPU checks passed (outputs in $OUT)"
