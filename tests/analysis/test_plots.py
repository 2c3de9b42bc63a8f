"""Each plot writes a valid PNG of the requested size, atomically, for odd inputs too, and
draws what it was given: the figure saved (caught on its way to the file) is read back for
its lines, labels, legends, images and scales."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from gatedattn.analysis import plots

pytestmark = pytest.mark.filterwarnings("error")  # a warning from matplotlib/numpy fails a test

NAN = math.nan
SIZE = (4.0, 3.0)  # inches -> 480 x 360 pixels at plots.DPI = 120


def check_png(path: Path, out_dir: Path, size: tuple[float, float] = SIZE) -> None:
    assert path.is_file() and path.stat().st_size > 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[:2] == (round(size[1] * plots.DPI), round(size[0] * plots.DPI))
    assert image[..., :3].std() > 0  # something was drawn
    assert sorted(p.name for p in out_dir.iterdir()) == [path.name]  # no temp file left


@pytest.fixture
def figures(monkeypatch) -> list:
    """The figures the plot functions save, in order (each still written to its file)."""
    saved = []
    real = plots._save

    def save(fig, path):
        saved.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    return saved


def ydata(line) -> list[float]:
    return [round(float(y), 6) for y in np.asarray(line.get_ydata(), dtype=np.float64)]


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []


def curve(n: int, start: float, seed: int = 0) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    steps = list(range(0, 10 * n, 10))
    loss = (start + 3 * np.exp(-np.arange(n) / 20) + 0.05 * rng.standard_normal(n)).tolist()
    return {"steps": steps, "loss": loss}


# --------------------------------------------------------------------------- loss curves


@pytest.mark.parametrize(
    "curves",
    [
        {"baseline": curve(60, 3.2), "g1": curve(60, 3.0, 1)},
        {"g1": curve(1, 3.0)},  # single variant, single point
        {"baseline": {"steps": [0, 10, 20], "loss": [5.0, NAN, 4.0]}},
        {"baseline": [curve(60, 3.2, s) for s in range(3)], "g1": [curve(40, 3.0, s) for s in range(2)]},
    ],
    ids=["two-variants", "single", "nan", "seeds"],
)
def test_plot_loss_curves(tmp_path, curves, figures):
    path = plots.plot_loss_curves(curves, tmp_path / "loss.png", title="train", figsize=SIZE)
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("train", "step", "loss")
    assert len(ax.lines) == len(curves)  # one line a variant (seeds: their mean, with a band)
    for line, (name, c) in zip(ax.lines, sorted(curves.items())):
        assert line.get_color() == plots.variant_color(name) and line.get_label().startswith(name)
        if isinstance(c, dict):
            assert line.get_xdata().tolist() == c["steps"] and np.allclose(line.get_ydata(), c["loss"], equal_nan=True)
        else:
            assert line.get_label() == f"{name} (mean ± std, {len(c)} seeds)"
            assert len(line.get_xdata()) == max(len(run["steps"]) for run in c)
    assert legend(ax) == [line.get_label() for line in ax.lines]
    assert len(ax.collections) == sum(isinstance(c, list) for c in curves.values())  # a std band per seeded variant


def test_seed_band_is_mean_and_sample_std_over_logged_steps():
    runs = [
        {"steps": [0, 10, 20], "loss": [4.0, 3.0, 2.0]},
        {"steps": [0, 10], "loss": [6.0, 5.0]},  # stopped early
        {"steps": [0, 10, 20, 30], "loss": [5.0, NAN, 2.0, 1.5]},
    ]
    steps, mean, std = plots._seed_band(runs)
    assert steps.tolist() == [0, 10, 20, 30]
    assert mean[3] == pytest.approx(1.5) and math.isnan(std[3])  # one seed: no band
    assert mean[0] == pytest.approx(5.0) and std[0] == pytest.approx(1.0)
    assert math.isnan(mean[1])  # a non-finite seed shows as a gap, not a silently better mean
    assert mean[2] == pytest.approx(2.0) and std[2] == pytest.approx(0.0)


# --------------------------------------------------------------------------- per layer, over training


@pytest.mark.parametrize("log", [False, True])
def test_plot_per_layer(tmp_path, log, figures):
    values = {"baseline": [1.0, 800.0, 1053.0, NAN], "g1": [1.0, 50.0, 94.0, 90.0]}
    path = plots.plot_per_layer(
        values, tmp_path / "mact.png", ylabel="M-Act", title="M-Act", log=log, figsize=SIZE
    )
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("M-Act", "layer", "M-Act")
    assert ax.get_yscale() == ("log" if log else "linear") and legend(ax) == ["baseline", "g1"]
    assert [ydata(line)[:3] for line in ax.lines] == [[1.0, 800.0, 1053.0], [1.0, 50.0, 94.0]]
    assert math.isnan(ydata(ax.lines[0])[3]) and ax.lines[0].get_xdata().tolist() == [0, 1, 2, 3]


def test_log_axis_with_nothing_positive_falls_back_to_linear(tmp_path, figures):
    values = {"g1": [0.0, NAN]}
    path = plots.plot_per_layer(
        values, tmp_path / "f.png", ylabel="F-Attn", title="F", log=True, figsize=SIZE
    )
    check_png(path, tmp_path)
    assert figures[0].axes[0].get_yscale() == "linear"


def test_plot_per_layer_single_variant(tmp_path, figures):
    path = plots.plot_per_layer(
        {"g1": [0.05]}, tmp_path / "fattn.png", ylabel="F-Attn", title="F", figsize=SIZE
    )
    check_png(path, tmp_path)
    (line,) = figures[0].axes[0].lines
    assert ydata(line) == [0.05] and line.get_marker() == "o"  # a single point still shows


@pytest.mark.parametrize(
    "series",
    [
        {
            "baseline": {"tokens": [1e6, 2e6, 4e6], "value": [0.1, 0.3, 0.47]},
            "g1": {"tokens": [1e6, 2e6, 4e6], "value": [0.05, 0.04, NAN]},
        },
        {"g1": {"tokens": [5e8], "value": [0.05]}},
    ],
    ids=["two-with-nan", "single"],
)
def test_plot_over_training(tmp_path, series, figures):
    path = plots.plot_over_training(
        series, tmp_path / "fattn_tokens.png", ylabel="F-Attn", title="F-Attn", figsize=SIZE
    )
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("tokens seen", "F-Attn")
    assert [line.get_label() for line in ax.lines] == sorted(series)
    for line, name in zip(ax.lines, sorted(series)):
        assert line.get_xdata().tolist() == series[name]["tokens"]
        assert np.allclose(line.get_ydata(), series[name]["value"], equal_nan=True)


# --------------------------------------------------------------------------- gates, attention maps


def test_plot_gate_histograms(tmp_path, figures):
    edges = np.linspace(0, 1, 101)
    counts = np.r_[5000, 800, np.zeros(97), 3].astype(float)
    hists = {
        "g1": (edges, counts),
        "headwise": (edges.tolist(), (counts[::-1]).tolist()),
        "nan": (edges, np.r_[NAN, counts[1:]]),
        "no scores": (edges, np.zeros(100)),
    }
    path = plots.plot_gate_histograms(hists, tmp_path / "gates.png", figsize=SIZE)
    check_png(path, tmp_path)
    axes = [ax for ax in figures[0].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == sorted(hists)  # a panel a variant
    assert all(ax.get_xlabel() == "gate score" for ax in axes)
    bars = {ax.get_title(): [p.get_height() for p in ax.patches] for ax in axes}
    assert len(bars["g1"]) == 100 and bars["g1"][0] == pytest.approx(5000 / counts.sum())  # fractions of the scores
    assert bars["headwise"][-1] == pytest.approx(bars["g1"][0])  # the reversed counts, drawn reversed


def test_plot_gate_histograms_single_variant_default_size(tmp_path):
    hists = {"g1": (np.linspace(0, 1, 11), np.arange(10))}
    path = plots.plot_gate_histograms(hists, tmp_path / "gates.png")
    check_png(path, tmp_path, size=(3.6, 2.9))


def test_plot_attention_maps(tmp_path, figures):
    T = 100
    sink = np.zeros((T, T))
    sink[:, 0] = 0.9
    sink[np.arange(T), np.arange(T)] += 0.1
    uniform = np.tril(np.ones((T, T)))
    uniform /= uniform.sum(1, keepdims=True)
    uniform[5, 3] = NAN
    maps = {"baseline L3 head-avg": sink, "gated L3": uniform}
    path = plots.plot_attention_maps(maps, tmp_path / "maps.png", title="layer 3", figsize=SIZE)
    check_png(path, tmp_path)
    fig = figures[0]
    assert fig._suptitle.get_text() == "layer 3"
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == list(maps)
    shown = panels[0].images[0].get_array()
    assert shown.shape == (64, 64) and shown[50, 0] == pytest.approx(0.9) and shown[50, 1] == 0  # cropped to 64
    assert np.ma.is_masked(panels[1].images[0].get_array()[5, 3])  # a NaN is left blank, not drawn as 0


def test_plot_attention_maps_single_and_all_nan(tmp_path):
    path = plots.plot_attention_maps(
        {"empty": np.full((4, 4), NAN)}, tmp_path / "m.png", title="t", figsize=SIZE
    )
    check_png(path, tmp_path)
    with pytest.raises(ValueError, match="2-D"):
        plots.plot_attention_maps({"bad": np.zeros(4)}, tmp_path / "bad.png", title="t")


# --------------------------------------------------------------------------- extrapolation


def test_plot_extrapolation(tmp_path, figures):
    lengths = [512, 1024, 2048, 4096]
    results = {
        "baseline": {
            "plain": {"lengths": lengths, "loss": [3.2, 4.5, 6.0, NAN]},
            "ntk": {"lengths": lengths, "loss": [3.2, 3.4, 3.9, 4.6]},
            "yarn": {"lengths": lengths, "loss": [3.2, 3.3, 3.5, 3.9]},
        },
        "g1": {
            "plain": {"lengths": lengths, "loss": [3.0, 4.0, 5.0, 6.0]},
            "pi": {"lengths": lengths, "loss": [3.0, 3.6, 4.1, 4.7]},
        },
    }
    path = plots.plot_extrapolation(results, tmp_path / "extrap.png", train_len=512, figsize=SIZE)
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert ax.get_xlabel() == "evaluation length / training length (512)"
    data = [line for line in ax.lines if line.get_color() != "grey"]  # the grey one marks the training length
    assert len(data) == 5  # one line a variant and method
    assert sorted(ydata(line)[1] for line in data) == [3.3, 3.4, 3.6, 4.0, 4.5]
    assert sorted(line.get_xdata().tolist()[-1] for line in data) == [8.0] * 5  # lengths over the training length
    styles = {(line.get_color(), line.get_linestyle()) for line in data}
    assert len(styles) == 5 and {c for c, _ in styles} == {"#000000", plots.variant_color("g1")}


def test_plot_extrapolation_single(tmp_path):
    results = {"g1": {"yarn": {"lengths": [256], "loss": [3.0]}}}
    path = plots.plot_extrapolation(results, tmp_path / "extrap.png", train_len=256, figsize=SIZE)
    check_png(path, tmp_path)
    with pytest.raises(ValueError, match="train_len"):
        plots.plot_extrapolation(results, tmp_path / "x.png", train_len=0)


def test_plot_loss_vs_cost(tmp_path, figures):
    """The rank sweep's plot: a line of labelled points per family, sorted by cost, on a
    log cost axis; a family of one point is a marker without a line."""
    series = {"hyga-lowrank": [(400.0, 3.1, "d_int 8"), (100.0, 3.4, "d_int 2"), (200.0, 3.2, "d_int 4")],
              "gated": [(2000.0, 3.0, "G1")]}
    path = plots.plot_loss_vs_cost(series, tmp_path / "cost.png", figsize=SIZE)
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "validation loss"
    lowrank, gated = ax.lines
    assert lowrank.get_xdata().tolist() == [100.0, 200.0, 400.0] and ydata(lowrank) == [3.4, 3.2, 3.1]
    assert lowrank.get_linestyle() == "-" and gated.get_linestyle() == "None" and gated.get_marker() == "o"
    assert [t.get_text() for t in ax.texts] == ["d_int 2", "d_int 4", "d_int 8", "G1"]
    assert legend(ax) == ["hyga-lowrank", "gated"]
    assert lowrank.get_color() == plots.variant_color("hyga-lowrank") != gated.get_color()


# --------------------------------------------------------------------------- shared behaviour


def test_empty_input_raises_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        plots.plot_per_layer({}, tmp_path / "x.png", ylabel="y", title="t")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_leaves_no_temp_file(tmp_path, monkeypatch):
    def broken_savefig(self, *args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(plots.Figure, "savefig", broken_savefig)
    target = tmp_path / "loss.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        plots.plot_loss_curves({"g1": curve(5, 3.0)}, target)
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"] and target.read_bytes() == b"old"


def test_png_gets_the_permissions_of_a_normally_created_file(tmp_path):
    reference = tmp_path / "reference"
    reference.write_bytes(b"")
    path = plots.plot_per_layer({"g1": [1.0, 2.0]}, tmp_path / "p.png", ylabel="y", title="t")
    assert path.stat().st_mode == reference.stat().st_mode


def test_overwrite_and_create_parent_dirs(tmp_path):
    target = tmp_path / "report" / "plots" / "loss.png"
    plots.plot_loss_curves({"g1": curve(5, 3.0)}, target, figsize=SIZE)
    first = target.read_bytes()
    plots.plot_loss_curves({"g1": curve(5, 9.0)}, target, figsize=SIZE)
    check_png(target, target.parent)
    assert target.read_bytes() != first


def test_variant_colours_are_stable_and_distinct():
    assert plots.variant_color("baseline") == "#000000"
    names = [f"test-variant-{k}" for k in range(25)]
    plots.assign_colors(reversed(names))
    colours = [plots.variant_color(n) for n in names]
    assert len(set(colours)) == len(names) and "#000000" not in colours
    assert colours == [plots.variant_color(n) for n in names]  # same colour on every call


@pytest.mark.parametrize("values", [
    {"baseline": [0.9, 0.95, 0.99, 0.8, 0.97], "gated": [0.1, 0.2, 0.05, 0.3, 0.15]},
    {"sink": [0.001]},  # one seed
    {"baseline": [0.9, None], "gated": [None]},  # a seed not measured; a series with none
], ids=["five-seeds", "one-seed", "missing"])
def test_plot_seed_strip(tmp_path, values, figures):
    path = plots.plot_seed_strip(values, tmp_path / "strip.png", title="per seed", ylabel="BOS attention",
                                 threshold=0.5, figsize=SIZE)
    check_png(path, tmp_path)
    (ax,) = figures[0].axes
    assert (ax.get_title(), ax.get_ylabel()) == ("per seed", "BOS attention")
    assert [ydata(line) for line in ax.lines] == [[0.5, 0.5]]  # the threshold
    dots = sorted(float(y) for c in ax.collections if type(c).__name__ == "PathCollection" for y in c.get_offsets()[:, 1])
    assert dots == sorted(v for vs in values.values() for v in vs if v is not None)


def test_plot_seed_strip_draws_a_dot_per_seed(tmp_path, monkeypatch):
    drawn = []
    real = plots.Figure.add_subplot

    def spy(fig, *a, **kw):
        ax = real(fig, *a, **kw)
        drawn.append(ax)
        return ax

    monkeypatch.setattr(plots.Figure, "add_subplot", spy)
    plots.plot_seed_strip({"a": [1.0, 2.0, 3.0], "b": [None, 5.0]}, tmp_path / "s.png", title="t", ylabel="y")
    offsets = [c.get_offsets() for c in drawn[0].collections if type(c).__name__ == "PathCollection"]  # the dots
    assert [len(o) for o in offsets] == [3, 1]
    assert sorted(offsets[0][:, 1].tolist()) == [1.0, 2.0, 3.0] and offsets[1][0, 1] == 5.0
    with pytest.raises(ValueError, match="plot_seed_strip: nothing to plot"):
        plots.plot_seed_strip({}, tmp_path / "e.png", title="t", ylabel="y")
