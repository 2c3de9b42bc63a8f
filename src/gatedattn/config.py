"""Deprecated: ``gatedattn.config`` moved to ``gatedattn.layers.config``; this path keeps working for
one release and warns on import (CHANGELOG.md)."""

import warnings

from gatedattn.layers.config import *  # noqa: F401,F403  (every public name of the new module)

warnings.warn("gatedattn.config moved to gatedattn.layers.config; import it from there (this path goes in the next "
              "release)", DeprecationWarning, stacklevel=2)
