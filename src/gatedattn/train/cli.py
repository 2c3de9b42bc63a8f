"""``gatedattn train`` and ``gatedattn sweep``.

    gatedattn train --variant NAME --preset SIZE --data DIR --out DIR [--set KEY=VALUE ...] [--resume]
    gatedattn train --resume RUN_DIR [--set steps=N ...]   (continue a run with its recorded config)
    gatedattn train --init-from MODEL [--variant V] [--trainable GROUPS] --data DIR --out DIR [--set ...]
                    (continued pretraining of MODEL; V retrofits a gate; GROUPS train, the rest is frozen)
    gatedattn sweep --variants A,B --lr 1e-3,3e-3 [--seeds 0,1] --preset SIZE --data DIR --out DIR
                    [--set KEY=VALUE ...] [--resume]

Under ``torchrun`` the same commands train data-parallel. ``python -m gatedattn.train.cli``
runs these two subcommands on their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from gatedattn.cli import main as cli_main
from gatedattn.infra.errors import GatedAttnError, Interrupted
from gatedattn.infra.inputs import check_input, input_options
from gatedattn.infra.io import check_no_overlap, check_writable, json_safe, read_json_object
from gatedattn.infra.settings import apply_sets, help_text, parse_list
from gatedattn.train.config import TrainConfig, parse_sets
from gatedattn.train.loop import train
from gatedattn.train.rundir import CONFIG
from gatedattn.train.sweep import SWEEP_MD, sweep


def _keys_epilog() -> str:
    return help_text(TrainConfig)


# Keys that a flag of train/sweep sets: a run's identity has one source.
FLAG_KEYS = {"data_dir": "--data", "out_dir": "--out", "model.variant": "--variant", "model.size": "--preset",
             "init_from": "--init-from", "trainable": "--trainable", "save_code": "--no-code"}


def _base(args) -> dict:
    _check_init_from(args)
    return {"data_dir": args.data, "out_dir": args.out, "variant": getattr(args, "variant", None) or "baseline",
            "preset": args.preset or "tiny", "init_from": getattr(args, "init_from", None),
            "trainable": _trainable(args), "save_code": not args.no_code}


def _trainable(args) -> tuple[str, ...]:
    return () if args.trainable is None else tuple(parse_list(args.trainable, str, "--trainable"))


def _check_init_from(args, init_from: str | None = None) -> None:
    """``--preset`` names a size that the model of ``--init-from`` (or of the resumed run's
    ``init_from``) already has: giving both is refused (the TrainConfig cannot tell an
    explicit ``--preset tiny`` from the default)."""
    init_from = init_from or getattr(args, "init_from", None)
    if init_from is not None and args.preset is not None:
        raise GatedAttnError(f"--preset {args.preset} conflicts with --init-from {init_from}: the model's size "
                             f"comes from that model; give one of them")


def _require(args, *names: str) -> None:
    missing = [f"--{n}" for n in names if getattr(args, n) is None]
    if missing:
        raise GatedAttnError(f"the following arguments are required: {', '.join(missing)}")


def _resumed_config(args) -> TrainConfig:
    """``--resume RUN_DIR``: the config the run recorded, with the flags given now (only the
    resumable fields, such as steps, may differ; the resume check says which did)."""
    run = Path(args.resume)
    if not run.is_dir():
        raise GatedAttnError(f"--resume {run}: no such run directory")
    if args.out is not None and Path(args.out).resolve() != run.resolve():
        raise GatedAttnError(f"--resume {run} and --out {args.out} name different directories; give one")
    train = read_json_object(run / CONFIG).get("train")
    if not isinstance(train, dict):
        raise GatedAttnError(f"{run / CONFIG} has no 'train' object; it is not a run directory")
    # the recorded stop_at_step ended the earlier invocation; continuing goes on (unless --set again)
    cfg = TrainConfig.from_dict({**train, "out_dir": str(run), "stop_at_step": None})
    _check_init_from(args, cfg.init_from)
    init_from = getattr(args, "init_from", None)
    for flag, now, then in (("--variant", getattr(args, "variant", None), cfg.model.variant),
                            ("--preset", args.preset, cfg.model.size),
                            ("--init-from", init_from, cfg.init_from),
                            ("--trainable", ",".join(_trainable(args)) or None, ",".join(cfg.trainable))):
        if now is None or now == then:
            continue
        if not (flag == "--init-from" and then is not None and Path(now).resolve() == Path(then).resolve()):
            raise GatedAttnError(f"{flag} {now} differs from the run's {then!r}; a resumed run keeps its model")
    if args.no_code:
        cfg = cfg.replace(save_code=False)
    if args.data is not None:
        cfg = cfg.replace(data_dir=args.data)
    else:
        check_input(cfg.data_dir, "the run's data_dir")  # as --data would be checked
    if init_from is None:
        check_input(cfg.init_from, "the run's init_from")
    return apply_sets(cfg, args.set, FLAG_KEYS)


def _train_config(args) -> tuple[TrainConfig, bool]:
    """The run's config and whether to resume."""
    if isinstance(args.resume, str):
        return _resumed_config(args), True
    _require(args, "data", "out")
    return TrainConfig.from_sets(_base(args), args.set, FLAG_KEYS), bool(args.resume)


