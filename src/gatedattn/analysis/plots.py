"""Report plots: plain Python data in, one PNG out.

Every function takes lists/dicts of floats or numpy arrays, writes a PNG atomically (a temp
file in the target directory, then ``os.replace``) and returns the path. Figures are drawn
with the Agg canvas directly (``matplotlib.figure.Figure`` + ``FigureCanvasAgg``), never
through pyplot: no window can open, and the caller's matplotlib backend is left alone.

Each variant name keeps one colour in all plots of a process: colours are handed out on first
use (in sorted name order within a call), ``"baseline"`` is always black. Call
``assign_colors(all_variant_names)`` first to fix the colours for a whole report.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, FixedLocator, MaxNLocator, NullFormatter, NullLocator

__all__ = [
    "assign_colors",
    "figure",
    "save_figure",
    "plot_attention_maps",
    "plot_extrapolation",
    "plot_first_token_map",
    "plot_gate_histograms",
    "plot_loss_curves",
    "plot_over_training",
    "plot_per_layer",
    "plot_sink_profile",
    "variant_color",
]

DPI = 120
BASELINE = "baseline"
_PALETTE = [  # tab10 without grey, then the lighter tab20 shades
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94", "#f7b6d2",
]  # fmt: skip
_METHOD_STYLES = {"plain": "-", "ntk": "--", "yarn": ":"}
_EXTRA_STYLES = ["-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]
_colors: dict[str, str] = {BASELINE: "#000000"}

Curve = Mapping[str, Sequence[float]]
PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------- colours, saving


def _next_color(index: int) -> str:
    if index < len(_PALETTE):
        return _PALETTE[index]
    hue = (index * 0.618033988749895) % 1.0  # golden-ratio hues once the palette runs out
    return to_hex(hsv_to_rgb((hue, 0.65, 0.85)))


def assign_colors(names: Iterable[str]) -> None:
    """Give every not yet coloured name in ``names`` the next palette colour, in sorted order."""
    for name in sorted(set(names) - _colors.keys()):
        _colors[name] = _next_color(len(_colors) - 1)


def variant_color(name: str) -> str:
    """The colour (hex string) of a variant name, assigned on first use."""
    assign_colors([name])
    return _colors[name]


def _figure(figsize: tuple[float, float]) -> Figure:
    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: PathLike) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # not tempfile.mkstemp: its 0600 mode would survive the rename; open() follows the umask
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            fig.savefig(f, format="png", dpi=DPI)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _require(data: Mapping, what: str) -> None:
    if not data:
        raise ValueError(f"{what}: nothing to plot")


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", frameon=False)


def _log_y(ax) -> None:
    """Log y axis, unless nothing drawn is positive (matplotlib would warn and show nothing)."""
    ys = [np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.get_lines()]
    if any((np.isfinite(y) & (y > 0)).any() for y in ys):
        ax.set_yscale("log")


def _marker(n_points: int) -> str | None:
    """Draw markers on short series so a single point is still visible."""
    return "o" if n_points <= 30 else None


# --------------------------------------------------------------------------- loss curves


def _seed_band(runs: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) over seeds on the union of logged steps.

    At each step, seeds that logged it count; a non-finite value makes the mean NaN (a gap).
    std (ddof=1) is NaN where fewer than two seeds logged the step.
    """
    steps = np.unique(np.concatenate([np.asarray(r["steps"], dtype=np.float64) for r in runs]))
    values = np.full((len(runs), len(steps)), np.nan)
    logged = np.zeros_like(values, dtype=bool)
    for k, run in enumerate(runs):
        cols = np.searchsorted(steps, np.asarray(run["steps"], dtype=np.float64))
        values[k, cols] = np.asarray(run["loss"], dtype=np.float64)
        logged[k, cols] = True
    n = logged.sum(axis=0)
    filled = np.where(logged, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(axis=0) / n
        var = np.where(logged, (filled - mean) ** 2, 0.0).sum(axis=0) / (n - 1)
    std = np.where(n > 1, np.sqrt(var), np.nan)
    return steps, mean, std


def plot_loss_curves(
    curves: Mapping[str, Curve | Sequence[Curve]],
    path: PathLike,
    title: str = "Training loss",
    ylabel: str = "loss",
    xlabel: str = "step",
    log: bool = False,
    figsize: tuple[float, float] = (7.0, 4.5),
) -> Path:
    """Loss vs step per variant.

    curves: variant -> dict(steps=[...], loss=[...]), or a list of such dicts (one per seed),
    drawn as the mean with a shaded +-1 std band. ``log`` puts the loss on a log axis.
    """
    _require(curves, "plot_loss_curves")
    assign_colors(curves)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    for name, data in curves.items():
        runs = [data] if isinstance(data, Mapping) else list(data)
        steps, mean, std = _seed_band(runs)
        color = variant_color(name)
        label = name if len(runs) == 1 else f"{name} (mean ± std, {len(runs)} seeds)"
        ax.plot(steps, mean, color=color, label=label, lw=1.4, marker=_marker(len(steps)), ms=3)
        if len(runs) > 1:
            ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2, lw=0)
    if log:
        _log_y(ax)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


