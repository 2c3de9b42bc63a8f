"""Training throughput on this machine: tokens/s of forward + backward + optimizer step.

    python -m gatedattn.bench.train_throughput [--presets tiny,small]
        [--variants baseline,gated] [--dtypes fp32,bf16] [--seq-len 256] [--batch 16]
        [--warmup 2] [--steps 5] [--vocab 4096] [--optimizer adamw] [--json]

Each configuration builds a fresh model (seed 0) and the trainer's optimizer
(``gatedattn.train.build_optimizer``: AdamW with the trainer's parameter groups, or
Muon + AdamW), runs ``--warmup`` untimed steps, then times ``--steps`` steps of
``--batch`` random sequences of ``--seq-len`` tokens: forward under the dtype's autocast,
fp32 cross-entropy, backward, gradient clipping at 1.0, optimizer step. tokens/s counts
predicted tokens (batch x seq_len) per second over the timed steps; ms/step is the median
step. The last column is the variant's step time relative to the baseline of the same
preset and dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import torch

from gatedattn.models.lm import GatedLM
from gatedattn.train import TrainConfig, build_optimizer


def bench(preset: str, variant: str, dtype: str, *, seq_len: int, batch: int, warmup: int, steps: int,
          vocab: int, optimizer: str, device: torch.device) -> dict:
    cfg = TrainConfig(preset=preset, variant=variant, seq_len=seq_len,
                      micro_batch=batch, dtype=dtype, optimizer=optimizer)
    torch.manual_seed(0)
    model = GatedLM(cfg.model_config(vocab)).to(device)
    opt = build_optimizer(model, cfg)
    params = [p for p in model.parameters()]
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab, (warmup + steps, batch, seq_len + 1), generator=gen)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if dtype == "bf16"
                else contextlib.nullcontext())
    times = []
    for i in range(warmup + steps):
        b = data[i].to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            logits = model(b[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.detach())  # the trainer reads the loss every step
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    return {"preset": preset, "variant": variant, "dtype": dtype, "params": n_params,
            "ms_per_step": 1000 * statistics.median(times),
            "tokens_per_s": batch * seq_len * len(times) / sum(times), "final_loss": float(loss.detach())}


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--variants", default="baseline,gated")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "muon"))
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for preset in args.presets.split(","):
        for dtype in args.dtypes.split(","):
            for variant in args.variants.split(","):
                rows.append(bench(preset, variant, dtype, seq_len=args.seq_len, batch=args.batch, warmup=args.warmup,
                                  steps=args.steps, vocab=args.vocab, optimizer=args.optimizer, device=device))
                print(f"  {preset} {variant} {dtype}: {rows[-1]['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else f"{_cpu_name()} CPU"
    print(f"training throughput: {where}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); batch {args.batch} x seq {args.seq_len}, vocab {args.vocab}, "
          f"{args.optimizer}, median of {args.steps} steps after {args.warmup} warm-up")
    print("| preset | variant | dtype | params | ms/step | tokens/s | vs baseline |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        base = next((b for b in rows if b["preset"] == r["preset"] and b["dtype"] == r["dtype"]
                     and b["variant"] == "baseline"), None)
        rel = f"{r['ms_per_step'] / base['ms_per_step']:.2f}x" if base else "–"
        print(f"| {r['preset']} | {r['variant']} | {r['dtype']} | {r['params'] / 1e6:.2f} M | {r['ms_per_step']:.0f} "
              f"| {r['tokens_per_s']:,.0f} | {rel} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
