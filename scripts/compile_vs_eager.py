"""Compiled vs eager training steps of the main job's models on this machine: what
torch.compile costs up front, what it saves per step, and which fits more steps into a
budget. Prints a markdown table; run it on an otherwise idle machine.

    .venv/bin/python scripts/compile_vs_eager.py [--presets tiny,small] [--variants baseline,gated]
                                                 [--steps 20] [--budget-minutes 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gatedattn.data import TokenData
from gatedattn.precision import resolve_dtype
from gatedattn.reproduce.runner import TextConfig, ensure_data
from gatedattn.train.trainer import Trainer


def measure(cfg: TextConfig, data: TokenData, variant: str, compile_: bool, steps: int) -> tuple[float, float]:
    """(seconds of the first step, median seconds of the next ``steps``)."""
    torch._dynamo.reset()
    tcfg = cfg.train_config(variant, 0, steps=1_000_000).replace(compile=compile_, progress=False, tensorboard=False)
    trainer = Trainer(tcfg, data)
    started = time.perf_counter()
    trainer.train_step()
    first = time.perf_counter() - started
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - started)
    return first, statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--variants", default="baseline,gated")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget-minutes", type=float, default=20.0)
    args = p.parse_args()
    base = TextConfig()
    data = TokenData(ensure_data(base))
    budget = 60 * args.budget_minutes * 0.8  # the planner's share of a budget for training
    print(f"capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
          f"dtype {resolve_dtype(base.train.dtype, 'cpu').dtype}, torch {torch.__version__}\n")
    print("| preset | variant | eager s/step | compiled s/step | compile s (first step) | break-even steps | "
          f"steps in {args.budget_minutes:g} min: eager / compiled |")
    print("|---|---|---:|---:|---:|---:|---|")
    for preset in args.presets.split(","):
        cfg = TextConfig.make(preset=preset)
        for variant in args.variants.split(","):
            _, eager = measure(cfg, data, variant, False, args.steps)
            first, compiled = measure(cfg, data, variant, True, args.steps)
            overhead = first - compiled
            saved = eager - compiled
            even = f"{overhead / saved:.0f}" if saved > 0 else "never"
            print(f"| {preset} | {variant} | {eager:.3f} | {compiled:.3f} | {overhead:.1f} | {even} | "
                  f"{int(budget / eager)} / {max(int((budget - overhead) / compiled), 0)} |", flush=True)


if __name__ == "__main__":
    main()
