"""Code health: complexity (radon), layer order, no import circle, function-level imports with a reason."""

from __future__ import annotations

import ast
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


# ---------------------------------------------------------------------------- import circles
# The imports a module runs when it is imported: module level (also under ``if`` / ``try`` and in
# class bodies), not inside functions, whose imports run when they are called. Each is an
# ``import``, a ``from ... import`` or an ``importlib.import_module("...")`` with a literal name;
# ``from package import name`` imports the submodule ``name`` or, for a name the package exports
# lazily (its ``_EXPORTS``, ``gatedattn.infra.lazy``), the module that defines it.

def _module_files(src: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package at ``src``."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's ``_EXPORTS`` (name -> defining module), {} when it has none."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _run_at_import(tree: ast.Module, calls: bool = False):
    """Every node the module runs when imported (function bodies are skipped), or, with
    ``calls``, also those its functions run when called."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if calls or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _imported_names(node: ast.AST, module: str, package: bool, modules: dict, exports: dict) -> list[str]:
    """The modules one node imports (absolute names; any package's, not only ours)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + (1 if package else 0)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else exports.get(base, {}).get(a.name, base)
                for a in node.names]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value]
    return []


def import_graph(src: Path, calls: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it is imported (``calls``: or when
    one of its functions is called)."""
    modules = _module_files(src)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in modules.items()}
    exports = {name: _lazy_exports(tree) for name, tree in trees.items() if modules[name].name == "__init__.py"}
    graph = {}
    for name, tree in trees.items():
        package = modules[name].name == "__init__.py"
        found = {t for node in _run_at_import(tree, calls) for t in _imported_names(node, name, package, modules, exports)}
        graph[name] = {m for t in found for m in _with_packages(t, name)} & modules.keys()
    return graph


def _with_packages(target: str, importer: str) -> list[str]:
    """``target`` and the packages its import runs first: its parents, less those of
    ``importer`` (already imported when ``importer`` runs)."""
    parts, own = target.split("."), importer.split(".")
    return [*(".".join(parts[:i]) for i in range(1, len(parts)) if parts[:i] != own[:i]), target]


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (``[a, b, ..., a]``), or [] when there is none."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return []


def test_no_import_circle():
    """None when the modules are imported, and none hidden inside a function either."""
    for calls in (False, True):
        cycle = find_cycle(import_graph(SRC, calls))
        assert not cycle, "import circle: " + " -> ".join(cycle)


def test_the_circle_check_sees_a_planted_circle(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    # the shape of the circle the Auto classes had: the config imports the model through importlib
    pkg = tmp_path / "gatedattn"
    (pkg / "hf").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hf" / "__init__.py").write_text('_EXPORTS = {"Model": "gatedattn.hf.auto"}\n')
    (pkg / "hf" / "auto.py").write_text("from gatedattn.hf.configuration import Config\n")
    circle = ["gatedattn.hf.auto", "gatedattn.hf.configuration", "gatedattn.hf.auto"]
    configs = {
        'import importlib\nif __name__ == "gatedattn.hf.configuration":\n'
        '    importlib.import_module("gatedattn.hf.auto")\n': circle,
        "from gatedattn.hf import Model\n": circle,  # a lazy export of the package
        "import gatedattn.hf.auto as auto\n": circle,
        "def f():\n    from gatedattn.hf import Model\n": [],  # runs when called, not when imported
    }
    for source, expected in configs.items():
        (pkg / "hf" / "configuration.py").write_text(source)
        assert find_cycle(import_graph(pkg)) == expected, source
        assert find_cycle(import_graph(pkg, calls=True)) == circle, source  # a circle all the same


# ------------------------------------------------------------------- function-level imports
# An import sits inside a function only for one of these reasons, given as ``# lazy: <reason>``
# on its line or the line above; every other import is at module level.
# (an import circle is no reason: the circle check sees imports inside functions too)
LAZY_REASONS = ("--help must not import torch", "heavy (", "optional extra (", "start-up guard (")


def _function_level_imports(tree: ast.Module) -> list[ast.stmt]:
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line -> (its comment, whether the comment is the whole line)."""
    import io
    import tokenize

    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = (tok.string, not tok.line[: tok.start[1]].strip())
    return found


def _lazy_reason(comment: str) -> str | None:
    text = comment.lstrip("#").strip()
    return text[len("lazy:"):].strip() if text.startswith("lazy:") else None


def unexplained_lazy_imports(src: Path) -> list[str]:
    """Every function-level import under ``src`` without a known reason, as ``file:line import``."""
    bad = []
    for path in sorted(src.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        comments, lines = _comments(source), source.splitlines()
        for node in _function_level_imports(ast.parse(source, str(path))):
            own, above = comments.get(node.lineno), comments.get(node.lineno - 1)
            candidates = [own[0]] if own else []
            candidates += [above[0]] if above and above[1] else []
            reasons = [r for r in map(_lazy_reason, candidates) if r is not None]
            if not any(r.startswith(LAZY_REASONS) for r in reasons):
                bad.append(f"{path.relative_to(src.parent).as_posix()}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return bad


def test_every_function_level_import_says_why():
    bad = unexplained_lazy_imports(SRC)
    assert not bad, ("imports inside functions without '# lazy: <reason>' (reasons: " + ", ".join(LAZY_REASONS)
                     + "); move the others to module level:\n" + "\n".join(bad))


def test_the_lazy_import_check_sees_an_unexplained_one(tmp_path):
    pkg = tmp_path / "gatedattn"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import json\n"
        "\n"
        "def a():\n"
        "    import torch  # lazy: heavy (torch)\n"
        "    # lazy: heavy (gatedattn.n imports transformers)\n"
        "    from gatedattn import n\n"
        "    from gatedattn import o  # lazy: import circle (gatedattn.o imports gatedattn.m)\n"
        "    import os\n"
        "    import csv  # lazy: it is faster\n"
        "\n"
        "class K:\n"
        "    def b(self):\n"
        "        text = '# lazy: heavy (torch)'; import re\n"
        "        x = 1  # lazy: heavy (torch)\n"
        "        import struct\n"
        "        return lambda: __import__('x') or [1 for _ in ()]\n")
    assert unexplained_lazy_imports(pkg) == [
        "gatedattn/m.py:7 from gatedattn import o  # lazy: import circle (gatedattn.o imports gatedattn.m)",
        "gatedattn/m.py:8 import os", "gatedattn/m.py:9 import csv  # lazy: it is faster",
        "gatedattn/m.py:13 text = '# lazy: heavy (torch)'; import re", "gatedattn/m.py:15 import struct",
    ]
