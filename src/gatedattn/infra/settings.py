"""``--set KEY=VALUE``: command-line settings generated from a tree of config dataclasses.

Every command that takes ``--set`` walks its root config class (``TrainConfig`` for
``train``/``sweep``, ``ReproduceConfig`` for ``reproduce``) with :func:`settings`:

- a field whose type is a dataclass is a branch: its fields get the prefix ``name.``;
- a field with ``metadata["overrides"] = SomeConfig`` holds a dict of changes to
  ``SomeConfig``: the settable fields of ``SomeConfig`` appear under ``name.``, or
  directly under the parent's prefix when ``metadata["flatten"]`` is true;
- ``metadata["set"] = False`` leaves a field out (it comes from elsewhere, e.g. the
  vocabulary from the data), ``metadata["exclude"]`` leaves out keys below a branch;
- every other field is a leaf. Its help text is ``metadata["help"]``, written once
  where the field is declared.

A key may be given in full (``model.gate.activation``) or by any dotted suffix that
names exactly one key (``gate.activation``), so every command accepts the same short
keys. Values are parsed by the field's type (:func:`parse_value`). A config class whose
fields moved declares ``MOVED_KEYS`` (the old first part of a key -> its new prefix):
an old key still works for a release, with a DeprecationWarning naming the new one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import textwrap
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fields import field_types

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One ``--set`` key: ``path`` is where its value lives in the config's ``to_dict()``."""

    key: str
    path: tuple[str, ...]
    type: Any
    help: str


def dataclass_of(typ: Any) -> type | None:
    """The dataclass in ``typ`` (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(typ):
        return typ
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(typ) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]
    return None


def settings(cls: type, prefix: tuple[str, ...] = (), path: tuple[str, ...] = (),
             exclude: frozenset[str] = frozenset()) -> list[Setting]:
    """Every settable leaf of the config class ``cls``, in declaration order."""
    hints = field_types(cls)
    out: list[Setting] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("set", True) is False:
            continue
        sub_exclude = frozenset(meta.get("exclude", ()))
        target = meta.get("overrides")
        if target is not None:
            key_prefix = prefix if meta.get("flatten") else (*prefix, f.name)
            found = settings(target, key_prefix, (*path, f.name), sub_exclude)
            out += [s for s in found if len(s.path) == len(path) + 2]  # direct fields only
        elif dataclass_of(hints[f.name]) is not None:
            out += settings(dataclass_of(hints[f.name]), (*prefix, f.name), (*path, f.name), sub_exclude)
        else:
            out.append(Setting(".".join((*prefix, f.name)), (*path, f.name), hints[f.name], meta.get("help", "")))
    start = len(".".join(prefix)) + 1 if prefix else 0
    return [s for s in out if s.key[start:] not in exclude]


def resolve(key: str, known: list[Setting]) -> Setting:
    """The setting ``key`` names: an exact key, else the one key ending in ``.key``."""
    by_key = {s.key: s for s in known}
    if key in by_key:
        return by_key[key]
    matches = [s for s in known if s.key.endswith("." + key)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"--set key {key!r} is ambiguous; say which: {', '.join(s.key for s in matches)}")
    names = [s.key for s in known]
    close = difflib.get_close_matches(key, names, n=1)
    if not close:  # a misspelt short key: compare it with the keys' last parts
        last = {}
        for name in names:
            last.setdefault(name.rpartition(".")[2], name)
        close = [last[k] for k in difflib.get_close_matches(key.rpartition(".")[2], list(last), n=1)]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown --set key {key!r}{hint}; valid keys: {', '.join(names)}")


def parse_value(text: str, typ: Any, key: str) -> Any:
    """Parse ``text`` as a value of type ``typ`` (bool, int, float, str, tuples, ``X | None``);
    a bad value names the key and the expected type."""
    s = text.strip()
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if s.lower() in ("none", "null"):
            return None
        if len(args) == 1:
            return parse_value(text, args[0], key)
    if typ is bool:
        return _parse_bool(s, key)
    if typ is int:
        return _parse_int(s, key)
    if typ is float:
        try:
            return float(s)
        except ValueError:
            raise ConfigError(f"--set {key}={text!r}: expected a number") from None
    if typ is str:
        return s
    if typing.get_origin(typ) is tuple:
        return _parse_tuple(s, typ, key)
    raise ConfigError(f"--set {key}: values of type {typ} cannot be set from the command line")


def _parse_bool(s: str, key: str) -> bool:
    if s.lower() in _TRUE:
        return True
    if s.lower() in _FALSE:
        return False
    raise ConfigError(f"--set {key}={s!r}: expected true or false")


def _parse_int(s: str, key: str) -> int:
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        f = math.nan
    if math.isfinite(f) and f.is_integer():
        return int(f)
    raise ConfigError(f"--set {key}={s!r}: expected an integer")


def _parse_tuple(s: str, typ: Any, key: str) -> tuple:
    elem = typing.get_args(typ)
    parts = [p for p in s.split(",") if p.strip()] if s else []
    if len(elem) == 2 and elem[1] is Ellipsis:  # tuple[X, ...]: any length
        if not parts:
            raise ConfigError(f"--set {key}={s!r}: expected a comma-separated list")
        return tuple(parse_value(p, elem[0], key) for p in parts)
    if len(parts) != len(elem):
        raise ConfigError(f"--set {key}={s!r}: expected {len(elem)} comma-separated values")
    return tuple(parse_value(p, t, key) for p, t in zip(parts, elem))


def parse_list(text: str, kind: type, flag: str) -> list:
    """A comma-separated list of ``kind`` (``--lr 1e-3,3e-3``); an empty or bad list
    names the flag."""
    return list(parse_value(text, tuple[kind, ...], flag))


def option(default: Any = dataclasses.MISSING, *, help: str, **meta: Any) -> Any:
    """A dataclass field with its ``--set`` help (and other ``meta``) declared in place;
    a mutable ``default`` (dict) is copied per instance."""
    metadata = {"help": help, **meta}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def fields_dict(obj: Any) -> dict[str, Any]:
    """A config dataclass as plain data: each field by name, a nested config by its own
    ``to_dict()``, a tuple as a list."""
    d = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        d[f.name] = (value.to_dict() if hasattr(value, "to_dict") else
                     list(value) if isinstance(value, tuple) else value)
    return d


def build(cls: type, data: dict[str, Any], owner: str | None = None) -> Any:
    """``cls(**data)``, refusing a field ``cls`` does not have by its name and the allowed
    ones (the one ``from_dict`` check of every config class)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{owner or cls.__name__} has no field {unknown[0]!r}; fields are: {', '.join(sorted(known))}")
    return cls(**data)


