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
python -m pytest -q -n auto --dist worksteal "$@"
