"""The natural-text study's plan: how many steps its runs get. With a wall-clock budget,
each variant's training step is timed here first (the trainer's own step,
``train.step_timer``) and the steps are fitted to 80 % of the budget, the same for every
variant; where too few fit, the model steps down to a smaller preset, then the seeds; with
``compile auto`` the compiled and eager steps are timed in the same rounds and the runs
compile where that fits more steps."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from gatedattn.data import TokenData
from gatedattn.infra.provenance import say
from gatedattn.infra.timing import median_times
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.train.step_timer import train_step_fn


def step_fn(cfg: TextConfig, variant: str, data: TokenData):
    """One training step of ``variant`` under the study's recipe, as a function (for timing)."""
    return train_step_fn(cfg.step_config(variant), data)


def time_steps(cfg: TextConfig, data: TokenData, repeats: int = 5) -> dict[str, float]:
    """Seconds per training step of every variant here: medians of ``repeats`` interleaved
    rounds (odd rounds in reverse order, two untimed rounds first), so that a burst of
    load on the machine moves every variant's time alike and the median drops it."""
    return median_times({v: step_fn(cfg, v, data) for v in cfg.variants}, repeats=repeats, warmup=2)


def plan_steps(cfg: TextConfig, data: TokenData, n_runs_per_variant: int,
               counts: dict[str, int] | None = None) -> tuple[int, dict[str, float]]:
    """Training steps that fit the budget: 80 % of it for training, the rest for evaluation
    and analysis; every variant gets the same number of steps (the same tokens).
    ``counts``: runs of each variant per seed where not one each."""
    if cfg.budget_minutes is None:
        return cfg.steps, {}
    step_s = time_steps(cfg, data)
    steps = _fit(cfg, {v: s * (counts or {}).get(v, 1) for v, s in step_s.items()}, n_runs_per_variant)
    eta = time.strftime("%H:%M", time.localtime(time.time() + cfg.budget_minutes * 60))
    say("reproduce", f"timed steps {', '.join(f'{v} {s:.2f}s' for v, s in step_s.items())}: {steps} steps per run "
         f"({steps * cfg.train.micro_batch * cfg.train.seq_len / 1e6:.2f} M tokens, the same for every variant) fit "
         f"{cfg.budget_minutes:g} min; ETA {eta}")
    return steps, step_s


STEP_DOWN_PRESETS = ("small", "tiny")  # smaller models to try, in order, when a budget fits too few steps


def fit_plan(cfg: TextConfig, data: TokenData) -> tuple[TextConfig, int, dict[str, float], list[str], dict[str, Any]]:
    """The study's plan (:func:`fit_eager_plan`), then whether its runs compile
    (:func:`choose_compile`): the config that runs, its steps, the seconds per step, what was
    cut and the compile decision."""
    cfg, steps, step_s, cuts = fit_eager_plan(cfg, data)
    cfg, steps, step_s, decision = choose_compile(cfg, data, steps, step_s)
    return cfg, steps, step_s, cuts, decision


def choose_compile(cfg: TextConfig, data: TokenData, steps: int,
                   step_s: dict[str, float]) -> tuple[TextConfig, int, dict[str, float], dict[str, Any]]:
    """``compile`` resolved: on and off as asked; auto with a budget times each variant's
    compiled and eager steps here in the same rounds (:func:`time_compiled`; the first
    compiled step's extra seconds are its compile time, paid once per run) and compiles where
    that fits more steps into the budget than eager steps would; auto
    with fixed steps stays eager. The config with ``train.compile`` set, its steps and
    seconds per step, and the decision with its figures (for the report)."""
    if cfg.compile != "auto" or cfg.budget_minutes is None:
        mode = "on" if cfg.compile == "on" else "off"
        return _compiled(cfg, mode), steps, step_s, {"mode": cfg.compile, "compile": mode == "on"}
    timed = time_compiled(cfg, data)
    compiled_s = {v: compiled for v, (_, compiled, _) in timed.items()}
    eager_s = {v: eager for v, (_, _, eager) in timed.items()}  # timed in the same rounds as compiled_s
    overhead = sum(first for first, _, _ in timed.values()) * cfg.seeds  # one compile per run
    budget_s = cfg.budget_minutes * 60 * 0.8 - overhead
    compiled_steps = _round_steps(budget_s / (sum(compiled_s.values()) * cfg.seeds)) if budget_s > 0 else 0
    eager_steps = _fit(cfg, eager_s, cfg.seeds)  # what fits the budget, before the min_steps floor
    chosen = compiled_steps > eager_steps
    decision = {"mode": "auto", "compile": chosen, "eager_steps": eager_steps, "compiled_steps": compiled_steps,
                "eager_step_s": eager_s, "compiled_step_s": compiled_s,
                "compile_s": {v: first for v, (first, _, _) in timed.items()}}
    _say_compile(decision)
    if not chosen:
        return _compiled(cfg, "off"), steps, step_s, decision
    return _compiled(cfg, "on"), max(compiled_steps, cfg.min_steps), compiled_s, decision