_BOUNDS = {"gt": (lambda v, b: v > b, ">"), "ge": (lambda v, b: v >= b, ">="),
           "lt": (lambda v, b: v < b, "<"), "le": (lambda v, b: v <= b, "<=")}


def check_options(obj: Any) -> None:
    """Check every field of the dataclass ``obj`` against what its ``option`` declares:
    ``choices=`` (the value, or each item of a tuple value, must be one of them) and the
    bounds ``gt=``, ``ge=``, ``lt=``, ``le=`` (None values are not checked). The error
    names the field and what is allowed; ``__post_init__`` keeps only cross-field rules."""
    owner = type(obj).__name__
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{owner}.{f.name}={value!r} must be finite (not NaN or infinite)")
        choices = meta.get("choices")
        if choices is not None:
            for item in value if isinstance(value, tuple) else (value,):
                if item not in choices:
                    raise ConfigError(f"{owner}.{f.name}={item!r} is not allowed; choose one of "
                                      f"{', '.join(repr(c) for c in choices)}")
        for key, (ok, sign) in _BOUNDS.items():
            bound = meta.get(key)
            if bound is None or value is None:
                continue
            for item in value if isinstance(value, tuple) else (value,):
                if not ok(item, bound):
                    raise ConfigError(f"{owner}.{f.name}={value!r} must be {sign} {bound if isinstance(bound, int) else format(bound, 'g')}")


def split_item(item: str) -> tuple[str, str]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
    return key, text


def parse_sets(cls: type, items: list[str] | tuple[str, ...],
               flags: dict[str, str] | None = None) -> dict[tuple[str, ...], Any]:
    """``["lr=3e-3", "gate.activation=silu"]`` -> ``{path: value}`` for config class ``cls``.
    ``flags`` maps full keys to the command-line option that sets them (``{"out_dir":
    "--out"}``): such a key is refused, so a run's identity has one source."""
    known = settings(cls)
    out: dict[tuple[str, ...], Any] = {}
    for item in items:
        key, text = split_item(item)
        s = resolve(moved_key(key, getattr(cls, "MOVED_KEYS", {})), known)
        if flags and s.key in flags:
            raise ConfigError(f"--set {key}: {s.key} is set by {flags[s.key]}, not --set")
        out[s.path] = parse_value(text, s.type, s.key)
    return out


def moved_key(key: str, moved: Mapping[str, str]) -> str:
    """``key`` by its new name where its first part moved (``moved``: old first part ->
    new prefix), with a DeprecationWarning naming the new key; else ``key``."""
    head, dot, rest = key.partition(".")
    if head not in moved:
        return key
    new = moved[head] + dot + rest
    warnings.warn(f"--set {key} is now --set {new} (the old key goes in the next release)", DeprecationWarning,
                  stacklevel=3)
    return new


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of the nested dict ``tree`` with ``tree[path[0]]...[path[-1]] = value``."""
    head, *rest = path
    out = dict(tree)
    out[head] = set_path(dict(out.get(head) or {}), tuple(rest), value) if rest else value
    return out


def apply_sets(cfg: Any, items: list[str] | tuple[str, ...], flags: dict[str, str] | None = None) -> Any:
    """``cfg`` (a config with ``to_dict``/``from_dict``) with ``KEY=VALUE`` items applied;
    keys in ``flags`` are refused (:func:`parse_sets`)."""
    return _with_paths(cfg, parse_sets(type(cfg), items, flags))


def _with_paths(cfg: Any, values: dict[tuple[str, ...], Any]) -> Any:
    """``cfg`` with the value at each key path of ``values`` set, checked as a whole by ``from_dict``."""
    tree = cfg.to_dict()
    for path, value in values.items():
        tree = set_path(tree, path, value)
    return type(cfg).from_dict(tree)


def help_text(cls: type, width: int = 90) -> str:
    """The ``--set`` keys of ``cls`` with their help, for an argparse epilog."""
    lines = ["--set KEY=VALUE keys (a key may be shortened to any unique dotted suffix, "
             "e.g. gate.activation):"]
    for s in settings(cls):
        lines.append(f"  {s.key}")
        if s.help:
            lines.append(textwrap.fill(s.help, width=width, initial_indent="      ", subsequent_indent="      "))
    lines.append("values: booleans true/false; pairs and lists comma-separated (0.9,0.95); optional values: none")
    return "\n".join(lines)


def with_values(cfg: Any, values: dict[str, Any]) -> Any:
    """``cfg`` (a config with ``to_dict``/``from_dict``) with each dotted key of ``values``
    (``"train.lr"``, ``"seeds"``) set to its value, checked as a whole by ``from_dict``."""
    return _with_paths(cfg, {tuple(key.split(".")): value for key, value in values.items()})