def _check_warmup(cfg: TrainConfig, sets: list[str]) -> None:
    """A warm-up longer than the run is an error when ``--set warmup_steps`` asked for it
    (train() itself warns when it is the default's)."""
    problem = cfg.warmup_problem()
    if problem is not None and "warmup_steps" in parse_sets(sets):
        raise GatedAttnError(problem)


def _summary_line(r) -> str:
    def f(x):
        return "–" if x is None else f"{x:.4f}"

    line = (f"{r.out_dir}: {r.steps}/{r.total_steps} steps, {r.tokens:,} tokens, loss {f(r.final_loss)}, "
            f"val loss {f(r.val_loss)}, spikes {r.spikes}, skipped {r.skipped_steps}, {r.tokens_per_s:,.0f} tok/s")
    if r.diverged:
        line += f"; DIVERGED at step {r.diverged_step} ({r.diverged_reason})"
    elif r.complete:
        line += f"; final model in {r.final_dir}"
    else:
        line += "; stopped early (continue with --resume)"
    return line


def _is_main() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _train(args) -> int:
    cfg, resume = _train_config(args)
    _check_warmup(cfg, args.set)
    check_no_overlap(cfg.out_dir, "--out", [("--data", cfg.data_dir)])
    result = train(cfg, resume=resume)
    if _is_main():
        print(json.dumps(json_safe(result.to_dict()), indent=2) if args.json else _summary_line(result))
    if result.interrupted is not None:
        raise Interrupted(f"{result.interrupted}: stopped after step {result.steps} with a checkpoint; continue "
                          f"with: gatedattn train --resume {result.out_dir}", 128 + result.interrupted_signal)
    return 0


def _sweep(args) -> int:
    variants = parse_list(args.variants, str, "--variants")
    lrs = parse_list(args.lr, float, "--lr")
    seeds = parse_list(args.seeds, int, "--seeds") if args.seeds else None
    if isinstance(args.resume, str):
        raise GatedAttnError("sweep takes --resume without a directory (it resumes every run under --out)")
    _require(args, "data", "out")
    flags = {**FLAG_KEYS, "model.variant": "--variants", "lr": "--lr", **({"seed": "--seeds"} if seeds else {}),
             "init_from": "gatedattn train --init-from (a sweep trains fresh models)"}
    base = TrainConfig.from_sets(_base(args) | {"variant": variants[0] if variants else "baseline"}, args.set, flags)
    for s in seeds or []:
        if s < 0:
            raise GatedAttnError(f"--seeds: {s} is negative; seeds are integers >= 0")
    for lr in lrs:
        _check_warmup(base.replace(lr=lr), args.set)
    check_writable(base.out_dir, "--out", kind="dir")
    check_no_overlap(base.out_dir, "--out", [("--data", base.data_dir)])
    rows = sweep(base, variants, lrs, seeds, resume=args.resume)
    if _is_main():
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(Path(base.out_dir, SWEEP_MD).read_text(encoding="utf-8"), end="")
    return 0


