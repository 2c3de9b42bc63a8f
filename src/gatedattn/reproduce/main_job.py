"""The main job's composition: its config (``ReproduceConfig``: one config per part, each
the config of a study of its own), its parts run in the order of ``PARTS`` into one
output directory through one interface (:class:`MainPart`), the studies run apart folded
into its claims, and every part's claims judged anew for ``--report-only``.

Natural text is left out of the default job: at the scale two CPU cores train in minutes
it judges almost none of its claims (a natural-text sink needs billions of tokens), so it
runs as ``--study text``, or here with ``--with-text``."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fields import field_types
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.infra.provenance import run_meta, say
from gatedattn.infra.settings import build, check_options, dataclass_of, fields_dict, option
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.part_results import PartResults
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.registry import OUT_FLAG, Flag, Section
from gatedattn.reproduce.report import Part, write_report
from gatedattn.reproduce.text.config import RUN_APART_FLAGS, TextConfig

NAME = "main"  # the study's name in the registry

PARTS = ("mechanism", "pretrained", "text")  # the main job's parts, in the order they run and are reported

R = TypeVar("R", bound=PartResults)  # a keyed part's typed results

TEXT_BUDGET_MINUTES = 11.0  # the natural-text part's budget in the main job (the study alone: 20)


def text_part_config(quick: bool = False) -> TextConfig:
    """The natural-text part's config as ``--with-text`` switches it on (``quick``: the
    ``--quick`` run's)."""
    return TextConfig.quick() if quick else TextConfig(budget_minutes=TEXT_BUDGET_MINUTES)


def _part_field(default: Callable[[], Any] | None, help: str, exclude: tuple[str, ...]) -> Any:
    """A part's field: its config made by ``default`` (None: left out by default), its
    ``--set`` keys all but ``exclude`` (those the job sets for it)."""
    metadata = {"help": help, "exclude": exclude}
    if default is None:
        return field(default=None, metadata=metadata)
    return field(default_factory=default, metadata=metadata)