# --------------------------------------------------------------------------- per layer / over training


def _lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: PathLike,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log: bool,
    figsize: tuple[float, float],
    marker_size: float,
    tokens_axis: bool,
) -> Path:
    """One line per variant from (x, y) pairs, in the variant's colour."""
    assign_colors(series)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    for name, (xs, ys) in series.items():
        ys = np.asarray(ys, dtype=np.float64)
        marker = _marker(len(ys)) if tokens_axis else "o"
        ax.plot(np.asarray(xs, dtype=np.float64), ys, color=variant_color(name), label=name, marker=marker, ms=marker_size)
    if log:
        _log_y(ax)
    if tokens_axis:
        ax.xaxis.set_major_formatter(EngFormatter())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def plot_per_layer(
    values: Mapping[str, Sequence[float]],
    path: PathLike,
    ylabel: str,
    title: str,
    log: bool = False,
    figsize: tuple[float, float] = (7.0, 4.5),
) -> Path:
    """One value per layer per variant (e.g. F-Attn or M-Act per layer); x is the layer index."""
    _require(values, "plot_per_layer")
    series = {name: (range(len(ys)), ys) for name, ys in values.items()}
    return _lines(series, path, xlabel="layer", ylabel=ylabel, title=title, log=log, figsize=figsize,
                  marker_size=3.5, tokens_axis=False)


def plot_over_training(
    series: Mapping[str, Curve],
    path: PathLike,
    ylabel: str,
    title: str,
    log: bool = False,
    figsize: tuple[float, float] = (7.0, 4.5),
) -> Path:
    """A metric vs tokens seen per variant; series: variant -> dict(tokens=[...], value=[...])."""
    _require(series, "plot_over_training")
    pairs = {name: (s["tokens"], s["value"]) for name, s in series.items()}
    return _lines(pairs, path, xlabel="tokens seen", ylabel=ylabel, title=title, log=log, figsize=figsize,
                  marker_size=3, tokens_axis=True)


# --------------------------------------------------------------------------- gates


