"""``gatedattn bench``: time and size every attention variant and transformers' equivalents."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.heap import HEAPS
from gatedattn.infra.inputs import input_options
from gatedattn.infra.io import atomic_write_json
from gatedattn.infra.outputs import check_file_output

HELP = "time and size the attention variants against baseline and transformers, on this machine"


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed when run from a shell, else rebuilt from the parsed options."""
    if sys.argv[1:2] == ["bench"]:
        return "gatedattn " + shlex.join(sys.argv[1:])
    argv = ["bench", "--device", args.device, "--dtype", args.dtype]
    argv += [f"--{flag}" for flag in ("compile", "quick", "json") if getattr(args, flag)]
    if args.variants:
        argv += ["--variants", ",".join(args.variants)]
    for flag in ("repeats", "warmup", "max_spread", "time_cap", "out"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return "gatedattn " + shlex.join(argv)


def _run(args: argparse.Namespace) -> int:
    from gatedattn.bench.config import BenchConfig  # lazy: --help must not import torch
    from gatedattn.bench.report import format_markdown  # lazy: --help must not import torch
    from gatedattn.bench.runner import run_bench  # lazy: --help must not import torch

    if args.out is not None:  # before minutes of timing, not after
        # (an empty PATH is the bundled model, no input of the user's)
        check_file_output(args.out, "--out", [("--real-model", getattr(args, "real_model", None) or None),
                                              ("--decode", getattr(args, "decode", None) or None)])
    if args.real_model is not None and args.decode is not None:
        raise ConfigError("--real-model and --decode are two benches: give one of them")
    if args.heap is not None and args.real_model is None:
        raise ConfigError(f"--heap {args.heap} applies to --real-model only (both models in one process under "
                          f"the same allocator)")
    if args.real_model is not None:
        return _run_real_model(args)
    if args.decode is not None:
        return _run_decode(args)
    given = {"device": args.device, "dtype": args.dtype, "compile": args.compile}
    if args.variants:
        given["variants"] = args.variants
    for name, field in (("repeats", "repeats"), ("warmup", "warmup"), ("max_spread", "max_spread"),
                        ("time_cap", "time_cap_s")):
        if getattr(args, name) is not None:
            given[field] = getattr(args, name)
    cfg = BenchConfig.quick(**given) if args.quick else BenchConfig(**given)
    res = run_bench(cfg, command=_command_line(args))
    if args.out:
        atomic_write_json(args.out, res)
    print(json.dumps(res, indent=2) if args.json else format_markdown(res))
    return 0


def _model_bench(args: argparse.Namespace, flag: str, what: str, quick: dict) -> dict:
    """The keywords of a bench on a pretrained model (``--real-model``, ``--decode``): the
    options that do not apply to it refused, ``--quick``'s shape, bounded rounds."""
    from gatedattn.bench.config import MAX_ROUNDS  # lazy: --help must not import torch

    others = [name for name, given in (("--variants", args.variants), ("--compile", args.compile),
                                       ("--device cuda", args.device == "cuda"), ("--max-spread", args.max_spread),
                                       ("--time-cap", args.time_cap)) if given]
    if others:
        raise ConfigError(f"{', '.join(others)} do not apply to {flag} (a CPU comparison with {what}); it takes "
                          f"--dtype, --repeats, --warmup, --quick, --json and --out")
    shape = dict(quick) if args.quick else {}
    for name in ("repeats", "warmup"):
        if getattr(args, name) is not None:
            low = 1 if name == "repeats" else 0
            if not low <= getattr(args, name) <= MAX_ROUNDS:
                raise ConfigError(f"--{name} must be an integer in [{low}, {MAX_ROUNDS:,}], got {getattr(args, name)}")
            shape[name] = getattr(args, name)
    return shape


def _report(args: argparse.Namespace, res: dict, markdown) -> int:
    if args.out:
        atomic_write_json(args.out, res)
    print(json.dumps(res, indent=2) if args.json else markdown(res))
    return 0


def _run_real_model(args: argparse.Namespace) -> int:
    from gatedattn.bench.real_model import format_real_model, run_real_model_bench  # lazy: --help must not import torch

    shape = _model_bench(args, "--real-model", "transformers' LlamaForCausalLM",
                         dict(batch=1, seq_len=16, decode_new=2, repeats=1, warmup=0, load_repeats=1,
                              backend="aot_eager"))
    return _report(args, run_real_model_bench(args.real_model or None, dtype=args.dtype, heap=args.heap or "default",
                                              **shape), format_real_model)


def _run_decode(args: argparse.Namespace) -> int:
    from gatedattn.bench.decode import format_decode, run_decode_bench  # lazy: --help must not import torch

    shape = _model_bench(args, "--decode", "transformers' generate", dict(prompt=8, new=4, repeats=1, warmup=0))
    return _report(args, run_decode_bench(args.decode or None, dtype=args.dtype, **shape), format_decode)


def register(sub) -> None:
    p = sub.add_parser("bench", help=HELP, description=(
        "Time one attention layer (forward + backward), a training step, peak memory and cached decoding for "
        "each variant at a default and a long-context shape, as ratios to baseline measured in the same "
        "run, next to the FLOP ratio; compare with transformers' Qwen3NextAttention, GptOssAttention, "
        "Qwen3ForCausalLM and generate; report MLA vs GQA KV-cache bytes per token; mark the speed "
        "targets met or missed. Progress goes to stderr, the report (Markdown or --json) to stdout."))
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of Markdown")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto (default): bf16 autocast where the device computes bf16 natively, else fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the layers and training steps (ours and "
                                                          "transformers' alike; decoding stays eager)")
    p.add_argument("--variants", type=_names, help="comma-separated presets (default baseline,gated,"
                                                   "gated-headwise,sink,hyga-lowrank,hyga-sink; baseline is always run)")
    p.add_argument("--repeats", type=int, help="timed repeats per workload at least (default 7; --quick 2)")
    p.add_argument("--warmup", type=int, help="untimed warm-up rounds before them (default 2; --quick 1)")
    p.add_argument("--max-spread", type=float, help="add rounds while a workload's spread (IQR / median) is at "
                                                   "least this (default 0.05)")
    p.add_argument("--time-cap", type=float, help="seconds of timed rounds per group of workloads after which no "
                                                  "rounds are added (default 120; --quick 0: exactly --repeats)")
    p.add_argument("--quick", action="store_true", help="tiny shapes and 2 repeats: a smoke test of seconds")
    p.add_argument("--out", help="also write the results as JSON to this file")
    p.add_argument("--real-model", nargs="?", const="", metavar="PATH",
                   help="instead: our GatedLM against transformers' LlamaForCausalLM on the same pretrained weights "
                        "(a .gguf file or a model directory; default the bundled SmolLM2-135M): analysis forward "
                        "(the loss, as analyze runs it; the logits alone for reference), training step (eager, and "
                        "torch.compiled with each compile's seconds and break-even; --quick compiles through "
                        "aot_eager), the "
                        "real-model study's frozen-model step (learnable sinks from its start layer up) and greedy "
                        "decoding, with MFU, each row's products alone and its per-round speedups (5 rounds "
                        "unless --repeats says otherwise)")
    p.add_argument("--heap", choices=HEAPS, help="with --real-model: default (glibc returns freed blocks to the "
                                                 "kernel, faulted in again at every step) or kept (kept in the heap "
                                                 "for the next step, as jemalloc and tcmalloc do; both models alike)")
    p.add_argument("--decode", nargs="?", const="", metavar="PATH",
                   help="instead: greedy decoding of a pretrained model (a .gguf file or a model directory; default "
                        "the bundled SmolLM2-135M), ours eager and compiled over a static cache against "
                        "transformers' eager generate and its static cache + torch.compile path, with each "
                        "compile's seconds and the new tokens from which ours compiled pays for itself")
    p.set_defaults(func=_run, **input_options(("--real-model", "real_model"), ("--decode", "decode")))
