"""Run the real-model study: load, measure, train the arms, judge, report (the stages in
order; the work of each lives in its own module: :mod:`.measure`, :mod:`.arms`,
:mod:`.recovery`, :mod:`.continued`).

Every stage's result is written to ``out/pretrained.json`` as soon as it exists, keyed by
the config it was made with, so a second call on the same ``--out`` reuses what is done
(every arm run on its own) and continues with the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn.analysis.windows import model_tokenizer, resolve_first_token, tokenizer_bos, tokenizer_convention
from gatedattn.hf import bundled_model_path, load_model
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fmt import shown
from gatedattn.infra.integrity import content_id
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.models.lm import GatedLM
from gatedattn.infra.provenance import run_meta, say
from gatedattn.reproduce.pretrained import claims
from gatedattn.reproduce.pretrained.arms import (ARM_SPECS, HEAD_WINDOWS, ArmRunner, arm_precision, first_token_logits,
                                                  head_stats)
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.pretrained.continued import CONTINUED_FIGURES, CONTINUED_RUNS, continue_training
from gatedattn.reproduce.pretrained.masked import DROPPED, KEPT, window_losses
from gatedattn.reproduce.pretrained.measure import gap, noop_curve, noop_point, sink_figures, streaming_curves, streaming_late
from gatedattn.reproduce.pretrained.recovery import arm_summary, credit_old_results, order_stat
from gatedattn.reproduce.pretrained.report import write_pretrained_report
from gatedattn.reproduce.pretrained.results import PretrainedResults
from gatedattn.reproduce.pretrained.text import study_text

NAME = "pretrained"


def _say(cfg: PretrainedConfig, msg: str) -> None:
    if cfg.progress:
        say(NAME, msg)


def model_path(cfg: PretrainedConfig) -> Path:
    if cfg.model is not None:
        return Path(cfg.model)
    return bundled_model_path()


def load(cfg: PretrainedConfig) -> tuple[GatedLM, Any, Any, dict[str, Any]]:
    """The model (fp32, eval, frozen; cut to ``truncate_layers``), its tokenizer, the first
    token and a description of both."""
    path = model_path(cfg)
    tokenizer = model_tokenizer(path)
    if tokenizer is None:
        raise ConfigError(f"PretrainedConfig.model={str(path)!r} has no tokenizer (tokenizer.json or one inside the "
                          f"GGUF file): the study tokenizes text with the model's own")
    model = load_model(path).float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    full_layers = model.cfg.n_layers
    if cfg.truncate_layers and cfg.truncate_layers < full_layers:
        model.blocks = model.blocks[:cfg.truncate_layers]
        model.cfg = model.cfg.replace(n_layers=cfg.truncate_layers)
    first = resolve_first_token(cfg.first_token, model.cfg, tokenizer_bos=tokenizer_bos(path, tokenizer),
                                convention=tokenizer_convention(path, tokenizer))
    a = model.cfg.attention
    info = {"path": shown(str(path)), "name": shown(path.name), "layers": model.cfg.n_layers, "full_layers": full_layers,
            "d_model": a.d_model, "heads": a.n_heads, "kv_heads": a.n_kv_heads, "vocab": model.cfg.vocab_size,
            "params": sum(p.numel() for p in model.parameters()), "first_token": first.to_dict()}
    return model, tokenizer, first, info


# the config fields each stage depends on (besides the model, its first token and its cut)
_TEXT = ("model", "first_token", "truncate_layers", "seq_len")
STAGE_FIELDS = {
    "sink": (*_TEXT, "analysis_windows"),
    "noop": (*_TEXT, "eval_windows", "windows"),
    "noop_plain": (*_TEXT, "eval_windows", "windows", "window", "min_gap"),
    "arms": (*_TEXT, "eval_windows", "windows", "window", "min_gap", "sink_layers_eps", "steps", "batch",
             "dev_windows", "stop_every", "stop_patience", "stop_tol", "streaming_len"),
    "streaming": (*_TEXT, "eval_windows", "windows", "window", "min_gap", "streaming_len"),
    "continued": (*_TEXT, "analysis_windows", "eval_windows", "batch", "continued_steps", "continued_lr"),
}


# ------------------------------------------------------------------------------ the study's choices
def choose_window(curve: list[dict], min_gap: float, k_se: float = 4.0) -> tuple[int | None, str]:
    """The widest window whose gap is at least ``min_gap`` nats and ``k_se`` standard errors:
    where the first token is clearly needed, and as close to full attention as that allows."""
    for point in curve:  # widest first; full attention (0) is not a window
        if point["window"] and point["gap"] >= min_gap and point["gap"] > k_se * point["gap_se"]:
            return point["window"], (f"the widest window whose loss gap ({point['gap']:.3f} nats) is at least "
                                     f"{min_gap:g} nats and {k_se:g} standard errors ({point['gap_se']:.3f})")
    return None, f"no window's loss gap reached {min_gap:g} nats and {k_se:g} standard errors"


def start_layer(f_attn_per_layer: list[float | None], eps: float) -> int:
    """The first layer whose F-Attn exceeds ``eps`` (0 when none does: every layer trains)."""
    for i, f in enumerate(f_attn_per_layer):
        if f is not None and f > eps:
            return i
    return 0



class Stages:
    """The study's partial results in ``path``: each stage is kept with the config fields it
    was made from (``STAGE_FIELDS``, plus ``extra``) and what the model's files hold
    (:func:`content_id`), and reused only where both are the same: a model replaced under
    the same name is measured anew."""

    def __init__(self, path: Path, cfg: PretrainedConfig, model: Path):
        self.path, self.cfg = path, cfg
        self._noted = 0.0
        self.data: dict[str, Any] = read_json_object(path) if path.is_file() else {}
        self.data.setdefault("stages", {})
        known = self.data.get("model_content")
        self.model_content = content_id(model, known if isinstance(known, dict) else None)
        self.data["model_content"] = self.model_content

    def get(self, name: str, kind: str, make: Callable[[], Any], **extra: Any) -> Any:
        d = self.cfg.to_dict()
        key = json_safe({**{f: d[f] for f in STAGE_FIELDS[kind]}, "model_sha256": self.model_content["sha256"],
                         **extra})
        stage = self.data["stages"].get(name)
        if stage is None or stage["key"] != key:
            started, noted = time.time(), self._noted
            value = json_safe(make())
            # the seconds of a note made meanwhile (the model's load) are counted there, not twice
            stage = {"key": key, "value": value, "seconds": time.time() - started - (self._noted - noted)}
            self.data["stages"][name] = stage
            atomic_write_json(self.path, self.data)
        return stage["value"]

    def note(self, name: str, seconds: float) -> None:
        """Record the seconds of work that is not a stage (the model's load)."""
        self._noted += seconds
        self.data["stages"][name] = {"key": None, "value": None, "seconds": seconds}
        atomic_write_json(self.path, self.data)

    def seconds(self) -> dict[str, float]:
        return {name: stage["seconds"] for name, stage in self.data["stages"].items()}


class _Inputs:
    """What the stages read, made on first use only: a second call whose stages are all
    done reads neither the model nor the text."""

    def __init__(self, cfg: PretrainedConfig, stages: Stages):
        self.cfg, self.stages = cfg, stages

    @functools.cached_property
    def loaded(self) -> tuple[GatedLM, Any, Any, dict[str, Any]]:
        started = time.time()
        loaded = load(self.cfg)
        self.stages.note("load", time.time() - started)
        info = loaded[3]
        _say(self.cfg, f"{info['name']}: {info['layers']} layers, {info['params'] / 1e6:.0f} M parameters, first "
                       f"token {info['first_token']}")
        return loaded

    @property
    def model(self) -> GatedLM:
        return self.loaded[0]

    @functools.cached_property
    def text(self):
        _, tokenizer, first, _ = self.loaded
        return study_text(tokenizer, first.id)

    def windows(self, split: str, n: int, seed: int, plain: bool = False) -> torch.Tensor:
        text = dataclasses.replace(self.text, first=None) if plain else self.text
        return text.windows(split, self.cfg.seq_len, n, seed=seed)

    @functools.cached_property
    def evals(self) -> torch.Tensor:
        return self.windows("val", self.cfg.eval_windows, seed=1)


def _arm_runs(cfg: PretrainedConfig, stages: Stages, shared: Callable[[], ArmRunner], name: str) -> list[dict]:
    """Every data order of one arm, each trained with the first token dropped and kept."""
    runs = []
    lrs = {f: getattr(cfg, f) for _, f in ARM_SPECS[name].trains}
    precision = arm_precision(cfg.dtype).dtype
    for seed in range(cfg.seeds):
        run = stages.get(f"arm/{name}/{seed}", "arms", lambda: shared().run(name, seed), **lrs, precision=precision,
                         looks=precision)
        runs.append(run)
        _say(cfg, f"{name} order {seed}: held-out loss {run[DROPPED]['loss']:.3f} dropped, {run[KEPT]['loss']:.3f} "
                  f"kept, {run['steps']} steps{'' if run['converged'] else ' (the most allowed)'}")
    return runs


def pretrained_part(cfg: PretrainedConfig, out: Path) -> PretrainedResults:
    """The whole study into ``out``; its results (what ``results.json`` holds under the
    study's name). ``minutes``: the model's load and every stage, as they were measured
    when they ran (a second call reuses them)."""
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    stages = Stages(out / "pretrained.json", cfg, model_path(cfg))
    inp = _Inputs(cfg, stages)
    info = stages.get("model", "sink", lambda: inp.loaded[3])
    source = stages.get("text", "sink", lambda: inp.text.source)
    sink = stages.get("sink", "sink", lambda: sink_figures(inp.model, inp.windows("val", cfg.analysis_windows, 0),
                                                          inp.loaded[2]))
    _say(cfg, f"sink: F-Attn {sink['f_attn']:.3f}, Sink^eps {sink['sink_eps']:.2f}, M-Act {sink['m_act']:.0f}")
    curve = stages.get("noop", "noop", lambda: noop_curve(inp.model, inp.evals, cfg.windows))
    _say(cfg, "no-op curve: " + ", ".join(f"W {p['window'] or 'full'} gap {p['gap']:+.3f}" for p in curve))
    window, why = (cfg.window, "as configured") if cfg.window else choose_window(curve, cfg.min_gap)
    plain = None
    if info["first_token"]["mode"] != "none":  # the same with no special first token (else: the curve above)
        plain = stages.get("noop_plain", "noop_plain", lambda: [
            noop_point(inp.model, inp.windows("val", cfg.eval_windows, 1, plain=True), w)
            for w in (0, *([window] if window else []))])
    arms = _arms_part(cfg, stages, inp, window, sink, curve) if window is not None else {}
    continued = _continued(cfg, stages, inp) if cfg.continued_steps else None
    seconds = stages.seconds()
    return PretrainedResults(config=cfg.to_dict(), model=info, text=source, sink=sink, noop=curve, window=window,
                             window_why=why, noop_plain=plain, **arms, continued=continued, stage_seconds=seconds,
                             minutes=sum(seconds.values()) / 60)


def _continued(cfg: PretrainedConfig, stages: Stages, inp: _Inputs) -> dict[str, Any]:
    """Qiu et al. App. A.7 at CPU scale: the whole model trained on, as it is and with a G1
    gate retrofitted (identity init), on the same windows in the same order, in each of
    ``seeds`` data orders; each run's sink figures and held-out loss (full causal attention)
    after, beside the model's before, and their mean and spread over the orders. Every run
    is a stage of its own, so an interrupted study keeps the finished ones."""
    def measure(model: GatedLM) -> dict[str, Any]:
        figures = sink_figures(model.eval(), inp.windows("val", cfg.analysis_windows, 0), inp.loaded[2])
        loss = window_losses(model, inp.evals, 0, "free").mean().item()
        return {"loss": loss, **{k: figures[k] for k in CONTINUED_FIGURES}}

    out: dict[str, Any] = {"before": stages.get("continued/before", "continued", lambda: measure(inp.model)),
                           "steps": cfg.continued_steps, "tokens": cfg.continued_steps * cfg.batch * cfg.seq_len,
                           "seeds": cfg.seeds}
    for name, variant in CONTINUED_RUNS:
        runs = []
        for seed in range(cfg.seeds):
            def train(variant=variant, seed=seed) -> dict[str, Any]:
                pool = inp.windows("train", cfg.continued_steps * cfg.batch, 3)
                order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
                model, curve = continue_training(cfg, inp.model, variant, pool[order])
                return {**measure(model), "curve": curve}

            runs.append(stages.get(f"continued/{name}/{seed}", "continued", train))
            _say(cfg, f"continued pretraining, {name}, order {seed}: held-out loss {runs[-1]['loss']:.3f}, "
                      f"F-Attn {runs[-1]['f_attn']:.3f}")
        out[name] = {"runs": runs, **{k: order_stat([r[k] for r in runs]) for k in ("loss", *CONTINUED_FIGURES)}}
    return out


def _arms_part(cfg: PretrainedConfig, stages: Stages, inp: _Inputs, window: int, sink: dict[str, Any],
               curve: list[dict[str, Any]]) -> dict[str, Any]:
    """The arms at ``window``, the per-head figures and the streaming curves: the
    :class:`PretrainedResults` fields they fill, by name."""
    start = start_layer(sink["f_attn_per_layer"], cfg.sink_layers_eps)
    logits = stages.get("first_logits", "noop_plain", lambda: [
        t.tolist() for t in first_token_logits(inp.model, inp.evals[:HEAD_WINDOWS, :-1], window)])

    @functools.cache
    def shared() -> ArmRunner:
        drawn = inp.windows("train", cfg.steps * cfg.batch + cfg.dev_windows, 2)  # the pool, then the dev windows
        return ArmRunner(cfg, inp.model, drawn[:cfg.steps * cfg.batch], drawn[cfg.steps * cfg.batch:], inp.evals, start,
                     window, logits, inp.text.long_window(cfg.streaming_len))

    # the untouched model on the held-out windows at W: the no-op curve's point, where it has one
    point = next((p for p in curve if p["window"] == window), None)
    untouched = point if point is not None else stages.get(
        "untouched", "noop_plain", lambda: gap(*(shared().eval_loss(inp.model, m) for m in (KEPT, DROPPED))),
        start=start)
    heads = stages.get("untouched_heads", "noop_plain", lambda: head_stats(inp.model, inp.evals[:HEAD_WINDOWS, :-1],
                                                                           window, KEPT))
    arms = {}
    precision = arm_precision(cfg.dtype)
    for name in cfg.arms:
        runs = _arm_runs(cfg, stages, shared, name)
        arms[name] = {"what": ARM_SPECS[name].what, "params": runs[0][DROPPED]["params"], "runs": runs,
                      **arm_summary(name, runs, untouched, heads["first"], start, cfg.kept_tol)}
    streaming = stages.get("streaming", "streaming",
                           lambda: streaming_curves(inp.model, inp.text.long_window(cfg.streaming_len), window))
    streaming = {**streaming, "curves": {**streaming["curves"], **{
        name: a["runs"][0]["streaming"] for name, a in arms.items() if "streaming" in a["runs"][0]}}}
    streaming["late_mean"] = streaming_late(streaming)
    return {"start_layer": start, "first_logits": logits, "untouched": {**untouched, "heads": heads}, "arms": arms,
            "arm_precision": {**precision.as_dict(), "looks": precision.dtype},  # the looks run in the steps' dtype
            "streaming": streaming}


def run_pretrained(cfg: PretrainedConfig, command: str | None = None) -> Path:
    """The study alone: ``results.json`` (the study's results under its name, judged) and
    ``report.md`` in ``cfg.out_dir``; returns the report's path."""
    started = time.time()
    out = Path(cfg.out_dir)
    part = judge_part(pretrained_part(cfg, out))
    meta = run_meta(command or f"gatedattn reproduce --study {NAME}", started)
    atomic_write_json(out / "results.json", json_safe({"study": NAME, NAME: part.to_dict(), "meta": meta}))
    return write_pretrained_report(part, meta, out)


def rewrite_pretrained_report(results: dict[str, Any], out: Path) -> Path:
    """``--report-only``: the claims judged anew (``results``, which ``--report-only``
    writes back, takes them), the report and plots written again."""
    part = judge_part(PretrainedResults.from_dict(results[NAME]))
    results[NAME] = part.to_dict()
    return write_pretrained_report(part, results["meta"], out)


def judge_part(part: PretrainedResults) -> PretrainedResults:
    """The study's results with its claims judged (anew) by the current rules. Results
    written before the credit rule get it applied, with the default tolerance, to the
    held-out losses they kept, so that no old report credits a paired figure alone. The
    rules read the results as ``results.json`` holds them."""
    recorded = {**part.to_dict(), "config": dict(part.config),  # credit_old_results records in these copies
                **({"arms": {name: dict(a) for name, a in part.arms.items()}} if part.arms is not None else {})}
    credit_old_results(recorded, PretrainedConfig().kept_tol)
    return part.replace(config=recorded["config"], arms=recorded.get("arms"), claims=claims.judge(recorded))


def run_part(cfg: PretrainedConfig, out: Path) -> PretrainedResults:
    """The study as a part of the main job, in ``out/pretrained`` (finished stages are
    reused by a second call); its results, judged."""
    return judge_part(pretrained_part(cfg.replace(out_dir=str(out / NAME)), out / NAME))