def _say_compile(d: dict[str, Any]) -> None:
    steps = ", ".join(f"{v} {t:.2f}s" for v, t in d["compiled_step_s"].items())
    compiling = ", ".join(f"{v} {t:.0f}s" for v, t in d["compile_s"].items())
    say("reproduce", f"compiled steps {steps} after {compiling} of compiling: {d['compiled_steps']} steps fit, eager "
         f"{d['eager_steps']}: {'compiling' if d['compile'] else 'eager'}")


def _compiled(cfg: TextConfig, mode: str) -> TextConfig:
    return dataclasses.replace(cfg, train=cfg.train.replace(compile=mode))


def time_compiled(cfg: TextConfig, data: TokenData, repeats: int = 3) -> dict[str, tuple[float, float, float]]:
    """Per variant: (compile seconds: a fresh compiled trainer's first step beyond a compiled
    step; median compiled step; median eager step), the compiled and eager steps of every
    variant timed together in interleaved rounds (:func:`median_times`), so that load on
    the machine falls on both modes alike."""
    torch._dynamo.reset()
    first, steps = {}, {}
    for variant in cfg.variants:
        compiled = train_step_fn(cfg.step_config(variant).replace(compile="on"), data)
        started = time.perf_counter()
        compiled()
        first[variant] = time.perf_counter() - started
        steps[f"compiled {variant}"] = compiled
        steps[f"eager {variant}"] = step_fn(cfg, variant, data)
    times = median_times(steps, repeats=repeats, warmup=1)
    return {v: (max(first[v] - times[f"compiled {v}"], 0.0), times[f"compiled {v}"], times[f"eager {v}"])
            for v in cfg.variants}


def fit_eager_plan(cfg: TextConfig, data: TokenData) -> tuple[TextConfig, int, dict[str, float], list[str]]:
    """The main job's plan: steps fitted to the budget, never fewer than ``min_steps``.
    Where the configured model and seeds do not fit that floor, step down: a smaller
    preset first (``STEP_DOWN_PRESETS``), then fewer seeds. Returns the config that runs,
    its steps, the timed seconds per step and what was cut (sentences for the report)."""
    steps, step_s = plan_steps(cfg, data, cfg.seeds)
    if cfg.budget_minutes is None or steps >= cfg.min_steps:
        return cfg, steps, step_s, []
    cuts = [f"`{cfg.train.model.size}` × {cfg.seeds} seeds fits {steps} steps per run into {cfg.budget_minutes:g} min "
            f"here, under the floor of {cfg.min_steps}"]
    preset_now = cfg.train.model.size
    smaller = STEP_DOWN_PRESETS[STEP_DOWN_PRESETS.index(preset_now) + 1:] if preset_now in STEP_DOWN_PRESETS else ()
    for preset in smaller:
        trial = dataclasses.replace(cfg, train=cfg.train.replace(model=dataclasses.replace(cfg.train.model, size=preset)))
        steps, step_s = plan_steps(trial, data, cfg.seeds)
        if steps >= cfg.min_steps:
            cuts.append(f"so the model steps down to `{preset}` ({steps} steps, {cfg.seeds} seeds)")
            return trial, steps, step_s, cuts
        cfg = trial
        cuts.append(f"`{preset}` fits {steps}")
    seeds = next((n for n in range(cfg.seeds - 1, 1, -1) if _fit(cfg, step_s, n) >= cfg.min_steps), 1)
    if seeds < cfg.seeds:
        steps = _fit(cfg, step_s, seeds)
        cuts.append(f"so the seeds step down to {seeds} at `{cfg.train.model.size}` ({steps} steps)")
    return dataclasses.replace(cfg, seeds=seeds), max(steps, cfg.min_steps), step_s, cuts


def _fit(cfg: TextConfig, step_s: dict[str, float], runs_per_variant: int) -> int:
    """Steps per run that fit 80 % of the budget (the rest: evaluation and analysis)."""
    per_step = sum(step_s.values()) * runs_per_variant
    return _round_steps(cfg.budget_minutes * 60 * 0.8 / per_step)


def _round_steps(steps: float) -> int:
    """A step count rounded down to tens, at least 10."""
    steps = int(steps + 1e-9)
    return max(10, steps - steps % 10)
