"""The declared types of a config dataclass's fields, resolved once per class."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Mapping


@functools.cache
def field_types(cls: type) -> Mapping[str, Any]:
    """Each annotated name of ``cls`` (a dataclass) -> its resolved type, read-only.

    ``typing.get_type_hints`` evaluates every annotation string again on each call (the
    package's modules use ``from __future__ import annotations``), and configs are checked
    each time one is built, so the answer is kept per class."""
    return types.MappingProxyType(typing.get_type_hints(cls))