def plot_gate_histograms(
    hists: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: PathLike,
    title: str = "Gate score distribution",
    figsize: tuple[float, float] | None = None,
) -> Path:
    """One panel per variant: histogram (bin_edges, counts) as a fraction of scores, log y."""
    _require(hists, "plot_gate_histograms")
    assign_colors(hists)
    ncols = min(len(hists), 3)
    nrows = math.ceil(len(hists) / ncols)
    fig = _figure(figsize or (3.6 * ncols, 2.9 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True)
    for ax, (name, (edges, counts)) in zip(axes.flat, hists.items(), strict=False):
        edges = np.asarray(edges, dtype=np.float64)
        counts = np.asarray(counts, dtype=np.float64)
        total = np.nansum(counts)
        if total > 0:
            ax.bar(edges[:-1], counts / total, width=np.diff(edges), align="edge", color=variant_color(name))
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no scores", transform=ax.transAxes, ha="center", va="center")
        ax.set(title=name, xlabel="gate score", ylabel="fraction of scores")
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(hists) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    return _save(fig, path)


# --------------------------------------------------------------------------- attention maps


def plot_attention_maps(
    maps: Mapping[str, np.ndarray],
    path: PathLike,
    title: str,
    max_len: int | None = 64,
    figsize: tuple[float, float] | None = None,
) -> Path:
    """Side-by-side heatmaps (rows = queries, columns = keys) on one shared colour scale.

    Each map is cropped to its first ``max_len`` queries and keys (None: no crop) so that the
    first-token column stays visible; query 0 is the top row, key 0 the left column.
    """
    _require(maps, "plot_attention_maps")
    crop = slice(None) if max_len is None else slice(0, max_len)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in maps.items()}
    if any(a.ndim != 2 for a in arrays.values()):
        raise ValueError("plot_attention_maps: every map must be a 2-D (query, key) array")
    arrays = {k: a[crop, crop] for k, a in arrays.items()}
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays.values()])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if vmax <= vmin:
        vmax = vmin + 1.0
    fig = _figure(figsize or (3.4 * len(arrays) + 0.8, 3.6))
    axes = fig.subplots(1, len(arrays), squeeze=False)[0]
    for ax, (name, a) in zip(axes, arrays.items(), strict=True):
        image = ax.imshow(a, cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
        ax.set(title=name, xlabel="key position", ylabel="query position")
    fig.colorbar(image, ax=list(axes), label="attention probability", shrink=0.9)
    fig.suptitle(title)
    return _save(fig, path)


# --------------------------------------------------------------------------- sink figures


def _floats(values: Sequence[float | None]) -> np.ndarray:
    """A list (or nested lists) of floats with None (a JSON result's missing value) as NaN."""
    def conv(v):
        return [conv(x) for x in v] if isinstance(v, (list, tuple)) else (np.nan if v is None else v)

    return np.asarray(conv(list(values)), dtype=np.float64)


def plot_first_token_map(
    result: Mapping,
    path: PathLike,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
) -> Path:
    """A layer x head heat map of first-token attention (``f_attn_per_head`` of an
    ``analyze`` result: per head, the mean attention on position 0 over queries 1..T-1),
    on the fixed scale [0, 1]; layer 0 is the top row. Small maps carry their values."""
    heads = result.get("f_attn_per_head")
    if not heads:
        raise ValueError("plot_first_token_map: the result has no f_attn_per_head")
    a = _floats(heads)
    if a.ndim != 2:
        raise ValueError("plot_first_token_map: f_attn_per_head must be a layer x head table")
    L, H = a.shape
    fig = _figure(figsize or (max(4.0, 0.5 * H + 2.2), max(3.0, 0.32 * L + 1.6)))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(a), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest",
                      aspect="auto")
    if L * H <= 300:
        for (i, j), v in np.ndenumerate(a):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if v < 0.5 else "black")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="head", ylabel="layer",
           title=title or f"{result.get('variant', '')}: attention on the first token per head".lstrip(": "))
    fig.colorbar(image, ax=ax, label="F-Attn (queries 1..T-1)")
    return _save(fig, path)


def _uniform_f_attn(seq_len: object) -> float | None:
    """F-Attn of uniform causal attention over ``seq_len`` positions: mean over queries
    i = 1..T-1 of 1 / (i + 1) (docs/design.md section 4)."""
    if not isinstance(seq_len, int) or seq_len < 2:
        return None
    return sum(1.0 / (i + 1) for i in range(1, seq_len)) / (seq_len - 1)


def plot_sink_profile(
    result: Mapping,
    path: PathLike,
    title: str | None = None,
    figsize: tuple[float, float] = (7.0, 7.5),
) -> Path:
    """Three panels per layer of an ``analyze`` result, sharing the layer axis: F-Attn
    (dotted: uniform causal attention), the value drain ``||v_0|| / mean ||v_i||`` and the
    residual peak ``||h_0|| / mean ||h_i||`` (log scale; dotted: 1, no difference)."""
    f_attn = result.get("f_attn_per_layer")
    if not f_attn:
        raise ValueError("plot_sink_profile: the result has no f_attn_per_layer")
    name = str(result.get("variant", ""))
    color = variant_color(name)
    panels = (("f_attn_per_layer", "F-Attn", False), ("value_drain_per_layer", "value drain |v0| / |vi|", True),
              ("residual_peak_per_layer", "residual peak |h0| / |hi|", True))
    fig = _figure(figsize)
    axes = fig.subplots(3, 1, sharex=True)
    for ax, (key, label, log) in zip(axes, panels, strict=True):
        ys = _floats(result.get(key) or [None] * len(f_attn))
        ax.plot(np.arange(len(ys)), ys, color=color, marker="o", ms=3.5, label=name or None)
        if log:
            ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
            _log_y(ax)
        ax.set(ylabel=label)
        ax.grid(alpha=0.3)
    uniform = _uniform_f_attn(result.get("seq_len"))
    if uniform is not None:
        axes[0].axhline(uniform, color="0.5", lw=0.8, ls=":", label="uniform")
    axes[0].set_ylim(0.0, 1.0)
    _legend(axes[0])
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set(xlabel="layer")
    fig.suptitle(title or f"{name}: the first position per layer".lstrip(": "))
    return _save(fig, path)


