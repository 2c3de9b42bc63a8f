"""The machine-wide cache directory: what is slow to make and the same on every run (the
default corpus prepared, the measured peak FLOP/s, tokenizers built from GGUF files) is
kept in ``$GATEDATTN_CACHE``, by default ``~/.cache/gatedattn``. Everything in it is
made again where it is missing."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$GATEDATTN_CACHE`` where set (and not empty), else ``~/.cache/gatedattn``."""
    return Path(os.environ.get("GATEDATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gatedattn"))
