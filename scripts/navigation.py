"""The navigation count: how often a reader following the main job's config from the
``reproduce`` entry point comes back to a file already left.

Definition (what this script measures):

1. A static call graph over a package (by default ``src/gatedattn``), from its source
   with :mod:`ast`. Nodes: every module-level function and every method (``Class.name``;
   a class's call reaches its ``__init__`` and ``__post_init__``). A call is resolved by
   name: a function of the same module, a name imported from a module of the package
   (``from m import f``, ``import m as x`` then ``x.f``), ``self.f`` / ``cls.f`` in a
   method (the class and its bases in the package), ``v.f`` where ``v``'s class is known
   (a parameter or local annotated with a class of the package, or a local assigned from
   a call of it), and ``functools.partial(f, ...)`` as a call of ``f``. A name bound by
   ``for a, b in NAME`` over a literal list of tuples stands for each tuple's element at
   its place. A call through a module-level table of dataclass instances
   (``v = TABLE[...]; v.run(...)``) is resolved by importing the package: the table's
   entry named by ``--study`` (default ``main``), and the function its field holds.
   Anything else (builtins, other packages, unknown receivers) is not followed.
2. Config values of a function: its parameters annotated with a ``*Config`` type or
   named ``cfg`` / ``config``, locals so annotated or so named, and locals assigned from
   a config value, an attribute or item of one, a method call on one, or a call of a
   package function whose return annotation is a ``*Config`` type.
3. The walk: depth first from the entry function (``gatedattn.reproduce.cli._run``,
   which runs ``gatedattn reproduce``), following only the calls that receive a config
   value (an argument that uses one, or a method called on one), in source order,
   visiting each function once.
4. The count: the walk's calls into a function in another file than the caller's, where
   the walk has already been in that file (left it before). Returning from a call is
   not an entry. Printed: the count, the functions visited, and the files re-entered most.

Usage: ``python scripts/navigation.py [--root src/gatedattn] [--entry MODULE:FUNCTION]
[--study main] [--top 10]``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_NAMES = ("cfg", "config")
CONFIG_TYPE = re.compile(r"\b\w*Config\b")


@dataclass
class Func:
    """One function or method of the package."""

    qual: str  # module:name or module:Class.name
    module: str
    file: str
    node: ast.AST
    cls: str | None = None


@dataclass
class Module:
    name: str
    file: str
    functions: dict[str, Func] = field(default_factory=dict)  # top-level functions
    classes: dict[str, dict[str, Func]] = field(default_factory=dict)  # class -> methods
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> base names as written
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:name"
    tables: dict[str, ast.AST] = field(default_factory=dict)  # module-level assignments
    annotations: dict[str, str] = field(default_factory=dict)  # module-level annotated names


class Package:
    """Every module of a package, parsed."""

    def __init__(self, root: Path, name: str | None = None):
        self.root = root
        self.name = name or root.name
        self.modules: dict[str, Module] = {}
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            self._parse(".".join(parts), path)

    def _parse(self, name: str, path: Path) -> None:
        tree = ast.parse(path.read_text(), str(path))
        mod = Module(name, str(path.relative_to(self.root.parent)))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.functions[node.name] = Func(f"{name}:{node.name}", name, mod.file, node)
            elif isinstance(node, ast.ClassDef):
                mod.classes[node.name] = {n.name: Func(f"{name}:{node.name}.{n.name}", name, mod.file, n, node.name)
                                          for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                mod.bases[node.name] = [ast.unparse(b) for b in node.bases]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        mod.imports[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    target = f"{base}.{a.name}"
                    mod.imports[a.asname or a.name] = target if target in self._all_names() else f"{base}:{a.name}"
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        mod.tables[t.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                mod.annotations[node.target.id] = ast.unparse(node.annotation)
                if node.value is not None:
                    mod.tables[node.target.id] = node.value
        self.modules[name] = mod

    def _all_names(self) -> set[str]:
        """Module names of the package (from its files; parsing order does not matter)."""
        if not hasattr(self, "_names"):
            names = set()
            for path in self.root.rglob("*.py"):
                parts = list(path.relative_to(self.root.parent).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                names.add(".".join(parts))
            self._names = names
        return self._names

    # -------------------------------------------------------------------------- lookups
    def symbol(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """What ``name`` in ``module`` is: ("module", m), ("func", qual) or ("class", module:Class)."""
        mod = self.modules.get(module)
        if mod is None or depth > 10:
            return None
        if name in mod.functions:
            return "func", mod.functions[name].qual
        if name in mod.classes:
            return "class", f"{module}:{name}"
        target = mod.imports.get(name)
        if target is None:
            return None
        if ":" not in target:
            return ("module", target) if target in self.modules else None
        m, n = target.split(":")
        if f"{m}.{n}" in self.modules:
            return "module", f"{m}.{n}"
        return self.symbol(m, n, depth + 1)

    def function(self, qual: str) -> Func | None:
        module, _, name = qual.partition(":")
        mod = self.modules.get(module)
        if mod is None:
            return None
        if "." in name:
            cls, _, meth = name.partition(".")
            return mod.classes.get(cls, {}).get(meth)
        return mod.functions.get(name)

    def method(self, cls_qual: str, name: str, depth: int = 0) -> Func | None:
        """``name`` on the class ``cls_qual`` or its bases in the package."""
        module, _, cls = cls_qual.partition(":")
        mod = self.modules.get(module)
        if mod is None or cls not in mod.classes or depth > 10:
            return None
        if name in mod.classes[cls]:
            return mod.classes[cls][name]
        for base in mod.bases[cls]:
            found = self.symbol(module, base.split("[")[0])
            if found and found[0] == "class":
                hit = self.method(found[1], name, depth + 1)
                if hit:
                    return hit
        return None

    def class_in(self, module: str, annotation: str) -> str | None:
        """The first class of the package named in an annotation (``list[X] | None`` gives X)."""
        for word in re.findall(r"[A-Za-z_][\w.]*", annotation):
            head, _, tail = word.partition(".")
            found = self.symbol(module, head)
            if found and found[0] == "module" and tail:
                found = self.symbol(found[1], tail)
            if found and found[0] == "class":
                return found[1]
        return None


# ------------------------------------------------------------------------------ one function
class Scope:
    """What the walk knows inside one function: its config values, the classes of its
    names, the names bound to literal tuples, and the table entries."""

    def __init__(self, pkg: Package, func: Func, study: str):
        self.pkg, self.func, self.study = pkg, func, study
        self.config: set[str] = set()
        self.types: dict[str, str] = {}
        self.alias: dict[str, list[ast.AST]] = {}
        self.entries: dict[str, object] = {}
        args = func.node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is None:
                continue
            note = ast.unparse(a.annotation) if a.annotation is not None else ""
            if a.arg in CONFIG_NAMES or CONFIG_TYPE.search(note):
                self.config.add(a.arg)
            cls = pkg.class_in(func.module, note) if note else None
            if cls:
                self.types[a.arg] = cls
        if func.cls is not None and (args.posonlyargs + args.args):
            first = (args.posonlyargs + args.args)[0].arg
            self.types[first] = f"{func.module}:{func.cls}"
            if CONFIG_TYPE.fullmatch(func.cls):
                self.config.add(first)

    def uses_config(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.config for n in ast.walk(node))

    def is_config_value(self, value: ast.AST) -> bool:
        """A config value, an attribute or item of one, a method called on one, or a call
        of a package function returning a config."""
        if isinstance(value, ast.Name):
            return value.id in self.config
        if isinstance(value, (ast.Attribute, ast.Subscript)):
            return self.is_config_value(value.value)
        if isinstance(value, ast.Call):
            if isinstance(value.func, ast.Attribute) and self.is_config_value(value.func.value):
                return True
            for target in self.callees(value):
                returns = getattr(target.node, "returns", None)
                if returns is not None and CONFIG_TYPE.search(ast.unparse(returns)):
                    return True
            return any(self.is_config_value(a) for a in value.args) and _looks_like_replace(value)
        return False

    def bind(self, stmt: ast.AST) -> None:
        """Learn from an assignment or a for loop, before the calls in it are walked."""
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            note = ast.unparse(stmt.annotation) if isinstance(stmt, ast.AnnAssign) else ""
            for t in targets:
                for name in _names(t):
                    if name in CONFIG_NAMES or CONFIG_TYPE.search(note) or (value is not None and self.is_config_value(value)):
                        self.config.add(name)
                if isinstance(t, ast.Name) and value is not None:
                    self._type_of(t.id, value, note)
        elif isinstance(stmt, ast.For):
            self.loop(stmt.target, stmt.iter)

    def _type_of(self, name: str, value: ast.AST, note: str) -> None:
        cls = self.pkg.class_in(self.func.module, note) if note else None
        if cls is None and isinstance(value, ast.Call):
            found = self._resolve_name(value.func)
            if found and found[0] == "class":
                cls = found[1]
        if cls:
            self.types[name] = cls
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
            table = self._table(value.value.id)
            if table is not None:
                self.entries[name] = table
        if isinstance(value, (ast.List, ast.Tuple)):
            self.alias[name] = list(value.elts)

    def _table(self, name: str):
        """The entry named by --study of a module-level table (a dict) of the package, imported."""
        target = self.pkg.modules[self.func.module].imports.get(name)
        if target is None and name in self.pkg.modules[self.func.module].tables:
            target = f"{self.func.module}:{name}"
        if target is None or ":" not in target:
            return None
        module, _, attr = target.partition(":")
        try:
            table = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            return None
        return table.get(self.study) if isinstance(table, dict) else None

    def loop(self, target: ast.AST, it: ast.AST) -> None:
        """``for a, b in NAME`` (a statement or a comprehension) over a literal list of
        tuples: a and b stand for each tuple's elements."""
        rows = self.alias.get(it.id) if isinstance(it, ast.Name) else list(it.elts) if isinstance(it, (ast.List, ast.Tuple)) else None
        if isinstance(target, ast.Tuple) and rows:
            for pos, t in enumerate(target.elts):
                if isinstance(t, ast.Name):
                    self.alias[t.id] = [r.elts[pos] for r in rows if isinstance(r, ast.Tuple) and pos < len(r.elts)]
        if self.uses_config(it):
            for name in _names(target):
                self.config.add(name)
        if isinstance(it, ast.Name) and it.id in self.types and isinstance(target, ast.Name):
            self.types[target.id] = self.types[it.id]

    def _resolve_name(self, node: ast.AST) -> tuple[str, str] | None:
        if isinstance(node, ast.Name):
            return self.pkg.symbol(self.func.module, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = self.pkg.symbol(self.func.module, node.value.id)
            if base and base[0] == "module":
                return self.pkg.symbol(base[1], node.attr)
        return None

    def _targets(self, node: ast.AST) -> list[Func]:
        """The package functions an expression used as a callee stands for."""
        if isinstance(node, ast.Name) and node.id in self.alias:
            return [f for e in self.alias[node.id] for f in self._targets(e)]
        found = self._resolve_name(node)
        if found and found[0] == "func":
            return [self.pkg.function(found[1])]
        if found and found[0] == "class":
            return [m for m in (self.pkg.method(found[1], "__init__"), self.pkg.method(found[1], "__post_init__")) if m]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = node.value.id
            if owner in self.entries:
                held = getattr(self.entries[owner], node.attr, None)
                func = _function_of(self.pkg, held)
                return [func] if func else []
            if owner in self.types:
                hit = self.pkg.method(self.types[owner], node.attr)
                return [hit] if hit else []
        return []

    def callees(self, call: ast.Call) -> list[Func]:
        if _is_partial(call) and call.args:
            return [f for f in self._targets(call.args[0]) if f]
        return [f for f in self._targets(call.func) if f]

    def receives_config(self, call: ast.Call) -> bool:
        if isinstance(call.func, ast.Attribute) and self.is_config_value(call.func.value):
            return True
        args = call.args[1:] if _is_partial(call) else call.args
        return any(self.uses_config(a) for a in args) or any(self.uses_config(k.value) for k in call.keywords)


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _is_partial(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "partial") or (isinstance(f, ast.Attribute) and f.attr == "partial")


def _looks_like_replace(call: ast.Call) -> bool:
    """``dataclasses.replace(cfg, ...)`` and the like: a config with changes."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name == "replace"


def _function_of(pkg: Package, obj) -> Func | None:
    """The package function behind a runtime object (a function or a functools.partial)."""
    obj = getattr(obj, "func", obj)
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qual or "<" in qual:
        return None
    return pkg.function(f"{module}:{qual}")


def _calls_in_order(func: Func) -> list[tuple[ast.AST, list[ast.Call]]]:
    """Each statement of the function body (nested blocks flattened, nested functions
    included), in source order, with the calls in it."""
    out = []

    def visit(stmts):
        for stmt in stmts:
            own = [n for n in _own_nodes(stmt) if isinstance(n, ast.Call)]
            out.append((stmt, own))
            for name in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], (ast.stmt, ast.ExceptHandler)):
                    visit(inner)
            if isinstance(stmt, ast.ExceptHandler):
                visit(stmt.body)

    visit(func.node.body)
    return out


def _own_nodes(stmt: ast.AST):
    """The nodes of a statement, not those of the blocks nested in it."""
    skip = {id(s) for name in ("body", "orelse", "finalbody", "handlers") for s in (getattr(stmt, name, None) or [])
            if isinstance(getattr(stmt, name, None), list)}
    stack = [stmt]
    while stack:
        node = stack.pop()
        if id(node) in skip:
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


# ------------------------------------------------------------------------------ the walk
@dataclass
class Walk:
    visited: list[Func] = field(default_factory=list)
    reentries: Counter = field(default_factory=Counter)
    seen_files: set[str] = field(default_factory=set)

    @property
    def count(self) -> int:
        return sum(self.reentries.values())


def walk(pkg: Package, entry: Func, study: str = "main") -> Walk:
    """The depth-first walk of the definition above."""
    result = Walk()
    done: set[str] = set()

    def visit(func: Func) -> None:
        done.add(func.qual)
        result.visited.append(func)
        result.seen_files.add(func.file)
        scope = Scope(pkg, func, study)
        for stmt, calls in _calls_in_order(func):
            for gen in (n for n in _own_nodes(stmt) if isinstance(n, ast.comprehension)):
                scope.loop(gen.target, gen.iter)
            for call in calls:
                if not scope.receives_config(call):
                    continue
                for callee in scope.callees(call):
                    if callee.qual in done:
                        continue
                    if callee.file != func.file and callee.file in result.seen_files:
                        result.reentries[callee.file] += 1
                    visit(callee)
            scope.bind(stmt)

    visit(entry)
    return result


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description="The navigation count (see the module docstring for its definition).")
    p.add_argument("--root", default=str(here / "src" / "gatedattn"), help="the package directory")
    p.add_argument("--entry", default="gatedattn.reproduce.cli:_run", help="MODULE:FUNCTION the walk starts at")
    p.add_argument("--study", default="main", help="the registry entry a table lookup stands for")
    p.add_argument("--top", type=int, default=10, help="files re-entered most, listed")
    p.add_argument("--list", action="store_true", help="also list the functions in the order visited")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root.parent))
    pkg = Package(root)
    entry = pkg.function(args.entry)
    if entry is None:
        p.error(f"--entry {args.entry}: no such function under {root}")
    w = walk(pkg, entry, args.study)
    print(f"navigation count: {w.count} re-entries into a file already left "
          f"({len(w.visited)} functions visited in {len(w.seen_files)} files, from {args.entry})")
    for file, n in w.reentries.most_common(args.top):
        print(f"  {n:3d}  {file}")
    if args.list:
        for f in w.visited:
            print(f"    {f.qual}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