# --------------------------------------------------------------------------- extrapolation


def _method_style(method: str, order: Sequence[str]):
    if method in _METHOD_STYLES:
        return _METHOD_STYLES[method]
    extras = [m for m in order if m not in _METHOD_STYLES]
    return _EXTRA_STYLES[extras.index(method) % len(_EXTRA_STYLES)]


def plot_extrapolation(
    results: Mapping[str, Mapping[str, Curve]],
    path: PathLike,
    train_len: int,
    title: str = "Length extrapolation",
    ylabel: str = "validation loss",
    figsize: tuple[float, float] = (7.0, 4.5),
) -> Path:
    """Loss vs evaluation length in multiples of ``train_len`` (log2 x axis).

    results: variant -> method ("plain", "ntk", "yarn", ...) -> dict(lengths=[...], loss=[...]).
    Colour encodes the variant, line style the method; two legends say which is which.
    """
    _require(results, "plot_extrapolation")
    assign_colors(results)
    if train_len <= 0:
        raise ValueError(f"train_len must be positive; got {train_len}")
    seen = {m for per_method in results.values() for m in per_method}
    methods = [m for m in _METHOD_STYLES if m in seen] + sorted(seen - _METHOD_STYLES.keys())
    fig = _figure(figsize)
    ax = fig.add_subplot()
    multiples: set[float] = set()
    for name, per_method in results.items():
        for method, r in per_method.items():
            x = np.asarray(r["lengths"], dtype=np.float64) / train_len
            multiples.update(x.tolist())
            ax.plot(x, np.asarray(r["loss"], dtype=np.float64), color=variant_color(name),
                    ls=_method_style(method, methods), marker="o", ms=3.5)  # fmt: skip
    ax.set_xscale("log", base=2)
    ticks = sorted(m for m in multiples if m > 0)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}×")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set(xlabel=f"evaluation length / training length ({train_len})", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    variant_handles = [Line2D([], [], color=variant_color(n), label=n) for n in results]
    method_handles = [Line2D([], [], color="grey", ls=_method_style(m, methods), label=m) for m in methods]
    legend = {"fontsize": "small", "title_fontsize": "small", "frameon": False}
    fig.legend(handles=variant_handles, title="variant", loc="outside right upper", **legend)
    fig.legend(handles=method_handles, title="RoPE", loc="outside right lower", **legend)
    return _save(fig, path)


