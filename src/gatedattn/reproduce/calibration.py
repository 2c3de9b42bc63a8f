"""``gatedattn reproduce --study calibrate``: when does the baseline's first-token sink
form on natural text, and which settings make it form within the main job's budget?

Each *lever* is one change to a base recipe (q/k norm, learning rate, weight decay,
context length, depth and width, vocabulary, corpus mix). Every lever trains the
``baseline`` alone for the same wall-clock time, the time one run of the default
``gatedattn reproduce`` gets here (its budget shared by its variants and seeds), and
records F-Attn and Sink^eps per layer as training proceeds. Every lever's step is timed
first, all together in interleaved rounds, so the step counts do not depend on what else
the machine did while one lever was timed. The table and the plot show
which lever gives the largest sink at that budget; the main job's defaults are chosen
from them (docs/sink-calibration).

Layout of ``out``::

    out/results.json, out/report.md, out/calibration.png
    out/data/<name>/               data prepared for a lever with its own corpus or vocabulary
    out/levers/<lever>/runs/...    each lever's run (the reproduction's layout)

A second call with the same ``out``, budget and base recipe reuses the levers it finished
(their rows as they were) and trains only the new ones, timed together; the report lists
every call's command, and each row says in which call it was timed and trained.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from gatedattn.data import TokenData, prepare
from gatedattn.data.corpus import default_sources
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.io import atomic_write_json, atomic_write_text, json_safe, read_json_object
from gatedattn.infra.precision import resolve_dtype
from gatedattn.infra.provenance import run_meta, say
from gatedattn.reproduce.calibration_report import sink_score, write_calibration_report
from gatedattn.reproduce.verdicts import uniform_first_token_attention
from gatedattn.infra.settings import apply_sets, build, check_options, option
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.reproduce.text.plan import step_fn
from gatedattn.reproduce.text.run import ensure_data, text_run
from gatedattn.infra.timing import median_times
from gatedattn.reproduce.batch import run_batch
from gatedattn.reproduce.registry import Flag, list_of, out_flag, quiet_flag


@dataclass(frozen=True)
class Lever:
    """One setting to measure: ``sets`` are ``--set`` items applied to the base recipe;
    ``vocab_size`` / ``sources`` prepare the lever's own data (default-corpus sources by
    name, e.g. ``("wikipedia",)``)."""

    name: str
    what: str
    sets: tuple[str, ...] = ()
    vocab_size: int | None = None
    sources: tuple[str, ...] | None = None

    @property
    def own_data(self) -> bool:
        return self.vocab_size is not None or self.sources is not None


# The reference is the main job's recipe before calibration; the calibrated default
# departs from it in q/k norm and learning rate, so every lever spells those two out and
# stays what it says. Other fields are the main job's (`small`, T 256, 16 sequences, WD 0.1).
REFERENCE = {"train.model.attention.qk_norm": "true", "train.lr": "0.003"}


def _lever(name: str, what: str, *changes: str, **data: Any) -> Lever:
    sets = dict(REFERENCE)
    for item in changes:
        key, _, value = item.partition("=")
        sets[key] = value
    return Lever(name, what, tuple(f"{k}={v}" for k, v in sets.items()), **data)


NO_QK = "train.model.attention.qk_norm=false"
LEVERS: tuple[Lever, ...] = (
    _lever("reference", "the recipe before calibration: `small`, q/k norm, LR 3e-3, WD 0.1, T 256, vocab 4096, full mix"),
    _lever("no-qk-norm", "q/k RMSNorm off", NO_QK),
    _lever("lr-1e-2", "q/k norm off, LR 1e-2 (the main job's default)", NO_QK, "train.lr=0.01"),
    _lever("lr-1e-3", "q/k norm off, LR 1e-3", NO_QK, "train.lr=0.001"),
    _lever("lr-3e-2", "q/k norm off, LR 3e-2", NO_QK, "train.lr=0.03"),
    _lever("qk-norm-lr-1e-2", "q/k norm on, LR 1e-2", "train.lr=0.01"),
    _lever("wd-0", "q/k norm off, no weight decay", NO_QK, "train.weight_decay=0"),
    _lever("wd-0.3", "q/k norm off, weight decay 0.3", NO_QK, "train.weight_decay=0.3"),
    _lever("seq-512", "q/k norm off, T 512 (8 sequences a step: same tokens)", NO_QK, "train.seq_len=512",
           "train.micro_batch=8"),
    _lever("tiny", "q/k norm off, `tiny` (4 layers, d_model 128)", NO_QK, "train.model.size=tiny"),
    _lever("deep-narrow", "q/k norm off, `tiny` width at 8 layers", NO_QK, "train.model.size=tiny",
           "train.model.n_layers=8"),
    _lever("tiny-lr-1e-2", "q/k norm off, `tiny`, LR 1e-2", NO_QK, "train.model.size=tiny", "train.lr=0.01"),
    _lever("vocab-1024", "q/k norm off, vocabulary 1024", NO_QK, vocab_size=1024),
    _lever("wiki-only", "q/k norm off, Wikipedia summaries only", NO_QK, sources=("wikipedia",)),
)
LEVER_NAMES = tuple(lever.name for lever in LEVERS)
QUICK_LEVERS = ("reference", "no-qk-norm", "vocab-1024")


@dataclass(frozen=True)
class CalibrationConfig:
    """A calibration: ``levers`` (names from ``LEVERS``), each trained for
    ``minutes_per_run`` minutes of training steps (timed here first), ``evals`` sink
    measurements along the way. ``base_sets`` change the base recipe of every lever
    (``--set`` items of ``gatedattn reproduce``)."""

    levers: tuple[str, ...] = option(LEVER_NAMES, choices=LEVER_NAMES, help="levers to measure (names from LEVERS)")
    minutes_per_run: float = option(2.5, gt=0, help="minutes of training steps per lever (timed here first)")
    steps: int | None = option(None, gt=0, help="a fixed step count instead of the per-run minutes")
    evals: int = option(8, gt=0, help="sink measurements along training")
    out_dir: str = option("runs/reproduce-calibrate", help="output directory")
    data_dir: str | None = option(None, help="prepared data for the levers that do not prepare their own")
    base_sets: tuple[str, ...] = option((), help="--set items that change every lever's base recipe")
    quick_base: bool = option(False, help="every lever on the quick reproduction's base (the --quick smoke run)")
    progress: bool = option(True, help="progress bars")

    def __post_init__(self) -> None:
        owner = "CalibrationConfig"
        object.__setattr__(self, "levers", tuple(self.levers))
        object.__setattr__(self, "base_sets", tuple(self.base_sets))
        check_options(self)
        if not self.levers:
            raise ConfigError(f"{owner}.levers is empty; choose from {', '.join(LEVER_NAMES)}")
        own = [lv.name for lv in self.chosen() if lv.own_data]
        if own and self.data_dir is not None:
            raise ConfigError(f"{owner}: levers {', '.join(own)} prepare their own data from the default corpus, "
                              f"so they cannot run on data_dir={self.data_dir}; with a data directory choose among "
                              f"{', '.join(lv.name for lv in LEVERS if not lv.own_data)}")
        for lever in self.chosen():  # every lever's recipe is valid before anything trains
            self.recipe(lever, steps=10)

    @classmethod
    def quick(cls, **changes: Any) -> "CalibrationConfig":
        """Well under a minute: three levers of the `tiny` recipe, a few steps each."""
        base = dict(levers=QUICK_LEVERS, steps=12, evals=2, quick_base=True, out_dir="runs/reproduce-calibrate-quick")
        return cls(**{**base, **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CalibrationConfig":
        return build(cls, data)

    def chosen(self) -> list[Lever]:
        return [next(lv for lv in LEVERS if lv.name == name) for name in self.levers]

    def recipe(self, lever: Lever, *, steps: int, data_dir: str | None = None):
        """The lever's reproduction config: the baseline alone, ``steps`` steps, no extrapolation."""
        make = TextConfig.quick if self.quick_base else TextConfig.make
        base = make(variants=("baseline",), steps=steps, budget_minutes=None, multiples=(), evals=self.evals,
                    progress=self.progress, data_dir=data_dir or self.data_dir)
        return apply_sets(base, [*self.base_sets, *lever.sets])


