"""Compiled vs eager training steps of the main job's models on this machine: what
torch.compile costs up front, what it saves per step, and which fits more steps into a
budget. The compiled and eager steps of a preset's variants are timed together in
interleaved rounds (the planner's own ``time_compiled``). Prints a markdown table; run it on
an otherwise idle machine.

    .venv/bin/python scripts/compile_vs_eager.py [--presets tiny,small] [--variants baseline,gated]
                                                 [--steps 10] [--budget-minutes 20]
"""

from __future__ import annotations

import argparse
import torch

from gatedattn.data import TokenData
from gatedattn.infra.precision import resolve_dtype
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.reproduce.text.plan import time_compiled
from gatedattn.reproduce.text.run import ensure_data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--variants", default="baseline,gated")
    p.add_argument("--steps", type=int, default=10, help="interleaved rounds (each times every step once)")
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
        cfg = TextConfig.make(preset=preset, variants=tuple(args.variants.split(",")))
        for variant, (overhead, compiled, eager) in time_compiled(cfg, data, repeats=args.steps).items():
            saved = eager - compiled
            even = f"{overhead / saved:.0f}" if saved > 0 else "never"
            print(f"| {preset} | {variant} | {eager:.3f} | {compiled:.3f} | {overhead:.1f} | {even} | "
                  f"{int(budget / eager)} / {max(int((budget - overhead) / compiled), 0)} |", flush=True)


if __name__ == "__main__":
    main()
