"""Errors that describe a user's mistake.

The CLI prints them as one line (no traceback) and exits with status 2.
"""

from __future__ import annotations


class GatedAttnError(Exception):
    """A user-facing error: bad input, bad config, bad file."""


class ConfigError(GatedAttnError, ValueError):
    """An invalid configuration; the message names the field and the allowed values."""


def check_choice(owner: str, field: str, value, allowed) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{owner}.{field}={value!r} is not allowed; choose one of {choices}")
