#!/usr/bin/env bash
# Sets up .venv if needed, then runs the whole test suite (slow end-to-end tests included),
# one pytest-xdist worker per core (one torch thread each: tests/conftest.py), the slow
# tests first and the rest shared out by work stealing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# The suite starts many Python processes (CLIs, torchrun, fresh interpreters): each would
# compile the package's modules again where the environment asks Python not to write bytecode;
# the first compiles them into __pycache__ (git ignores it) and the others reuse it.
unset PYTHONDONTWRITEBYTECODE
# The tests' scratch files (about 1 GB a run: prepared corpora, checkpoints, saved models) go
# to memory where /dev/shm has room for them: they need no durability, and every atomic
# write's fsync would wait on the disk. A run that passes removes them; one that fails says
# where they are. (`--basetemp DIR` after the script's name puts them elsewhere.)
basetemp=()
shm_free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}') || true
if [ "${shm_free_kb:-0}" -gt $((4 * 1024 * 1024)) ] 2>/dev/null; then
  scratch=$(mktemp -d /dev/shm/gatedattn-tests.XXXXXX)
  basetemp=(--basetemp "$scratch/pytest")
fi
status=0
python -m pytest -q -n auto --dist worksteal "${basetemp[@]}" "$@" || status=$?
if [ -n "${scratch:-}" ]; then
  if [ "$status" -eq 0 ]; then rm -rf "$scratch"; else echo "the tests' scratch files: $scratch" >&2; fi
fi
exit "$status"