def _source_file(lever: Lever, out: Path) -> Path:
    """The lever's default-corpus sources as one JSON-lines corpus file under ``out/data``."""
    known = {s.name: s for s in default_sources()}
    missing = [s for s in lever.sources if s not in known]
    if missing:
        raise ConfigError(f"lever {lever.name}: unknown default-corpus sources {missing}; known: {', '.join(known)}")
    (out / "data").mkdir(parents=True, exist_ok=True)
    corpus_file = out / "data" / f"{lever.name}.jsonl"
    lines = [json.dumps({"text": d.text}) for s in lever.sources for d in known[s].documents()]
    atomic_write_text(corpus_file, "\n".join(lines) + "\n")
    return corpus_file


def lever_data(cfg: CalibrationConfig, lever: Lever, default_dir: Path, out: Path) -> Path:
    """The data directory of ``lever``: the shared one, or its own (prepared once)."""
    if not lever.own_data:
        return default_dir
    path = out / "data" / lever.name
    if (path / "manifest.json").is_file():
        return path
    inputs = None if lever.sources is None else [_source_file(lever, out)]
    vocab = lever.vocab_size or TokenData(default_dir).vocab_size
    prepare(inputs, path, vocab_size=vocab, default_corpus=inputs is None, overwrite=True, progress=cfg.progress)
    return path


