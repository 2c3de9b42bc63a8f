"""The natural-text study's runs: the data (the bundled corpus prepared once), one training
run with the sink metrics tracked over training, its analysis and extrapolation, the
per-variant summaries over seeds, and the study's start, provenance and gate costs.

Layout of a study's ``out``::

    out/results.json            every number the report shows
    out/report.md, out/*.png    the report
    out/runs/<variant>-s<seed>/ each training run (metrics.jsonl, checkpoints, final/)

A second call with the same ``out`` resumes: finished runs are reused, interrupted ones
continue from their last checkpoint.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn.analysis.analyze import analyze, extrapolate
from gatedattn.analysis.metrics import seed_stat
from gatedattn.analysis.registry import TEXT_METRICS, keys
from gatedattn.data import TokenData, prepare
from gatedattn.infra.cache import cache_root
from gatedattn.infra.io import atomic_write_json, json_safe
from gatedattn.infra.precision import resolve_dtype
from gatedattn.infra.provenance import run_meta, say
from gatedattn.infra.timing import interleaved_times
from gatedattn.layers.cost import cost
from gatedattn.models.lm import GatedLM
from gatedattn.reproduce.batch import Record, Run, check_interrupted, run_batch
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.reproduce.text.plan import fit_plan, step_fn
from gatedattn.reproduce.text.results import TextResults
from gatedattn.train import TrainConfig, train
from gatedattn.train.metrics import SpeedMeter, read_records


SUMMARY_METRICS = keys(TEXT_METRICS, "analysis")


def default_data_dir() -> Path:
    """Where the default corpus is prepared once and reused."""
    return cache_root() / "default-data-v1"


def ensure_data(cfg: TextConfig) -> Path:
    if cfg.data_dir:
        return Path(cfg.data_dir)
    path = default_data_dir()
    if not (path / "manifest.json").is_file():
        say("reproduce", f"preparing the default corpus into {path} (once)")
        prepare(None, path, default_corpus=True, progress=cfg.train.progress)
    return path


class SinkTracker:
    """Eval hook: F-Attn (mean over layers, and ``f_attn_max`` of the strongest layer),
    Sink^eps and M-Act on a few validation sequences during training."""

    def __init__(self, data: TokenData, seq_len: int, sequences: int = 4):
        self.batch = next(data.val_batches(seq_len=seq_len, batch_size=sequences, max_batches=1))

    def __call__(self, model: torch.nn.Module, step: int, tokens: int) -> dict[str, float]:
        model = getattr(model, "module", model)
        r = analyze(model, [self.batch.to(next(model.parameters()).device)], layers_for_maps=[])
        out = {"f_attn": r["f_attn"], "f_attn_max": max(r["f_attn_per_layer"]), "sink_eps": r["sink_eps"],
               "m_act": r["m_act"]}
        if r.get("gate_mean") is not None:
            out["gate_mean"] = r["gate_mean"]
        return {k: float(v) for k, v in out.items() if v is not None}


def text_run(cfg: TextConfig, data_dir: Path, data: TokenData, variant: str, seed: int, steps: int, out: Path, *,
             lr: float | None = None, analyse: bool = True, tag: str | None = None) -> Run:
    """One run of a batch: ``variant`` and ``seed`` trained for ``steps`` into
    ``out/runs/<tag>`` (resumed from its last checkpoint; a finished run trains no step),
    then analysed (the analysis kept in the run's ``analysis.json``)."""
    tag = tag or f"{variant}-s{seed}" + (f"-lr{lr:g}" if lr is not None else "")
    return Run(tag, functools.partial(run_one, cfg, data_dir, data, variant, seed, steps, out, lr=lr, analyse=analyse,
                                      tag=tag))


def run_one(cfg: TextConfig, data_dir: Path, data: TokenData, variant: str, seed: int, steps: int,
            out: Path, *, lr: float | None, analyse: bool, tag: str) -> dict[str, Any]:
    """Train (or resume) and analyse the run :func:`text_run` describes; its record."""
    run_dir = out / "runs" / tag
    tcfg = cfg.train_config(variant, seed, steps=steps, out_dir=str(run_dir), lr=lr).replace(data_dir=str(data_dir))
    say("reproduce", f"training {tag}: {steps} steps of {tcfg.micro_batch}x{tcfg.seq_len} tokens")
    hook = SinkTracker(data, tcfg.seq_len) if analyse else None
    result = train(tcfg, eval_hook=hook, resume=True)
    check_interrupted(result, tag)
    run: dict[str, Any] = {
        "variant": variant, "seed": seed, "lr": tcfg.lr, "run_dir": str(run_dir.relative_to(out)),
        "steps": result.steps, "tokens": result.tokens, "diverged": result.diverged,
        "diverged_reason": result.diverged_reason, "spikes": result.spikes,
        "final_loss": result.final_loss, "tokens_per_s": result.tokens_per_s, "train_seconds": result.elapsed_s,
        **_curves(read_records(run_dir)),
    }
    if not analyse or result.final_dir is None:
        return run
    return {**run, **analyse_run(cfg, data, run_dir, result.final_dir, result.steps, tcfg.seq_len, tag)}


def analyse_run(cfg: TextConfig, data: TokenData, run_dir: Path, final_dir: str, steps: int, seq_len: int,
                tag: str) -> dict[str, Any]:
    """The analysis (and extrapolation) of a finished run; kept in ``analysis.json`` so that
    a later call with the same analysis settings reuses it."""
    cache = Record(run_dir / "analysis.json", {"steps": steps, "analysis_sequences": cfg.analysis_sequences,
                                               "multiples": list(cfg.multiples), "seq_len": seq_len})
    saved = cache.load()
    if saved is not None:
        say("reproduce", f"reusing the analysis of {tag}")
        return saved["run"]
    model = GatedLM.from_pretrained(final_dir)
    batches = data.val_batches(seq_len=seq_len, batch_size=8, max_batches=math.ceil(cfg.analysis_sequences / 8))
    say("reproduce", f"analysing {tag}")
    found = {"analysis": analyze(model, batches, layers_for_maps=[model.cfg.n_layers // 2])}
    if cfg.multiples:
        found["extrapolation"] = extrapolate(model, data, train_len=seq_len, multiples=cfg.multiples, batch_size=4)
    cache.save({"key": cache.key, "run": found})
    return found


TRACKED = ("f_attn", "f_attn_max", "sink_eps", "m_act", "gate_mean")  # the SinkTracker's figures over training


def _series(records: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list]:
    """Each key's values over ``records``, skipping records without it."""
    return {k: [r[k] for r in records if k in r] for k in keys}


def _curves(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Training and validation curves and the sink metrics over training, from metrics.jsonl."""
    train_recs = [r for r in records if r.get("kind") == "train"]
    eval_recs = [r for r in records if r.get("kind") == "eval"]
    tracked = [r for r in eval_recs if "f_attn" in r]
    return {
        "curve": {"steps": [r["step"] for r in train_recs], **_series(train_recs, ("tokens", "loss"))},
        "val_curve": {"steps": [r["step"] for r in eval_recs], **_series(eval_recs, ("tokens", "val_loss"))},
        "over_training": {"tokens": [r["tokens"] for r in tracked], **_series(eval_recs, TRACKED)},
    }


def _extrapolation_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scaling method the loss at the longest length each seed reached, and that
    length as a multiple of the context (nothing unless every seed measured it)."""
    ext = [r.get("extrapolation") for r in runs]
    if not all(ext):
        return {}
    out: dict[str, Any] = {}
    for method in ext[0]["methods"]:
        longest = [next((x for x in reversed(e["methods"][method]) if x is not None), None) for e in ext]
        out[f"ext_{method}_longest"] = seed_stat(longest)
    first = ext[0]["methods"][next(iter(ext[0]["methods"]))]
    done = [L for L, x in zip(ext[0]["lengths"], first) if x is not None]
    out["ext_longest_multiple"] = done[-1] / ext[0]["train_len"] if done else None
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, std and per-seed values of every headline metric of one variant."""
    summary: dict[str, Any] = {key: seed_stat([r.get("analysis", {}).get(key) for r in runs]) for key in SUMMARY_METRICS}
    summary["tokens_per_s"] = seed_stat([r["tokens_per_s"] for r in runs])
    summary["final_train_loss"] = seed_stat([r["final_loss"] for r in runs])
    return {**summary, **_extrapolation_summary(runs)}


def add_strongest_layer(results: dict[str, Any]) -> None:
    """The layer where the baseline's sink is strongest (largest seed-mean F-Attn) as
    ``results["strongest_layer"]``, and every variant's F-Attn at that layer as the summary
    metric ``f_attn_strongest``; without a baseline, nothing."""
    base = results["variants"].get("baseline")
    if not base:
        return
    per_layer = [r["analysis"]["f_attn_per_layer"] for r in base["runs"] if r.get("analysis")]
    if not per_layer:
        return
    means = [statistics.fmean(col) for col in zip(*per_layer)]
    layer = max(range(len(means)), key=means.__getitem__)
    results["strongest_layer"] = layer
    for variant, entry in results["variants"].items():
        values = [r["analysis"]["f_attn_per_layer"][layer] for r in entry["runs"] if r.get("analysis")]
        if values:
            results["summary"][variant]["f_attn_strongest"] = seed_stat(values)


def run_apart(cfg: TextConfig, command: str | None, key: str, study: Callable[..., dict[str, Any]],
              report: Callable[[dict[str, Any], Path], Path]) -> Path:
    """A study run on its own (the lr and rank studies): ``study(cfg, data_dir, data,
    out)`` trains into ``results[key]``; writes ``results.json`` and, with ``report``,
    ``report.md``; returns the report's path."""
    started = time.time()
    out, data_dir, data, results = start_study(cfg)
    results[key] = study(cfg, data_dir, data, out)
    results["config"].update(steps=results[key]["steps"], batch_tokens=cfg.train.micro_batch * cfg.train.seq_len,
                             seeds=list(range(cfg.seeds)))
    results["meta"] = study_meta(cfg, data, command, started)
    atomic_write_json(out / "results.json", json_safe(results))
    return report(results, out)


def step_speed(train_cfg: TrainConfig, data: TokenData, step_s: float) -> dict[str, Any]:
    """Model FLOP/s and MFU of one training step of ``train_cfg`` that took ``step_s``."""
    tokens_per_s = train_cfg.tokens_per_step(1) / step_s if step_s > 0 else 0.0
    return SpeedMeter.for_config(train_cfg, data).fields(tokens_per_s)


def open_data(cfg: TextConfig) -> tuple[Path, TokenData]:
    """The study's data directory (prepared once where none is given) and its tokens,
    checked."""
    data_dir = ensure_data(cfg)
    data = TokenData(data_dir, verify=True)
    data.check_tokenizer()
    return data_dir, data


def start_study(cfg: TextConfig) -> tuple[Path, Path, TokenData, dict[str, Any]]:
    """A study's output directory, its data (prepared once where none is given, and
    checked before the output directory exists), and its results as they start."""
    data_dir, data = open_data(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {"study": cfg.STUDY, "config": {**cfg.to_dict(), **_report_fields(cfg.train)},
               "variants": {}, "summary": {}}
    return out, data_dir, data, results


def text_part(cfg: TextConfig, data_dir: Path, data: TokenData, out: Path,
              results: dict[str, Any]) -> tuple[TextConfig, TextResults]:
    """The natural-text study: plan the steps (``fit_plan``), train and analyse every
    variant and seed, then the layer where the baseline's sink is strongest, each
    variant's gate cost and its training step timed in interleaved rounds (the overhead
    claim); the config that ran and the part's results. The job's ``results`` take the
    part's config as their ``config`` and are written with the runs so far after each
    variant (progress survives a crash)."""
    started = time.time()
    cfg, steps, step_s, cuts, decision = fit_plan(cfg, data)
    results["config"] = {**cfg.to_dict(), **_report_fields(cfg.train), "compile_choice": decision}
    found: dict[str, Any] = {"variants": {}, "summary": {}}
    for variant in cfg.variants:
        runs = run_batch([text_run(cfg, data_dir, data, variant, seed, steps, out) for seed in range(cfg.seeds)])
        found["variants"][variant] = {"runs": runs}
        found["summary"][variant] = summarize(runs)
        atomic_write_json(out / "results.json", json_safe({**results, **found}))
    minutes = (time.time() - started) / 60
    add_strongest_layer(found)
    gate_cost = gate_costs(cfg, data, [*cfg.variants, "gated", "hyga-lowrank"])
    say("reproduce", "timing training steps of each variant in interleaved rounds")
    samples = interleaved_times({v: step_fn(cfg, v, data) for v in cfg.variants}, repeats=cfg.timing_rounds,
                                warmup=2, per_sample=3)
    step_time = {v: statistics.median(s) for v, s in samples.items()}
    results["config"].update(steps=steps, batch_tokens=cfg.train.micro_batch * cfg.train.seq_len,
                             seeds=list(range(cfg.seeds)), step_seconds=step_s, cuts=cuts)
    return cfg, TextResults(
        variants=found["variants"], summary=found["summary"], text_minutes=minutes,
        strongest_layer=found.get("strongest_layer"), gate_cost=gate_cost, step_time_samples=samples,
        step_time=step_time, step_mfu={v: step_speed(cfg.step_config(v), data, t) for v, t in step_time.items()})


def start_part(cfg: TextConfig, out: Path) -> Callable[[dict[str, Any]], None]:
    """The study as a part of a job that writes into ``out``: its data prepared and
    checked now, before any part of the job trains; returns the part's run, which trains
    and analyses every variant (:func:`text_part`) and merges the part's results into the
    job's, at their top level where every natural-text report reads them, with its data
    and model in the job's provenance (``meta``)."""
    cfg = cfg.replace(out_dir=str(out))
    data_dir, data = open_data(cfg)

    def run(results: dict[str, Any]) -> None:
        ran, found = text_part(cfg, data_dir, data, out, results)
        found.merge_into(results)
        results["meta"] = {**results.get("meta", {}), **text_meta(ran, data)}

    return run


def study_meta(cfg: TextConfig, data: TokenData, command: str | None, started: float) -> dict[str, Any]:
    """The provenance of a study, with its data, model and precision in words."""
    return {**run_meta(command or cfg.command(), started), **text_meta(cfg, data)}


def text_meta(cfg: TextConfig, data: TokenData) -> dict[str, Any]:
    """The study's data, model, analysis tokens and precision, in words (its part of a
    report's provenance)."""
    mcfg = cfg.model_config("baseline", data.vocab_size)
    a = mcfg.attention
    n_params = sum(p.numel() for p in GatedLM(mcfg).parameters())
    return {
        "data": f"{data.manifest.source} — {data.train_tokens:,} training / {data.val_tokens:,} validation tokens, "
                f"vocab {data.vocab_size} (byte-level BPE)",
        "model": f"{mcfg.n_layers} layers, d_model {a.d_model}, {a.n_heads} heads ({a.n_kv_heads} KV), "
                 f"SwiGLU {mcfg.ffn_dim}, {n_params / 1e6:.2f} M parameters (baseline)",
        "analysis_tokens": cfg.analysis_sequences * cfg.train.seq_len,
        "precision": resolve_dtype(cfg.train.dtype, "cpu").as_dict(),
    }


def _report_fields(t: TrainConfig) -> dict[str, Any]:
    """The training settings the report quotes, by their report names."""
    return {"preset": t.model.size, "seq_len": t.seq_len, "micro_batch": t.micro_batch, "lr": t.lr,
            "warmup_steps": t.warmup_steps, "dtype": t.dtype, "optimizer": t.optimizer, "data_dir": t.data_dir,
            "schedule": t.schedule}


def gate_costs(cfg: TextConfig, data: TokenData, variants: list[str]) -> dict[str, dict[str, int]]:
    """Per attention layer of this run's model: parameters and FLOPs, total and of the gate."""
    costs = {}
    for v in dict.fromkeys(variants):
        attention = cfg.model_config(v, data.vocab_size).attention
        c = cost(attention, cfg.train.seq_len)
        costs[v] = {"gate_params": c.params["gate"], "gate_flops": c.flops["gate"],
                    "params": c.total_params, "flops": c.total_flops}
    return costs


def describe_recipe(t: TrainConfig, vocab_size: int) -> str:
    """The settings a study's runs share, in words (for reports of studies run apart)."""
    m = t.model_config(vocab_size)
    a = m.attention
    return (f"{m.n_layers} layers, d_model {m.d_model}, {a.n_heads} heads, q/k norm {'on' if a.qk_norm else 'off'}, "
            f"T {t.seq_len}, {t.micro_batch * t.grad_accum} sequences a step, {t.steps} steps, warm-up "
            f"{t.warmup_steps}, {t.schedule} decay, weight decay {t.weight_decay:g}, "
            f"gradient clipping {t.grad_clip:g}, {t.optimizer}")
