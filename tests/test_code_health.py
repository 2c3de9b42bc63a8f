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


# The package's layers, lowest first: a module imports only from its own layer or lower ones.
# Every package's ``cli.py`` (and the top-level command table) is the application layer;
# ``gatedattn/__init__.py`` is the facade that re-exports names and is left out.
LAYERS = {"infra": 0, "paper": 0, "ops": 1, "layers": 2, "models": 3, "data": 4, "hf": 4, "train": 5,
          "analysis": 6, "bench": 7, "reproduce": 7, "cli": 8}
APP = LAYERS["cli"]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[-1] == "cli":
        return APP
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``gatedattn`` module ``path`` imports, at any depth, with its line."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gatedattn":
            if node.module == "gatedattn":  # from gatedattn import paper / cli / __version__
                found += [(node.lineno, f"gatedattn.{a.name}") for a in node.names if a.name in LAYERS]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gatedattn.")]
    return found


def upward_imports(src: Path) -> list[str]:
    bad = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        if rel.parts == ("gatedattn", "__init__"):
            continue
        me = _layer(".".join(p for p in rel.parts if p != "__init__") if rel.parts[-1] != "__init__"
                    else ".".join(rel.parts[:-1]))
        for line, module in _imports(path):
            target = _layer(module)
            if me is not None and target is not None and target > me:
                bad.append(f"{rel}.py:{line} imports {module} (a higher layer)")
    return bad


def test_no_import_points_up_a_layer():
    assert not upward_imports(SRC), "\n".join(upward_imports(SRC))


def test_the_layer_check_sees_an_upward_import(tmp_path):
    pkg = tmp_path / "gatedattn"
    (pkg / "layers").mkdir(parents=True)
    (pkg / "layers" / "attention.py").write_text("def f():\n    from gatedattn.hf.bundle import write_code\n")
    (pkg / "hf").mkdir()
    (pkg / "hf" / "bundle.py").write_text("from gatedattn.layers.attention import f\n")
    assert upward_imports(pkg) == ["gatedattn/layers/attention.py:2 imports gatedattn.hf.bundle (a higher layer)"]
