"""Old public paths keep working for one release, each with a DeprecationWarning that names
the new place (CHANGELOG.md lists them)."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("old, new, name", [("gatedattn.config", "gatedattn.layers.config", "AttentionConfig"),
                                            ("gatedattn.errors", "gatedattn.infra.errors", "ConfigError")])
def test_a_moved_module_warns_and_gives_the_same_objects(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
