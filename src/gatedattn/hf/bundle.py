"""Self-contained checkpoints (the code writer itself is ``gatedattn.models.code``).

``save_self_contained(model, dir)`` is ``model.save_pretrained(dir)``, which writes the
modelling code by default; it stays for code written against it.
"""

from __future__ import annotations

from pathlib import Path

from gatedattn.models.code import AUTO_MAP, ENTRIES, bundle_sources, flat_name, write_code

__all__ = ["AUTO_MAP", "ENTRIES", "bundle_sources", "flat_name", "save_self_contained", "write_code"]


def save_self_contained(model, directory: str | Path) -> Path:
    """``model.save_pretrained(directory, save_code=True)``: the weights, the modelling code
    and its ``auto_map`` in one atomically renamed directory, so that
    ``AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)`` works where
    gatedattn is not installed."""
    return model.save_pretrained(directory, save_code=True)
