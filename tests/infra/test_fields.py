"""field_types: a config dataclass's resolved field types, kept per class."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from gatedattn.infra.fields import field_types


@dataclasses.dataclass
class _Leaf:
    steps: int = 1
    lr: float | None = None
    name: "str" = "x"


def test_the_resolved_hints_once_per_class_and_read_only(monkeypatch):
    calls = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda cls: calls.append(cls) or real(cls))
    field_types.cache_clear()  # (it fills again as configs are built)
    first = field_types(_Leaf)
    assert dict(first) == {"steps": int, "lr": float | None, "name": str}  # strings resolved
    assert field_types(_Leaf) is first and calls == [_Leaf]
    with pytest.raises(TypeError):
        first["steps"] = str  # one answer shared by every caller: nobody may change it
