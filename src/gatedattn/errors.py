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


class Interrupted(GatedAttnError):
    """A run stopped by SIGINT or SIGTERM after saving what it needs to continue;
    ``status`` is the conventional exit status (128 + the signal number)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _safetensors_error() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return ()
    return (SafetensorError,)


# What a user's input or environment can cause (bad values, bad or unreadable files,
# a full or read-only disk); the CLI prints these as one line. Anything else is a bug.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    GatedAttnError, ValueError, OSError, UnicodeError, *_safetensors_error(),
)
