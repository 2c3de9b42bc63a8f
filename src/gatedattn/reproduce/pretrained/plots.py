"""The real-model study's plots: the no-op curve, the arms' training, the per-head
figures and the streaming curve (the sink profile and first-token map come from
:mod:`gatedattn.analysis.plots`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from matplotlib.ticker import NullFormatter, NullLocator

from gatedattn.analysis.plots import figure, plot_first_token_map, plot_sink_profile, save_figure, variant_color

MODE_STYLE = {"drop": "-", "keep": ":"}
SMOOTH = 5  # steps of the running mean of the training curves (every window is different text)


def _windows_axis(ax, ws) -> None:
    ax.set_xscale("log")
    ax.set_xticks(ws, [str(int(w)) for w in ws])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _running_mean(ys, n: int = SMOOTH) -> np.ndarray:
    ys = np.asarray(ys, dtype=np.float64)
    c = np.cumsum(np.insert(ys, 0, 0.0))
    k = np.minimum(np.arange(1, len(ys) + 1), n)
    return (c[1:] - c[np.arange(1, len(ys) + 1) - k]) / k


def plot_noop(results: dict, path: Path) -> Path:
    """Loss with the first token kept and dropped, and their gap, over the window W."""
    points = [p for p in results["noop"] if p["window"]]
    full = next(p for p in results["noop"] if p["window"] == 0)
    ws = np.array([p["window"] for p in points], dtype=float)
    fig = figure((9.0, 3.8))
    ax, bx = fig.subplots(1, 2)
    ax.plot(ws, [p["kept"] for p in points], "o-", color="black", label="first token kept")
    ax.plot(ws, [p["dropped"] for p in points], "o-", color="tab:red", label="first token dropped")
    ax.axhline(full["kept"], color="black", ls=":", lw=1, label="full attention")
    ax.axhline(full["dropped"], color="tab:red", ls=":", lw=1, label="full attention, first token dropped")
    ax.set(xlabel="attention window W (keys per query)", ylabel="held-out loss (nats)",
           title="loss under window attention")
    _windows_axis(ax, ws)
    ax.legend(fontsize=7)
    bx.errorbar(ws, [p["gap"] for p in points], yerr=[2 * p["gap_se"] for p in points], fmt="o-", color="tab:red",
                capsize=3, label="window W")
    bx.errorbar([ws.max() * 1.6], [full["gap"]], yerr=[2 * full["gap_se"]], fmt="s", color="black", capsize=3,
                label="full attention")
    if results.get("window"):
        bx.axvline(results["window"], color="grey", ls="--", lw=1, label=f"arms' W = {results['window']}")
    bx.axhline(0, color="grey", lw=0.5)
    bx.set(xlabel="attention window W (right: full attention)", ylabel="Δ loss, dropped − kept (nats; ± 2 SE)",
           title="what the first token is worth")
    _windows_axis(bx, ws)
    bx.legend(fontsize=7)
    return save_figure(fig, path)


def plot_arm_curves(results: dict, path: Path) -> Path:
    """Per arm: the training loss, first token dropped (solid) and kept (dotted), and below
    it the paired loss (dropped − kept) on the development windows at each look the stopping
    rule reads (faint: the same on each training batch), with the step each data order
    stopped at."""
    arms = results["arms"]
    fig = figure((3.6 * len(arms), 6.4))
    axes = np.asarray(fig.subplots(2, len(arms), sharey="row", squeeze=False))
    u = results["untouched"]
    for col, (name, arm) in enumerate(arms.items()):
        ax, bx = axes[0, col], axes[1, col]
        for seed, run in enumerate(arm["runs"]):
            alpha = 1.0 - 0.25 * seed
            for mode, style in MODE_STYLE.items():
                ax.plot(range(1, len(run[mode]["curve"]) + 1), _running_mean(run[mode]["curve"]), style,
                        color=variant_color(name), alpha=alpha,
                        label=f"{'dropped' if mode == 'drop' else 'kept'}, order {seed}")
            paired, looks = run.get("paired_curve"), run.get("looks")
            if looks:  # the development windows' paired loss the rule reads, and where it stopped
                bx.plot(range(1, len(paired) + 1), paired, color=variant_color(name), alpha=0.2 * alpha, lw=0.8)
                xs, ys = zip(*looks)
                bx.plot(xs, ys, ".-", color=variant_color(name), alpha=alpha, label=f"order {seed}")
                bx.plot([xs[-1]], [ys[-1]], "x" if run.get("converged") else "o", color="black", alpha=alpha)
            elif paired:
                steps = range(1, len(paired) + 1)
                bx.plot(steps, _running_mean(paired), color=variant_color(name), alpha=alpha, label=f"order {seed}")
                bx.plot([len(paired)], [_running_mean(paired)[-1]], "x" if run.get("converged") else "o",
                        color="black", alpha=alpha)
        ax.axhline(u["dropped"], color="tab:red", lw=0.8, ls="--", label="untouched, dropped (held out)")
        ax.axhline(u["kept"], color="black", lw=0.8, ls="--", label="untouched, kept (held out)")
        bx.axhline(u["gap"], color="tab:red", lw=0.8, ls="--", label="untouched gap (held out)")
        bx.axhline(0, color="grey", lw=0.5)
        ax.set(title=f"{name} ({arm['params']:,} parameters)")
        bx.set(xlabel="step")
    axes[0, 0].set_ylabel(f"training loss (nats, running mean of {SMOOTH})")
    axes[1, 0].set_ylabel("paired loss, dropped − kept (nats)")
    axes[0, -1].legend(fontsize=6)
    axes[1, -1].legend(fontsize=6, title="dots: the rule's looks (dev windows); x: stopped by the rule, o: at the cap",
                       title_fontsize=6)
    return save_figure(fig, path)


def plot_heads(results: dict, path: Path) -> Path:
    """Per (layer, head) from the arms' first layer: the untouched model's attention on the
    first token (W, kept) against the trained sink's probability and the gate's score."""
    start = results["start_layer"]
    alpha = np.array([a for layer in results["untouched"]["heads"]["first"][start:] for a in layer])
    panels = [(n, k) for n, k in (("sink", "sink"), ("gate-headwise", "gate"), ("gate", "gate"))
              if n in results["arms"]]
    fig = figure((4.0 * max(1, len(panels)), 3.6))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(panels))))
    for ax, (name, key) in zip(axes, panels):
        run = results["arms"][name]["runs"][0]["drop"]["heads"][key][start:]
        ax.scatter(alpha, [v for layer in run for v in layer], s=10, color=variant_color(name))
        ax.set(xlabel="untouched: attention on the first token", title=f"{name}, first token dropped",
               ylabel="sink probability" if key == "sink" else "mean gate score")
    return save_figure(fig, path)


def plot_streaming(results: dict, path: Path) -> Path:
    s = results["streaming"]
    fig = figure((7.0, 3.8))
    ax = fig.add_subplot()
    styles = {"full": ("full attention", "grey"), "kept": (f"W {s['window']}, first token kept", "black"),
              "dropped": (f"W {s['window']}, first token dropped", "tab:red")}
    for key, ys in s["curves"].items():
        label, color = styles.get(key, (f"W {s['window']}, dropped, {key} trained", variant_color(key)))
        ax.plot(s["positions"][:len(ys)], ys, color=color, label=label, lw=1.6 if key in styles else 1.0)
    ax.axvline(s["window"], color="grey", ls="--", lw=0.8)
    ax.set(xlabel="position", ylabel=f"loss (nats, mean of {s['bin']} positions)",
           title="streaming: a long held-out text under window attention")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def make_plots(results: dict, out: Path) -> dict[str, str]:
    """Every plot the results allow, in ``out``; name -> file name."""
    made = {"sink_profile": plot_sink_profile(results["sink"], out / "lm_sink_profile.png",
                                              title=f"{results['model']['name']}: the first position, per layer"),
            "first_token_map": plot_first_token_map(results["sink"], out / "lm_first_token_map.png"),
            "noop": plot_noop(results, out / "lm_noop_curve.png")}
    if results.get("arms"):
        made["arm_curves"] = plot_arm_curves(results, out / "lm_arm_training.png")
        made["heads"] = plot_heads(results, out / "lm_heads.png")
    if results.get("streaming"):
        made["streaming"] = plot_streaming(results, out / "lm_streaming.png")
    return {k: Path(v).name for k, v in made.items()}
