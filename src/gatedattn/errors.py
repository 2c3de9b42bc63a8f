"""Deprecated: ``gatedattn.errors`` moved to ``gatedattn.infra.errors``; this path keeps working for
one release and warns on import (CHANGELOG.md)."""

import warnings

from gatedattn.infra.errors import *  # noqa: F401,F403  (every public name of the new module)

warnings.warn("gatedattn.errors moved to gatedattn.infra.errors; import it from there (this path goes in the next "
              "release)", DeprecationWarning, stacklevel=2)