def plot_sink_calibration(
    series: Mapping[str, Mapping[str, Sequence[float]]],
    path: PathLike,
    title: str = "Baseline first-token attention against tokens seen",
    figsize: tuple[float, float] = (11.0, 4.5),
) -> Path:
    """Two panels, one line per setting: F-Attn averaged over layers and F-Attn of the
    strongest layer, both as multiples of uniform causal attention (1 = no sink), against
    tokens seen. series: name -> dict(tokens=[...], mean=[...], strongest=[...])."""
    _require(series, "plot_sink_calibration")
    assign_colors(series)
    fig = _figure(figsize)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, key, label in zip(axes, ("mean", "strongest"), ("averaged over layers", "strongest layer")):
        for name, s in series.items():
            ax.plot(np.asarray(s["tokens"], dtype=np.float64), np.asarray(s[key], dtype=np.float64),
                    color=variant_color(name), label=name, marker=_marker(len(s["tokens"])), ms=3)
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax.axhline(2.0, color="0.5", lw=0.8, ls="--")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set(xlabel="tokens seen", title=f"F-Attn {label}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("F-Attn / uniform (dashed: the sink rule's 2x)")
    _legend(axes[1])
    fig.suptitle(title)
    return _save(fig, path)


def plot_loss_vs_cost(
    series: Mapping[str, Sequence[tuple[float, float, str]]],
    path: PathLike,
    xlabel: str = "gate FLOPs per attention layer (log scale)",
    ylabel: str = "validation loss",
    title: str = "Loss against gate cost",
    figsize: tuple[float, float] = (7.0, 4.5),
) -> Path:
    """One line of labelled points per family: series: name -> [(cost, loss, label), ...]."""
    _require(series, "plot_loss_vs_cost")
    assign_colors(series)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    for name, pts in series.items():
        pts = sorted(pts)
        xs = np.asarray([p[0] for p in pts], dtype=np.float64)
        ys = np.asarray([p[1] for p in pts], dtype=np.float64)
        ax.plot(xs, ys, color=variant_color(name), label=name, marker="o", ms=5, ls="-" if len(pts) > 1 else "none")
        for x, y, label in pts:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def plot_panels_over_tokens(
    panels: Sequence[tuple[str, str, Mapping[str, tuple[Sequence[float], Sequence[float]]], Mapping[float, str]]],
    path: PathLike,
    title: str,
    figsize_per_panel: tuple[float, float] = (4.6, 4.2),
) -> Path:
    """Side-by-side panels sharing the x axis (tokens seen), one line per series name,
    colours consistent across panels. panels: (title, ylabel, {name: (tokens, values)},
    {y: label} of dotted reference lines)."""
    if not panels or not any(series for _, _, series, _ in panels):
        raise ValueError("plot_panels_over_tokens: no data")
    assign_colors(dict.fromkeys(n for _, _, series, _ in panels for n in series))
    fig = _figure((figsize_per_panel[0] * len(panels), figsize_per_panel[1]))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (panel_title, ylabel, series, hlines) in zip(axes, panels):
        for name, (x, y) in series.items():
            ax.plot(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), color=variant_color(name),
                    label=name, marker=_marker(len(x)), ms=3, lw=1.2)
        for level, label in hlines.items():
            ax.axhline(level, color="0.5", lw=0.8, ls=":")
            ax.annotate(label, (0.01, level), xycoords=("axes fraction", "data"), fontsize=7, color="0.4",
                        va="bottom")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set(xlabel="tokens seen", ylabel=ylabel, title=panel_title)
        ax.grid(alpha=0.3)
    _legend(axes[-1])
    fig.suptitle(title)
    return _save(fig, path)


def plot_ratio_bars(
    ratios: Mapping[str, Mapping[str, float]],
    path: PathLike,
    title: str,
    ylabel: str,
    threshold: float | None = None,
    figsize: tuple[float, float] = (9.0, 4.2),
) -> Path:
    """Grouped bars: for each setting (x), one bar per series. ratios: series -> {setting:
    value}. ``threshold`` is drawn as a dashed line."""
    _require(ratios, "plot_ratio_bars")
    settings_ = list(dict.fromkeys(k for r in ratios.values() for k in r))
    assign_colors(ratios)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    width = 0.8 / len(ratios)
    x = np.arange(len(settings_))
    for i, (name, values) in enumerate(ratios.items()):
        ys = [values.get(s, np.nan) for s in settings_]
        ax.bar(x + (i - (len(ratios) - 1) / 2) * width, ys, width, color=variant_color(name), label=name)
    if threshold is not None:
        ax.axhline(threshold, color="0.3", lw=1.0, ls="--", label=f"{threshold:g}")
    ax.set_xticks(x, settings_, rotation=35, ha="right")
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    return _save(fig, path)


def plot_seed_strip(
    values: Mapping[str, Sequence[float | None]],
    path: PathLike,
    title: str,
    ylabel: str,
    threshold: float | None = None,
    figsize: tuple[float, float] = (5.5, 4.2),
) -> Path:
    """One column per series (x) with a dot per seed and a bar at the seeds' mean: the
    spread behind a mean ± std. values: series -> per-seed values (None: not measured,
    left out). ``threshold`` is drawn as a dashed line."""
    _require(values, "plot_seed_strip")
    assign_colors(values)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    for i, (name, seeds) in enumerate(values.items()):
        ys = np.array([v for v in seeds if v is not None], dtype=np.float64)
        if not ys.size:
            continue
        offsets = np.linspace(-0.15, 0.15, ys.size) if ys.size > 1 else np.zeros(1)
        ax.scatter(i + offsets, ys, s=22, color=variant_color(name), zorder=3)
        ax.hlines(ys.mean(), i - 0.3, i + 0.3, color=variant_color(name), lw=2.0)
    if threshold is not None:
        ax.axhline(threshold, color="0.3", lw=1.0, ls="--", label=f"{threshold:g}")
    ax.set_xticks(np.arange(len(values)), list(values), rotation=35, ha="right")
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    return _save(fig, path)


def figure(figsize: tuple[float, float]) -> Figure:
    """A new figure on the Agg canvas, for plots a study draws itself (save with :func:`save_figure`)."""
    return _figure(figsize)


def save_figure(fig: Figure, path: PathLike) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically; returns the path."""
    return _save(fig, path)
