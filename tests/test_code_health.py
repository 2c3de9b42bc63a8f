"""Code health: no function of the package above cyclomatic complexity grade C (radon)."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gatedattn"


def test_no_function_above_complexity_grade_c():
    radon = pytest.importorskip("radon.complexity")  # a dev dependency (pyproject.toml)
    too_complex = []
    for path in sorted(SRC.rglob("*.py")):
        for block in radon.cc_visit(path.read_text(encoding="utf-8")):
            blocks = [block, *getattr(block, "closures", []), *getattr(block, "methods", [])]
            for b in blocks:
                if radon.cc_rank(b.complexity) > "C":
                    too_complex.append(f"{path.relative_to(SRC)}:{b.lineno} {b.name} "
                                       f"complexity {b.complexity} ({radon.cc_rank(b.complexity)})")
    assert not too_complex, "\n".join(too_complex)


def test_the_check_sees_a_complex_function():
    """The check is not vacuous: a function with 25 branches is grade D."""
    radon = pytest.importorskip("radon.complexity")
    body = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(25))
    (block,) = radon.cc_visit(f"def f(x):\n{body}\n    return -1\n")
    assert radon.cc_rank(block.complexity) == "D"


def test_trainer_methods_stay_small():
    """Every method of the Trainer at complexity 10 or less (one job each)."""
    radon = pytest.importorskip("radon.complexity")
    source = (SRC / "train" / "trainer.py").read_text(encoding="utf-8")
    (trainer,) = [b for b in radon.cc_visit(source) if b.name == "Trainer"]
    assert {m.name for m in trainer.methods} >= {"train_step", "evaluate", "save", "stop_reason"}
    assert max(m.complexity for m in trainer.methods) <= 10, [(m.name, m.complexity) for m in trainer.methods]