_SAME_STUDY = ("minutes_per_run", "steps", "evals", "base_sets", "quick_base")


def _check_same_study(before: dict[str, Any], mine: dict[str, Any], out: Path) -> None:
    """Refuse, naming the fields, a directory written with another budget or base recipe."""
    differ = [k for k in _SAME_STUDY if json_safe(before.get(k)) != json_safe(mine[k])]
    if differ:
        what = ", ".join(f"{k}: {before.get(k)!r} there, {mine[k]!r} here" for k in differ)
        raise ConfigError(f"{out} holds a calibration with other settings ({what}); give a new --out to keep both")


def _earlier(cfg: CalibrationConfig, out: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Levers a previous call on ``out`` finished (to reuse), and the commands of those
    calls. ``out`` must hold a calibration with the same budget and base recipe."""
    path = out / "results.json"
    if not path.is_file():
        return {}, []
    old = read_json_object(path)
    _check_same_study(old.get("config") or {}, dataclasses.asdict(cfg), out)
    rows = {r["lever"]: {**r, "session": r.get("session", 1)} for r in old.get("levers", [])}
    if not rows:
        return {}, []
    return rows, old.get("commands") or [(old.get("meta") or {}).get("command")]


def time_levers(cfg: CalibrationConfig, data_dirs: dict[str, Path], repeats: int = 3,
                names: list[str] | None = None) -> dict[str, float]:
    """Seconds per training step of every lever's baseline (or of ``names``), timed
    together before any trains: interleaved rounds (odd rounds reversed), medians, so that
    load on the machine while timing moves every lever alike."""
    steps = {}
    for lever in cfg.chosen():
        if names is not None and lever.name not in names:
            continue
        d = data_dirs[lever.name]
        steps[lever.name] = step_fn(cfg.recipe(lever, steps=10, data_dir=str(d)), "baseline", TokenData(d))
    return median_times(steps, repeats=repeats)


def _started_steps(out: Path, lever: Lever) -> int | None:
    """The step count of a run of ``lever`` that an earlier call started (it resumes with
    the same count instead of being timed again); None when there is none."""
    path = out / "levers" / lever.name / "runs" / "baseline-s0" / "config.json"
    if not path.is_file():
        return None
    steps = (read_json_object(path).get("train") or {}).get("steps")
    return steps if isinstance(steps, int) and steps > 0 else None


def run_lever(cfg: CalibrationConfig, lever: Lever, data_dir: Path, out: Path,
              step_s: float | None, steps: int | None = None) -> dict[str, Any]:
    data = TokenData(data_dir, verify=True)
    if steps is None:
        steps = cfg.steps if cfg.steps is not None else max(10, int(cfg.minutes_per_run * 60 / step_s))
    recipe = cfg.recipe(lever, steps=steps, data_dir=str(data_dir))
    run, = run_batch([text_run(recipe, data_dir, data, "baseline", 0, steps, out / "levers" / lever.name)])
    a = run["analysis"]
    per_layer = a["f_attn_per_layer"]
    strongest = max(range(len(per_layer)), key=per_layer.__getitem__)
    t = recipe.train
    return {
        "lever": lever.name, "what": lever.what, "sets": list(lever.sets), "steps": steps, "step_seconds": step_s,
        "tokens": run["tokens"], "seq_len": t.seq_len, "vocab_size": data.vocab_size,
        "preset": t.model.size, "n_layers": a["n_layers"], "uniform": uniform_first_token_attention(t.seq_len - 1),
        "val_loss": a["val_loss"], "f_attn": a["f_attn"], "f_attn_per_layer": per_layer,
        "f_attn_strongest": per_layer[strongest], "strongest_layer": strongest, "sink_eps": a["sink_eps"],
        "m_act_ratio": a["m_act_ratio"], "over_training": run["over_training"], "run_dir": run["run_dir"],
    }


def run_calibration(cfg: CalibrationConfig, command: str | None = None) -> Path:
    """Train every lever; write results.json, report.md and the plot; return report.md."""

    started = time.time()
    out = Path(cfg.out_dir)
    default_dir = ensure_data(cfg.recipe(cfg.chosen()[0], steps=10))
    out.mkdir(parents=True, exist_ok=True)
    done, commands = _earlier(cfg, out)
    command = command or "gatedattn reproduce --study calibrate"
    todo = [lever for lever in cfg.chosen() if lever.name not in done]
    # a call is listed when it trains something (a call that only rewrites the report adds nothing)
    results: dict[str, Any] = {"study": "calibrate", "config": dataclasses.asdict(cfg), "levers": [],
                               "commands": [*commands, command] if todo or not commands else commands}
    data_dirs = {lever.name: lever_data(cfg, lever, default_dir, out) for lever in todo}
    started_steps = {lever.name: n for lever in todo if (n := _started_steps(out, lever)) is not None}
    step_s: dict[str, float] = {}
    to_time = [lever.name for lever in todo if lever.name not in started_steps]
    if cfg.steps is None and to_time:
        say("calibrate", f"timing the training step of {', '.join(to_time)} in interleaved rounds")
        step_s = time_levers(cfg, data_dirs, names=to_time)
        say("calibrate", ", ".join(f"{k} {v:.2f}s" for k, v in step_s.items()))
    rows = dict(done)  # every finished row is kept from the start, so an interruption loses none

    def save() -> None:
        results["levers"] = [rows[lv.name] for lv in cfg.chosen() if lv.name in rows]
        atomic_write_json(out / "results.json", json_safe(results))

    save()
    for lever in todo:
        say("calibrate", f"lever {lever.name}: {lever.what}")
        row = run_lever(cfg, lever, data_dirs[lever.name], out, step_s.get(lever.name),
                        steps=started_steps.get(lever.name))
        rows[lever.name] = {**row, "session": len(commands) + 1}
        save()
    results["meta"] = {**run_meta(command, started), "precision": resolve_dtype("auto", "cpu").as_dict()}
    results["ranking"] = rank(results["levers"])
    results["main_default"] = main_default_lever(cfg)
    atomic_write_json(out / "results.json", json_safe(results))
    return write_calibration_report(results, out)


_RECIPE_FIELDS = ("lr", "weight_decay", "seq_len", "micro_batch")


def main_default_lever(cfg: CalibrationConfig) -> str | None:
    """The lever whose recipe is the main job's default (``gatedattn reproduce``), if any."""
    main = TextConfig().train
    for lever in cfg.chosen():
        t = cfg.recipe(lever, steps=10).train
        if (not lever.own_data and t.model.size == main.model.size and t.model.overrides() == main.model.overrides()
                and all(getattr(t, f) == getattr(main, f) for f in _RECIPE_FIELDS)):
            return lever.name
    return None


def rewrite_calibration_report(results: dict[str, Any], out: Path) -> Path:
    """``--report-only``: the report again from ``results``, each row's uniform level
    recomputed by the current rule (``seq_len - 1`` positions after BOS) and the levers
    ranked anew; where the ranking moved, the report shows the one it replaces."""
    for row in results["levers"]:
        row["uniform"] = uniform_first_token_attention(row["seq_len"] - 1)
    ranking = rank(results["levers"])
    if ranking != results.get("ranking"):
        results["ranking_before"] = results.get("ranking")
        results["ranking"] = ranking
    return write_calibration_report(results, out)


def rank(rows: list[dict[str, Any]]) -> list[str]:
    """Lever names, strongest sink first (Sink^eps, then the strongest layer's F-Attn
    relative to uniform attention)."""
    return [r["lever"] for r in sorted(rows, key=lambda r: (r["sink_eps"], sink_score(r)), reverse=True)]


FLAGS: dict[str, Flag] = {
    "--levers": Flag("levers", "levers to measure (default all; an unknown name lists them)",
                     type=list_of(str, "--levers")),
    "--budget-minutes": Flag("minutes_per_run", "minutes of training steps per lever (default 2.5, timed here first)",
                             type=float),
    "--steps": Flag("steps", "", type=int), "--data": Flag("data_dir", ""),
    "--set": Flag("base_sets", "", repeat=True), "--out": out_flag(), "--quiet": quiet_flag(),
}
