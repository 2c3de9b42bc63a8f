"""Deprecated: ``gatedattn.reproduce.mechanism_probe`` moved to ``gatedattn.reproduce.mechanism.probe``; this
path keeps working for one release and warns on import (CHANGELOG.md)."""

import warnings

from gatedattn.reproduce.mechanism.probe import *  # noqa: F401,F403  (every public name of the new module)

warnings.warn("gatedattn.reproduce.mechanism_probe moved to gatedattn.reproduce.mechanism.probe; import it from there "
              "(this path goes in the next release)", DeprecationWarning, stacklevel=2)
