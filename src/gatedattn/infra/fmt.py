"""Number formatting for tables and reports: the one home of these rules."""

from __future__ import annotations

import math
from typing import Any


def shown(text: str) -> str:
    """A file name as text a report, a plot or a terminal can hold: bytes that are not
    UTF-8 (kept by the file system as surrogate escapes) become U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def fmt_value(x: Any, spec: str = ".4f", missing: str = "–") -> str:
    """``format(x, spec)``; ``missing`` for None, ``nan`` / ``inf`` for non-finite floats."""
    if x is None:
        return missing
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def fmt_sig(x: float) -> str:
    """About three significant figures: 1234 -> "1234", 12.34 -> "12.3", 0.1234 -> "0.123"."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}"


def fmt_mean_std(m: dict | None) -> str:
    """``{"mean": .., "std": ..}`` as "mean ± std" to about three significant figures (just
    the mean when the std is unknown; "–" for no value)."""
    if m is None or m.get("mean") is None:
        return "–"
    std = m.get("std")
    if std is None or not math.isfinite(std):
        return fmt_sig(m["mean"])
    return f"{fmt_sig(m['mean'])} ± {fmt_sig(std)}"


def fmt_cell(m: dict | None, digits: int) -> str:
    """A table cell of ``{"mean": .., "std": ..}`` at fixed ``digits``: "mean ± std", the
    mean alone when the std is unknown, "–" for no value, ``nan`` / ``inf`` as such."""
    if m is None or m.get("mean") is None:
        return "–"
    mean, std = m["mean"], m.get("std")
    if not math.isfinite(mean):
        return str(mean)
    if std is not None and math.isfinite(std):
        return f"{mean:.{digits}f} ± {std:.{digits}f}"
    return f"{mean:.{digits}f}"


def finite_or_none(x: float | None) -> float | None:
    """A finite float, or None (strict JSON has no NaN / inf; see ``gatedattn.infra.io.json_safe``)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