@dataclass(frozen=True)
class ReproduceConfig:
    """The main job: its parts, each the config of a study of its own (None: left out),
    run in the order of ``PARTS``: the Bigram-Backcopy mechanism study (``mechanism``),
    the real-model study (``pretrained``) and the natural-text study (``text``, left out
    by default). The job writes every part into ``out_dir``; ``fold`` joins the results of
    learning-rate and rank studies run apart to the natural-text claims."""

    STUDY: ClassVar[str] = NAME
    # the --set keys of the natural-text fields this config held before they moved under ``text``
    MOVED_KEYS: ClassVar[Mapping[str, str]] = MappingProxyType({
        name: f"text.{name}" for name in ("variants", "seeds", "budget_minutes", "steps", "evals",
                                          "analysis_sequences", "multiples", "timing_rounds", "min_steps",
                                          "compile", "train")})

    out_dir: str = option("runs/reproduce", help="output directory (every part writes into it)")
    fold: tuple[str, ...] = option((), help="output directories of an lr or rank study whose results join this "
                                            "report's natural-text claims (needs the text part)")
    mechanism: MechanismConfig | None = _part_field(
        MechanismConfig, "the Bigram-Backcopy mechanism study, the main job's first part (None: left out)",
        ("out_dir", "progress"))
    pretrained: PretrainedConfig | None = _part_field(
        PretrainedConfig, "the real-model study, the main job's second part (None: left out)", ("out_dir", "progress"))
    text: TextConfig | None = _part_field(
        None, "the natural-text study, the main job's last part (None, the default: left out; on a CPU it trains "
              "too few tokens to judge its claims; --with-text runs it, --study text alone)", ("out_dir",))

    def __post_init__(self) -> None:
        if isinstance(self.fold, list):
            object.__setattr__(self, "fold", tuple(self.fold))
        for name in PARTS:
            kind = dataclass_of(field_types(type(self))[name])
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"ReproduceConfig.{name} must be a {kind.__name__} or None, "
                                  f"got {type(value).__name__}")
        check_options(self)
        if not self.parts():
            raise ConfigError(f"ReproduceConfig leaves every part out ({', '.join(PARTS)} all None): drop "
                              "--no-mechanism or --no-pretrained, or add --with-text")
        if self.fold and self.text is None:
            raise ConfigError("ReproduceConfig.fold joins studies to the natural-text claims, and text is None "
                              "(left out): give --with-text with --fold")

    def parts(self) -> tuple[str, ...]:
        """The parts this job runs (those not None), in the order of ``PARTS``."""
        return tuple(name for name in PARTS if getattr(self, name) is not None)

    @property
    def budget_minutes(self) -> float | None:
        """The job's wall-clock budget: its natural-text part's (None where it has none)."""
        return None if self.text is None else self.text.budget_minutes

    @property
    def natural_text(self) -> bool:
        """Whether the job runs the natural-text part (``text is not None``)."""
        warnings.warn("ReproduceConfig.natural_text moved to ReproduceConfig.text (a TextConfig, None where left "
                      "out); read `cfg.text is not None` (the old name goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return self.text is not None

    @classmethod
    def quick(cls, **changes: Any) -> "ReproduceConfig":
        """About a minute on a 2-core CPU: a smoke test of every part the job runs."""
        base = dict(out_dir=cls.__dataclass_fields__["out_dir"].default + "-quick", mechanism=MechanismConfig.quick(),
                    pretrained=PretrainedConfig.quick())
        return cls(**{**base, **changes})

    def replace(self, **changes: Any) -> "ReproduceConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def command(cls) -> str:
        """The command line that runs the main job with its defaults."""
        return "gatedattn reproduce"

    def record(self) -> dict[str, Any]:
        """The job's own settings as ``results.json`` records them beside its parts'."""
        if self.text is None:
            return {"out_dir": self.out_dir, "natural_text": False}
        return {"out_dir": self.out_dir, "fold": list(self.fold), "natural_text": True,
                "mechanism": self.mechanism and self.mechanism.to_dict(),
                "pretrained": self.pretrained and self.pretrained.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReproduceConfig":
        data = dict(data)
        for name in PARTS:
            if isinstance(data.get(name), dict):
                data[name] = dataclass_of(field_types(cls)[name]).from_dict(data[name])
        return build(cls, data)


@dataclass(frozen=True)
class MainPart:
    """A part of the main job, declared by its study: its key (a field of
    ``ReproduceConfig`` and a name in ``PARTS``), ``start(its config, out) -> run``, which
    checks and prepares what the part reads before any part trains and returns
    ``run(results)``, which trains the part and records its results in the job's
    ``results`` (the dict ``results.json`` holds); ``rejudge(results)``, which judges its
    claims there anew by the current rules (nothing where it did not run); and
    ``section``, its "Part N" lines in the report from its results there (None for
    natural text, whose results are the body of the report: its setup, claims and
    plots)."""

    key: str
    start: Callable[[Any, Path], Callable[[dict[str, Any]], None]]
    rejudge: Callable[[dict[str, Any]], None]
    section: Part | None = None


def keyed_part(key: str, kind: type[R], run: Callable[[Any, Path], R], judge: Callable[[R], R],
               section: Callable[[R, Path, str], list[str]]) -> MainPart:
    """A part whose results sit under ``key`` in ``results.json``, typed as ``kind`` (a
    :class:`PartResults` with a ``minutes`` field): ``run(its config, out)`` returns them
    (with the minutes it took, where it does not say), ``judge(them)`` returns them judged
    anew and ``section(them, out, heading)`` writes their report lines. They become a dict
    (``kind.to_dict``) only where they are recorded in the job's results, and are read back
    from there (``kind.from_dict``) to be judged or reported."""
    def start(cfg: Any, out: Path) -> Callable[[dict[str, Any]], None]:
        def run_part(results: dict[str, Any]) -> None:
            started = time.time()
            found = run(cfg, out)
            if found.minutes is None:  # type: ignore[attr-defined]  # every keyed part's results have minutes
                found = found.replace(minutes=(time.time() - started) / 60)
            results[key] = found.to_dict()
        return run_part

    def rejudge(results: dict[str, Any]) -> None:
        if results.get(key):
            results[key] = judge(kind.from_dict(results[key])).to_dict()

    def written(found: dict[str, Any], out: Path, heading: str) -> list[str]:
        return section(kind.from_dict(found), out, heading)

    return MainPart(key, start, rejudge, written)


def reproduce(study: str, out: Path, parts: Sequence[tuple[MainPart, Any]], command: str, *,
              record: Mapping[str, Any] = MappingProxyType({}), fold: tuple[str, ...] = (),
              foldable: Mapping[str, Section] = MappingProxyType({})) -> Path:
    """Run each of ``parts`` (a part with its config, in order) into ``out``: every part
    started first (its inputs checked and prepared), then each run in turn, the results
    written after each; the studies written in the directories ``fold`` joined to the
    claims; every part's claims judged, then ``results.json`` and ``report.md`` written;
    returns the report's path. ``record``: the job's own settings, kept in the results'
    ``config``; ``foldable``: the results key of each study that may be folded in, with
    its report section (from the study registry)."""
    started = time.time()
    folds = read_folds(fold, tuple(foldable))
    runs = [(part, part.start(cfg, out)) for part, cfg in parts]
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"study": study, "config": dict(record)}
    fold_in(results, folds, tuple(foldable))
    for part, run in runs:
        part_started = time.time()
        say("reproduce", f"{part.key}: starting")
        run(results)
        say("reproduce", f"{part.key} done in {(time.time() - part_started) / 60:.1f} min")
        atomic_write_json(out / "results.json", json_safe(results))
    results["config"] = {**results["config"], **record}
    results["meta"] = {**run_meta(command, started), **results.get("meta", {})}
    rejudge(results, [part for part, _ in parts])
    atomic_write_json(out / "results.json", json_safe(results))
    return write_report(results, out, sections=list(foldable.values()),
                        parts=[(p.key, p.section) for p, _ in parts if p.section is not None])


def rejudge(results: dict[str, Any], parts: Sequence[MainPart]) -> dict[str, Any]:
    """``results`` with the claims of each of ``parts`` it holds judged anew by the
    current rules, in order (for ``--report-only`` as for a run)."""
    for part in parts:
        part.rejudge(results)
    return results


def read_folds(dirs: tuple[str, ...], keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The results of each study directory to fold in (one that holds results under one
    of ``keys``), read and checked before anything trains."""
    folds = []
    for d in dirs:
        if not (Path(d) / "results.json").is_file():
            raise ConfigError(f"ReproduceConfig.fold: {d} has no results.json (give the --out of an lr or rank study)")
        other = read_json_object(Path(d) / "results.json")
        if not any(other.get(k) for k in keys):
            raise ConfigError(f"ReproduceConfig.fold: {d}/results.json holds no {' or '.join(keys)}")
        folds.append((d, other))
    return folds


def fold_in(results: dict[str, Any], folds: list[tuple[str, dict[str, Any]]], keys: tuple[str, ...]) -> None:
    """Join the results (under ``keys``) of each folded study to ``results`` (the claims
    table then judges them too); ``results["folded"]`` records each one's command."""
    for d, other in folds:
        found = [k for k in keys if other.get(k)]
        for key in found:
            results[key] = other[key]
        results.setdefault("folded", []).append(
            {"dir": str(d), "studies": found, "command": (other.get("meta") or {}).get("command"),
             "machine": (other.get("meta") or {}).get("machine")})


def _under_text(flag: Flag) -> Flag:
    """A flag of the natural-text study as the main job takes it: the keys it sets and
    clears under the ``text`` part."""
    return dataclasses.replace(flag, key=f"text.{flag.key}", clears=tuple(f"text.{k}" for k in flag.clears))


# the natural-text study's flags set the text part's config: they apply only with --with-text (--quiet
# quiets it where it runs)
FLAGS: dict[str, Flag] = {
    **{name: flag if name == OUT_FLAG else _under_text(flag) for name, flag in RUN_APART_FLAGS.items()},
    "--fold": Flag("fold", "join the lr or rank study written in DIR (its --out) to this report's claims "
                           "(repeatable)", repeat=True, metavar="DIR"),
    "--no-mechanism": Flag("mechanism", "the main job without its mechanism part (the Bigram-Backcopy study)",
                           value=None, switch=True),
    "--no-pretrained": Flag("pretrained", "the main job without its real-model part", value=None, switch=True),
    "--with-text": Flag("text", "the main job with the natural-text study as its last part (--study text "
                                "runs it alone)", value=text_part_config, switch=True),
    "--model": Flag("pretrained.model", "the real-model part's model: a .gguf file or a model directory (default: "
                                        "the bundled SmolLM2-135M-Instruct)"),
}
