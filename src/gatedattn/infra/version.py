"""The package's version and where its source lies, for the layers that record them
(provenance) without importing the package facade above them."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"  # pyproject.toml's [project] version
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the gatedattn package directory
