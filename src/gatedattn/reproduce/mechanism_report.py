"""Deprecated: ``gatedattn.reproduce.mechanism_report`` moved to ``gatedattn.reproduce.mechanism.report``; this
path keeps working for one release and warns on import (CHANGELOG.md)."""

import warnings

from gatedattn.reproduce.mechanism.report import *  # noqa: F401,F403  (every public name of the new module)
from gatedattn.reproduce.mechanism.run import run_study  # noqa: F401  (it lived here)

warnings.warn("gatedattn.reproduce.mechanism_report moved to gatedattn.reproduce.mechanism.report (run_study to "
              "gatedattn.reproduce.mechanism.run); import it from there (this path goes in the next release)", DeprecationWarning, stacklevel=2)
