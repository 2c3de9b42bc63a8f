"""report.md and the plot of the sink calibration (``--study calibrate``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatedattn.analysis.plots import plot_sink_calibration
from gatedattn.infra.io import atomic_write_text
from gatedattn.reproduce.verdicts import uniform_first_token_attention


def sink_score(row: dict[str, Any]) -> float:
    """How strong a lever's baseline sink is, comparable across context lengths: F-Attn
    of its strongest layer as a multiple of the uniform value."""
    return row["f_attn_strongest"] / row["uniform"]


def calibration_series(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per lever: tokens, mean and strongest-layer F-Attn over training, relative to uniform."""
    series = {}
    for r in rows:
        o = r["over_training"]
        if not o.get("tokens"):
            continue
        u = r["uniform"]
        series[r["lever"]] = {"tokens": o["tokens"], "mean": [v / u for v in o["f_attn"]],
                              "strongest": [v / u for v in o.get("f_attn_max") or o["f_attn"]]}
    return series


def calibration_table(rows: list[dict[str, Any]]) -> list[str]:
    sessions = len({r.get("session", 1) for r in rows}) > 1
    lines = ["| lever | setting | " + ("call | " if sessions else "") + "steps | tokens | val loss | F-Attn (mean) | "
             "F-Attn (strongest layer) | strongest / uniform | Sink^ε | M-Act / median |",
             "|---|---|" + ("---:|" if sessions else "") + "---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        call = f"{r.get('session', 1)} | " if sessions else ""
        lines.append(
            f"| `{r['lever']}` | {r['what']} | {call}{r['steps']} | {r['tokens'] / 1e6:.2f} M | {r['val_loss']:.3f} | "
            f"{r['f_attn']:.4f} | {r['f_attn_strongest']:.4f} (layer {r['strongest_layer']}) | "
            f"{sink_score(r):.2f}× | {r['sink_eps']:.3f} | {r['m_act_ratio']:.0f} |")
    return lines


def _setup_lines(meta: dict[str, Any], cfg: dict[str, Any], cmds: list[str]) -> list[str]:
    """The setup table: every call's command, machine, software, precision, date."""
    p = meta["precision"]
    return [
        "| | |",
        "|---|---|",
        *(f"| command{f' {i + 1}' if len(cmds) > 1 else ''} | `{c}` |" for i, c in enumerate(cmds)),
        f"| machine | {meta['machine']} |",
        f"| software | python {meta['python']}, torch {meta['torch']}, gatedattn {meta['gatedattn']} |",
        f"| precision | {p.get('dtype', '?')} ({p.get('reason', '')}) |",
        f"| date | {meta['started']} · {meta['duration_min']:.1f} min{' (the last call)' if len(cmds) > 1 else ''} |",
        *([f"| every lever also | {', '.join(f'`{x}`' for x in cfg['base_sets'])} (so a lever's setting column "
           "reads on top of these) |"] if cfg.get("base_sets") else []),
    ]


def _ranking_lines(results: dict[str, Any]) -> list[str]:
    """The levers strongest sink first, and the ranking it replaces where one moved."""
    lines = [f"Strongest sink first: {', '.join(f'`{n}`' for n in results.get('ranking', []))}.", ""]
    before = results.get("ranking_before")
    if before:
        lines += [f"This ranking replaces the one the runs were first reported with "
                  f"({', '.join(f'`{n}`' for n in before)}), whose uniform level counted one position too many "
                  "after BOS.", ""]
    return lines


def write_calibration_report(results: dict[str, Any], out: str | Path) -> Path:
    out = Path(out)
    rows, meta, cfg = results["levers"], results["meta"], results["config"]
    cmds = results.get("commands") or [meta["command"]]
    series = calibration_series(rows)
    if series:
        plot_sink_calibration(series, out / "calibration.png")
    budget = (f"{cfg['steps']} steps each" if cfg.get("steps") is not None
              else f"{cfg['minutes_per_run']:g} minutes of training steps each (timed here first)")
    lines = [
        "# gatedattn sink calibration",
        "",
        "When does the baseline's first-token attention sink form on natural text? Each lever changes one thing "
        "of the recipe and trains the `baseline` alone for the same wall-clock time "
        f"({budget}); F-Attn and Sink^ε are measured per layer during and after training.",
        "",
        *_setup_lines(meta, cfg, cmds),
        "",
        "## Results",
        "",
        *calibration_table(rows),
        "",
        *(["*call*: which of the commands above wrote the row (a lever is timed and trained by the call that starts "
            "it; a run an interrupted call left behind is finished, not retrained, by the next).", ""]
          if len({r.get("session", 1) for r in rows}) > 1 else []),
        "F-Attn: attention on token 0 (the BOS), averaged over heads and queries; *mean* averages the layers, "
        "*strongest* is the layer where it is largest. Uniform causal attention gives (1/T)·Σ 1/(i+1) "
        f"({uniform_first_token_attention(255):.4f} at T 256: 255 positions after BOS); the reproduction's F-Attn claims need 2× that, its Sink^ε claim a head whose mean "
        "attention on token 0 exceeds 0.3.",
        "",
        *_ranking_lines(results),
        *([f"The main job (`gatedattn reproduce`) trains with the recipe of `{results['main_default']}`.", ""]
          if results.get("main_default") else []),
    ]
    if series:
        lines += ["## F-Attn over training", "", "![calibration](calibration.png)", ""]
    lines += ["All figures come from `results.json` beside this report."]
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
