"""Errors that describe a user's mistake.

The CLI prints them as one line (no traceback) and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import math
import typing

from safetensors import SafetensorError

from gatedattn.infra.fields import field_types


class GatedAttnError(Exception):
    """A user-facing error: bad input, bad config, bad file."""


class ConfigError(GatedAttnError, ValueError):
    """An invalid configuration; the message names the field and the allowed values."""


def check_types(obj) -> None:
    """Raise ConfigError naming the first field of the dataclass ``obj`` whose value does not
    have its declared type (``int``, ``float``, ``bool``, ``str``, or one of them ``| None``);
    an int given for a float field becomes a float. Other field types are left to the
    class's own checks."""
    hints = field_types(type(obj))
    for f in dataclasses.fields(obj):
        typ, value = hints[f.name], getattr(obj, f.name)
        args = typing.get_args(typ)
        optional = type(None) in args
        if optional:
            inner = [a for a in args if a is not type(None)]
            if len(inner) != 1:
                continue
            typ = inner[0]
            if value is None:
                continue
        if typ not in (int, float, bool, str):
            continue
        ok = (isinstance(value, bool) if typ is bool else
              isinstance(value, (int, float)) and not isinstance(value, bool) if typ is float else
              isinstance(value, int) and not isinstance(value, bool) if typ is int else isinstance(value, str))
        if not ok:
            kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[typ]
            raise ConfigError(f"{type(obj).__name__}.{f.name}={value!r} must be {kind}"
                              + (" or null" if optional else ""))
        if typ is float and not math.isfinite(value):
            raise ConfigError(f"{type(obj).__name__}.{f.name}={value!r} must be a finite number")
        if typ is float and isinstance(value, int):
            object.__setattr__(obj, f.name, float(value))


def check_choice(owner: str, field: str, value, allowed) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{owner}.{field}={value!r} is not allowed; choose one of {choices}")


class FrozenConfigError(ConfigError, dataclasses.FrozenInstanceError):
    """An assignment to a field of a frozen config (still a ``FrozenInstanceError``)."""


def refuse_assignment(cls: type) -> type:
    """Make assigning to (or deleting) a field of the frozen dataclass ``cls`` a
    ``FrozenConfigError`` naming the field and the way to change it (``dataclasses.replace``)."""
    def setattr_(self, name, value):
        raise FrozenConfigError(f"{cls.__name__}.{name} cannot be assigned: the config is frozen; allowed: "
                                f"dataclasses.replace(config, {name}=...) for a changed copy")

    def delattr_(self, name):
        raise FrozenConfigError(f"{cls.__name__}.{name} cannot be deleted: the config is frozen")

    cls.__setattr__ = setattr_
    cls.__delattr__ = delattr_
    return cls


class Interrupted(GatedAttnError):
    """A run stopped by SIGINT or SIGTERM after saving what it needs to continue;
    ``status`` is the conventional exit status (128 + the signal number)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


# What a user's input or environment can cause (bad values, bad or unreadable files,
# a full or read-only disk); the CLI prints these as one line. Anything else is a bug.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    GatedAttnError, ValueError, OSError, UnicodeError, SafetensorError,
)