def register(subparsers) -> None:
    """Add ``train`` and ``sweep`` to the ``gatedattn`` command line."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "train", help="train a model with one attention variant", formatter_class=fmt, epilog=_keys_epilog(),
        description=textwrap.fill(
            "Train a GatedLM on a prepared data directory (gatedattn data prepare). Writes config.json, "
            "code_version, env.json, metrics.jsonl/.csv, summary.json, checkpoints/ and final/ into --out. "
            "Run under torchrun for data parallelism.", width=90),
    )
    p.add_argument("--variant", default=None, help="attention preset (gatedattn variants; default baseline); with "
                   "--init-from, the gate (or sink) to retrofit into that model (identity init: its outputs are "
                   "kept), baseline keeping the model as it is")
    p.add_argument("--init-from", metavar="MODEL", default=None,
                   help="continued pretraining: start from this model's config and weights instead of a preset (a "
                        "gatedattn directory such as a run's final/, or a HF Llama/Qwen2/Qwen3 directory; anything "
                        "gatedattn.hf.load_model reads). Its tokenizer.json, if it has one, must be the data's; "
                        "without one the data's vocabulary must fit the model's. Not with --preset or model.* keys")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_train, **input_options(("--data", "data"), ("--init-from", "init_from"),
                                                ("--resume", "resume"), written=("--resume",)))

    p = subparsers.add_parser(
        "sweep", help="train a grid of variants x learning rates with identical data", formatter_class=fmt,
        epilog=_keys_epilog(),
        description=textwrap.fill(
            "Train every variant at every learning rate (and seed), one run after another with the same data "
            "order, each in OUT/<variant>_lr<lr>; write OUT/sweep.json and OUT/sweep.md (final loss, spikes, "
            "divergence).", width=90),
    )
    _common(p)
    p.add_argument("--variants", required=True, metavar="A,B,...", help="comma-separated attention presets")
    p.add_argument("--lr", required=True, metavar="X,Y,...", help="comma-separated learning rates")
    p.add_argument("--seeds", metavar="S,T,...", help="comma-separated seeds (default: the seed setting)")
    p.add_argument("--json", action="store_true", help="print the rows of sweep.json")
    p.set_defaults(func=_sweep, **input_options(("--data", "data")))


def _common(p) -> None:
    p.add_argument("--preset", default=None, help="model size: micro, tiny, small, base, medium (default tiny)")
    p.add_argument("--data", metavar="DIR", help="a directory written by `gatedattn data prepare` (required)")
    p.add_argument("--out", metavar="DIR", help="the run directory (required)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a TrainConfig field or model key (repeatable; keys listed below)")
    p.add_argument("--trainable", metavar="GROUPS", default=None,
                   help="train only these parameters and freeze the rest (default: everything trains): "
                        "comma-separated groups gates (every gate parameter), sink (the attention-sink logits), all, "
                        "or fnmatch patterns over parameter names such as 'blocks.*.attn.o_proj.*'. Frozen "
                        "parameters get no gradient and no optimizer state; checkpoints and final/ hold the whole "
                        "model")
    p.add_argument("--no-code", action="store_true",
                   help="write final/ without the modelling code (by default it carries the code and its auto_map, "
                        "as every save does, so it loads with trust_remote_code=True where gatedattn is not "
                        "installed)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                   help="continue from the latest checkpoint in --out (start afresh if there is none); "
                        "train --resume RUN_DIR alone continues RUN_DIR with its recorded config")


def main(argv: list[str] | None = None) -> int:
    """``python -m gatedattn.train.cli train ...``, the same as ``gatedattn train ...``
    (a module path for ``torchrun -m``)."""
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
