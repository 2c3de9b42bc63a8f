"""``sweep``: a grid of training runs (variants x learning rates x seeds), one after another.

Every run of the grid sees the same batches in the same order (the data order depends on
the seed and the step only) and starts from a model initialised from the same seed. Each
run lives in ``OUT/<variant>_lr<lr>[_seed<seed>]``; after each run ``OUT/sweep.json`` and
``OUT/sweep.md`` (a markdown table: final loss, validation loss, spikes, divergence) are
rewritten, so an interrupted sweep shows what it has done and ``resume`` continues it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from gatedattn.data import TokenData
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.fmt import fmt_value
from gatedattn.infra.io import atomic_write_json, atomic_write_text
from gatedattn.train import checkpoint as ckpt_mod
from gatedattn.train import distributed as D
from gatedattn.train import rundir
from gatedattn.train.config import TrainConfig
from gatedattn.infra.io import json_safe
from gatedattn.train.loop import EvalHook, _check_data, check_trainable, train

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"


def run_name(variant: str, lr: float, seed: int | None = None) -> str:
    return f"{variant}_lr{lr:g}" + (f"_seed{seed}" if seed is not None else "")


def grid(base: TrainConfig, variants: Sequence[str], lrs: Sequence[float],
         seeds: Sequence[int] | None = None) -> list[TrainConfig]:
    """The configs of the grid, variant-major; each validated (unknown variants fail here)."""
    if base.init_from is not None:
        raise GatedAttnError("sweep trains every run from a fresh model; init_from is not supported (continue a "
                             "model with gatedattn train --init-from)")
    if not variants:
        raise GatedAttnError("sweep needs at least one variant")
    if not lrs:
        raise GatedAttnError("sweep needs at least one learning rate")
    for name, values in (("variant", variants), ("learning rate", lrs), ("seed", seeds or [])):
        if len(set(values)) != len(values):
            raise GatedAttnError(f"sweep: a {name} is listed twice in {list(values)}")
    out = Path(base.out_dir)
    configs = []
    named: dict[str, tuple] = {}
    for v in variants:
        for lr in lrs:
            for seed in (seeds if seeds else [None]):
                name = run_name(v, lr, seed)
                if name in named:  # two values that print alike would share one run directory
                    raise GatedAttnError(f"sweep: {named[name]} and {(v, lr, seed)} (variant, lr, seed) would both "
                                         f"train in {out / name}; give values that differ in 6 significant digits")
                named[name] = (v, lr, seed)
                configs.append(base.replace(
                    variant=v, lr=lr, seed=base.seed if seed is None else seed,
                    out_dir=str(out / name),
                ))
    return configs


def _check_all(configs: list[TrainConfig], resume: bool, world: int) -> None:
    """Every run's inputs and directory, before anything is written."""
    data = TokenData(configs[0].data_dir)
    for cfg in configs:
        _check_data(data, cfg)
        model_cfg = cfg.model_config(data.vocab_size, data.bos_id, data.eos_id)
        check_trainable(model_cfg, cfg.trainable)
        identity = rundir.run_identity(cfg, model_cfg, world, data)
        out = Path(cfg.out_dir)
        if resume:
            ckpt = ckpt_mod.latest_checkpoint(out) if out.is_dir() else None
            rundir.check_resume(out, identity, ckpt_mod.read_info(ckpt) if ckpt else None)
        else:
            rundir.check_new_run(out, identity)


def _row(cfg: TrainConfig, result: dict[str, Any] | None) -> dict[str, Any]:
    row = {"variant": cfg.model.variant, "lr": cfg.lr, "seed": cfg.seed, "out_dir": cfg.out_dir,
           "status": "pending" if result is None else ("diverged" if result["diverged"] else
                                                        "done" if result["complete"] else "stopped")}
    if result is not None:
        for k in ("steps", "total_steps", "tokens", "final_loss", "val_loss", "val_ppl", "spikes", "spike_steps",
                  "skipped_steps", "diverged", "diverged_step", "diverged_reason", "tokens_per_s", "elapsed_s"):
            row[k] = result[k]
    return row


_fmt = fmt_value


def markdown(rows: list[dict[str, Any]]) -> str:
    """The sweep table, then per variant the largest learning rate that did not diverge."""
    lines = ["| variant | lr | seed | steps | final loss | val loss | spikes | skipped | diverged |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "pending":
            lines.append(f"| {r['variant']} | {r['lr']:g} | {r['seed']} | – | – | – | – | – | pending |")
            continue
        div = f"yes (step {r['diverged_step']})" if r["diverged"] else "no"
        lines.append(
            f"| {r['variant']} | {r['lr']:g} | {r['seed']} | {r['steps']}/{r['total_steps']} | {_fmt(r['final_loss'])} "
            f"| {_fmt(r['val_loss'])} | {r['spikes']} | {r['skipped_steps']} | {div} |"
        )
    lines.append("")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        done = [r for r in rows if r["variant"] == variant and r["status"] != "pending"]
        stable = [r["lr"] for r in done if not r["diverged"]]
        failed = [r["lr"] for r in done if r["diverged"]]
        lines.append(f"- {variant}: largest stable lr {max(stable):g}" if stable else f"- {variant}: no stable lr")
        if failed:
            lines[-1] += f"; diverged at lr {', '.join(f'{x:g}' for x in sorted(set(failed)))}"
    return "\n".join(lines) + "\n"


def sweep(base: TrainConfig, variants: Sequence[str], lrs: Sequence[float], seeds: Sequence[int] | None = None,
          *, resume: bool = False, eval_hook: EvalHook | None = None) -> list[dict[str, Any]]:
    """Train every (variant, lr, seed) of the grid under ``base.out_dir``; return the rows of
    ``sweep.json`` (one per run: final loss, val loss, spikes, divergence, ...)."""
    configs = grid(base, variants, lrs, seeds)
    env = D.setup(base.device)
    try:
        D.run_on_main(lambda: _check_all(configs, resume, env.world_size), env)
        out = Path(base.out_dir)
        results: list[dict[str, Any] | None] = [None] * len(configs)
        for i, cfg in enumerate(configs):
            results[i] = train(cfg, eval_hook, resume=resume).to_dict()
            if env.is_main:
                rows = [_row(c, r) for c, r in zip(configs, results)]
                atomic_write_json(out / SWEEP_JSON, json_safe({
                    "variants": list(variants), "lrs": list(lrs), "seeds": list(seeds) if seeds else [base.seed],
                    "base": base.to_dict(), "runs": rows,
                }))
                atomic_write_text(out / SWEEP_MD, markdown(rows))
        return [_row(c, r) for c, r in zip(configs, results)]
    finally:
        D.teardown(env)
