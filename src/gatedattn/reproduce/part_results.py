"""A part's results as a frozen dataclass (:class:`PartResults`): one field per top-level
key the part writes into ``results.json``, declared in the order it writes them.

A part's code passes the dataclass around; it becomes a dict only where ``results.json``
is written (:meth:`PartResults.to_dict`: the same keys, in the same order, as the part
wrote before it was typed), and is read back from there by :meth:`PartResults.from_dict`,
which refuses a key the part does not write, a key it always writes that is missing, and
a top-level value of the wrong kind, each naming the key and the part. A field declared
with :func:`optional` is a key the part writes only where it has a value for it (None:
left out of the dict). Nested values stay JSON-like dicts and lists."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Mapping, TypeVar

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fields import field_types

R = TypeVar("R", bound="PartResults")

_OPTIONAL = "optional"  # field metadata: the key is left out of the dict where the field is None

# the JSON kinds a field's declared type admits, with their names in an error message
_KINDS: dict[Any, tuple[tuple[type, ...], str]] = {
    dict: ((dict,), "an object"), list: ((list,), "a list"), str: ((str,), "a string"),
    int: ((int,), "an integer"), float: ((int, float), "a number"), bool: ((bool,), "true or false"),
}


def optional() -> Any:
    """A field whose key the part writes only where it has a value: None leaves it out."""
    return dataclasses.field(default=None, metadata={_OPTIONAL: True})


def _kinds(hint: Any) -> tuple[list[tuple[tuple[type, ...], str]], bool] | None:
    """The JSON kinds ``hint`` admits and whether it admits null; None where it admits anything."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    kinds, nullable = [], False
    for arg in args:
        if arg is type(None):
            nullable = True
            continue
        kind = _KINDS.get(typing.get_origin(arg) or arg)
        if kind is None:
            return None
        kinds.append(kind)
    return kinds, nullable


def _admits(value: Any, types_: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types_:
        return False  # true or false is no number
    return isinstance(value, types_)


class PartResults:
    """The base of a part's typed results (each a frozen dataclass whose fields are the
    keys it writes); ``PART`` names the part (its key) in every error."""

    PART: ClassVar[str]  # each subclass: its key in the main job ("mechanism", "pretrained")

    def to_dict(self) -> dict[str, Any]:
        """The results as ``results.json`` holds them: every field in declared order, an
        :func:`optional` one only where it is not None."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if not (f.metadata.get(_OPTIONAL) and getattr(self, f.name) is None)}

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """The results ``data`` (as ``to_dict`` wrote them) as this dataclass; a
        ConfigError naming the key and the part for an unknown key, a missing one, or a
        value of the wrong kind."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"the {cls.PART} part's results must be a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = [k for k in data if k not in fields]
        if unknown:
            raise ConfigError(f"the {cls.PART} part's results hold an unknown key {unknown[0]!r} (its keys: "
                              f"{', '.join(fields)})")
        missing = [name for name, f in fields.items() if not f.metadata.get(_OPTIONAL) and name not in data]
        if missing:
            raise ConfigError(f"the {cls.PART} part's results miss the key {missing[0]!r}")
        hints = field_types(cls)
        for name, value in data.items():
            cls._check(name, value, hints[name], bool(fields[name].metadata.get(_OPTIONAL)))
        return cls(**data)

    @classmethod
    def _check(cls, name: str, value: Any, hint: Any, optional_key: bool) -> None:
        """A ConfigError unless ``value`` is of a kind ``hint`` admits (an optional key is
        left out, not null, where it has no value)."""
        if value is None and optional_key:
            raise ConfigError(f"the {cls.PART} part's results hold {name!r} as null: a key without a value is left out")
        found = _kinds(hint)
        if found is None:
            return
        kinds, nullable = found
        if (value is None and nullable) or any(_admits(value, k) for k, _ in kinds):
            return
        what = " or ".join([n for _, n in kinds] + (["null"] if nullable and not optional_key else []))
        raise ConfigError(f"the {cls.PART} part's results hold {name!r} as {type(value).__name__}; it must be {what}")

    def replace(self: R, **changes: Any) -> R:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]
