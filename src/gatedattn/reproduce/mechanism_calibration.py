"""Deprecated: ``gatedattn.reproduce.mechanism_calibration`` moved to ``gatedattn.reproduce.mechanism.calibration``; this
path keeps working for one release and warns on import (CHANGELOG.md)."""

import warnings

from gatedattn.reproduce.mechanism.calibration import *  # noqa: F401,F403  (every public name of the new module)

warnings.warn("gatedattn.reproduce.mechanism_calibration moved to gatedattn.reproduce.mechanism.calibration; import it from there "
              "(this path goes in the next release)", DeprecationWarning, stacklevel=2)
