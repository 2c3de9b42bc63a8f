"""``run_bench``: build every workload of each shape, measure memory once per workload,
time the workloads of each kind interleaved, and turn the times into ratios.

Every ratio of a variant is against ``baseline`` measured in the same process and the
same interleaved rounds; transformers' models are compared with ours the same way.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import sys
from typing import Callable

import torch

from gatedattn.bench.config import REFERENCE, BenchConfig, Shape
from gatedattn.infra.provenance import code_version, cpu_model
from gatedattn.bench.kvcache import mla_vs_gqa
from gatedattn.bench.memory import cpu_training_bytes, cuda_peak_bytes
from gatedattn.bench.targets import evaluate
from gatedattn.infra.timing import Summary, summarize, times_until_steady
from gatedattn.bench.workloads import (HF_GPT_OSS, HF_QWEN3, HF_QWEN3_NEXT, OURS_GPT_OSS, OURS_QWEN3_NEXT,
                                       Context, Workload, build, model_config)
from gatedattn.models import mfu
from gatedattn.layers.variants import VARIANTS
from gatedattn.infra.device import resolve_device
from gatedattn.layers.cost import cost
from gatedattn.infra.precision import resolve_dtype

SCHEMA = "gatedattn-bench/1"
CPU_MEMORY = ("CPU: bytes of tensors saved for backward (each storage once) + parameters + gradients; "
              "an estimate, not an allocator peak (optimizer state and freed temporaries excluded)")
CUDA_MEMORY = ("CUDA: torch.cuda.max_memory_allocated during one call above the memory allocated before it, "
               "plus the workload's parameters and optimizer state")
# (label, kind, ours, theirs): ours vs what users would use instead
HF_PAIRS = (
    ("gated layer (fwd+bwd) vs Qwen3NextAttention", "layer", OURS_QWEN3_NEXT, HF_QWEN3_NEXT),
    ("sink layer (fwd+bwd) vs GptOssAttention (eager)", "layer", OURS_GPT_OSS, HF_GPT_OSS),
    ("baseline training step vs Qwen3ForCausalLM", "train", REFERENCE, HF_QWEN3),
    ("baseline cached greedy decoding vs Qwen3ForCausalLM.generate", "decode", REFERENCE, HF_QWEN3),
)


def machine(device: torch.device) -> dict:
    """What the figures were measured on."""
    info = {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import transformers  # lazy: heavy (transformers)

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, gpu_memory_bytes=p.total_memory, gpu_capability=f"{p.major}.{p.minor}",
                    cuda=torch.version.cuda)
    return info


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _memory(w: Workload, device: torch.device) -> dict:
    if device.type == "cuda":
        return {"kind": "cuda", **cuda_peak_bytes(w.run, device, w.resident())}
    return {"kind": "cpu-saved-tensors", **cpu_training_bytes(w.eager or w.run, w.params)}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def add_ratios(rows: dict[str, dict], variants: tuple[str, ...]) -> None:
    """Add ``time_ratio``, ``tokens_per_s_ratio``, ``memory_ratio`` and ``flop_ratio`` against
    the reference variant to the rows of our variants (in place)."""
    ref = rows.get(REFERENCE)
    if ref is None:
        raise ValueError(f"no {REFERENCE!r} row to take ratios against")
    for name in variants:
        row = rows.get(name)
        if row is None:
            continue
        row["time_ratio"] = _ratio(row.get("median_s"), ref.get("median_s"))
        row["tokens_per_s_ratio"] = _ratio(row.get("tokens_per_s"), ref.get("tokens_per_s"))
        if "memory_bytes" in row:
            row["memory_ratio"] = _ratio(row["memory_bytes"], ref.get("memory_bytes"))
        row["flop_ratio"] = _ratio(row.get("flops"), ref.get("flops"))


def decode_rate(batch: int, new_tokens: int, decode_s: float, prefill_s: float) -> float | None:
    """Tokens per second of decoding alone: generating ``new_tokens`` costs one prefill and
    ``new_tokens - 1`` single-token steps, generating one token costs the prefill alone."""
    extra = decode_s - prefill_s
    return batch * (new_tokens - 1) / extra if extra > 0 else None


def decode_spread(decode: Summary, prefill: Summary) -> float | None:
    """The spread of the decoding rate, which rests on the difference of two medians: the
    two interquartile ranges combined as independent errors, over that difference."""
    extra = decode.median - prefill.median
    if extra <= 0:
        return None
    return math.hypot(decode.q3 - decode.q1, prefill.q3 - prefill.q1) / extra


def _times(cfg: BenchConfig, calls: dict, sync: Callable[[], None]) -> dict:
    """Interleaved rounds: at least ``cfg.repeats``, more while a spread is ``cfg.max_spread``
    or more, until ``cfg.time_cap_s`` seconds of timed rounds."""
    return times_until_steady(calls, repeats=cfg.repeats, max_spread=cfg.max_spread, time_cap_s=cfg.time_cap_s,
                              warmup=cfg.warmup, sync=sync)


def _rounds(cfg: BenchConfig) -> str:
    if cfg.time_cap_s == 0:
        return f"{cfg.repeats} interleaved rounds"
    return (f">= {cfg.repeats} interleaved rounds until every spread is below {100 * cfg.max_spread:g} % "
            f"or {cfg.time_cap_s:g} s")


def train_flops_per_token(shape: Shape, kind: str, name: str, flops_config) -> float | None:
    """Model FLOPs (forward + backward) per token of a timed workload: one attention layer
    (``gatedattn.cost``) or the whole model of the training step (``gatedattn.models.mfu``);
    transformers' Qwen3 step has exactly our baseline model's configuration. None where
    the workload's model is not one of ours (transformers' layers)."""
    if kind == "layer":
        return None if flops_config is None else 3 * cost(flops_config, shape.seq_len).total_flops / shape.seq_len
    if kind == "train":
        if name == HF_QWEN3:
            name = REFERENCE
        return mfu.train_flops_per_token(model_config(shape, name), shape.seq_len) if name in VARIANTS else None
    return None


def measure_shape(cfg: BenchConfig, shape: Shape, ctx: Context, say: Callable[[str], None],
                  peak: "mfu.Peak | None" = None) -> dict:
    """All figures of one shape; model FLOP/s and MFU of the layer and training rows against ``peak``."""
    say(f"[{shape.name}] building workloads (T={shape.seq_len}, batch={shape.batch})")
    kinds = build(ctx, cfg.variants, cfg.hf)
    sync = _sync(ctx.device)
    out: dict = {"shape": shape.to_dict()}

    def layer_flops(name: str) -> int | None:
        """Forward FLOPs of the batch through the attention layer ``name`` (a model: one of its layers)."""
        w = kinds["layer"].get(name)
        return None if w is None or w.flops_config is None else cost(w.flops_config, shape.seq_len).total_flops * shape.batch

    for kind in ("layer", "train"):
        group = kinds[kind]
        say(f"[{shape.name}] {kind}: warm-up and memory of {len(group)} workloads")
        for w in group.values():  # warm-up before memory: lazily created state (optimizer) exists
            w.run()
        memory = {name: _memory(w, ctx.device) for name, w in group.items()}
        say(f"[{shape.name}] {kind}: timing {len(group)} workloads, {_rounds(cfg)}")
        times = _times(cfg, {n: w.run for n, w in group.items()}, sync)
        rows = {}
        for name, w in group.items():
            s = summarize(times[name]).to_dict()
            rows[name] = {**s, "tokens_per_s": w.tokens / s["median_s"], "memory_bytes": memory[name]["total"],
                          "memory": memory[name], "flops": layer_flops(name)}
            per_token = train_flops_per_token(shape, kind, name, w.flops_config)
            if per_token is not None:
                rows[name].update(mfu.speed_fields(per_token, rows[name]["tokens_per_s"], peak))
        add_ratios(rows, cfg.variants)
        out[kind] = rows

    say(f"[{shape.name}] decode: timing {len(kinds['decode'])} models, {_rounds(cfg)}")
    calls = {(k, n): w.run for n in kinds["decode"] for k in ("decode", "prefill") for w in [kinds[k][n]]}
    times = _times(cfg, calls, sync)
    rows = {}
    for name in kinds["decode"]:
        dec, pre = summarize(times[("decode", name)]), summarize(times[("prefill", name)])
        rows[name] = {**dec.to_dict(), "prefill": pre.to_dict(), "flops": layer_flops(name),
                      "tokens_per_s": decode_rate(shape.batch, shape.decode_new, dec.median, pre.median),
                      "tokens_per_s_spread": decode_spread(dec, pre)}
    add_ratios(rows, cfg.variants)
    out["decode"] = rows

    out["vs_hf"] = []
    for label, kind, ours, theirs in HF_PAIRS:
        if theirs not in out[kind]:
            continue
        a, b = out[kind][ours], out[kind][theirs]
        out["vs_hf"].append({"comparison": label, "kind": kind, "ours": ours, "theirs": theirs,
                             "speedup": _ratio(a["tokens_per_s"], b["tokens_per_s"]),
                             "memory_ratio": _ratio(a.get("memory_bytes"), b.get("memory_bytes"))})
    del kinds
    if ctx.compile:
        torch._dynamo.reset()  # drop this shape's compiled graphs
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def run_bench(cfg: BenchConfig, *, command: str | None = None, say: Callable[[str], None] | None = None) -> dict:
    """Measure everything ``cfg`` asks for; the results as a JSON-ready dict."""
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = resolve_device(cfg.device)
    precision = resolve_dtype(cfg.dtype, device)
    header = {"command": command, "machine": machine(device), "device": str(device),
              "precision": precision.as_dict(), "compile": cfg.compile, "code": code_version(),
              "memory_meter": CUDA_MEMORY if device.type == "cuda" else CPU_MEMORY,
              "repeats": cfg.repeats, "warmup": cfg.warmup, "max_spread": cfg.max_spread,
              "time_cap_s": cfg.time_cap_s, "variants": list(cfg.variants)}
    say(f"peak FLOP/s of {precision.dtype} products on {device} (timed now; the cache keeps the highest timing)")
    try:
        peak = mfu.peak_flops(precision.dtype, device, retime=True)  # bench runs on an idle machine
        header["peak"] = peak.to_dict()
    except Exception as e:  # MFU unknown, every other figure still measured
        peak = None
        header["peak"] = {"error": f"{type(e).__name__}: {e}"}
    shapes = {}
    for shape in cfg.shapes:
        ctx = Context(shape, precision, device, cfg.compile)
        shapes[shape.name] = measure_shape(cfg, shape, ctx, say, peak)
    say("KV cache bytes per token: MLA vs GQA")
    kv = mla_vs_gqa(cfg.shapes[0])
    header["machine"]["load_average_1m_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"schema": SCHEMA, "header": header, "shapes": shapes, "kv_cache": kv, "targets": evaluate(shapes)}
