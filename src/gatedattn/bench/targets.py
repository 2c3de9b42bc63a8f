"""The speed and memory targets of the gated layers, checked against one run's figures.

Each target is a ratio read from the results of one shape and a threshold; ``evaluate``
returns one row per (target, shape) with the measured ratio and ``met`` (``None`` where a
workload it needs was not run or its figure is undefined).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

from gatedattn.bench.workloads import HF_QWEN3, HF_QWEN3_NEXT, OURS_QWEN3_NEXT

_OPS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge}


def _get(shape: dict, kind: str, name: str, key: str) -> float | None:
    row = shape.get(kind, {}).get(name)
    value = None if row is None else row.get(key)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


@dataclass(frozen=True)
class Target:
    id: str
    description: str
    ratio: str  # what the measured number is
    op: str
    threshold: float
    measure: Callable[[dict], float | None]
    shapes: tuple[str, ...] | None = None  # None: every shape

    def check(self, shape_name: str, shape: dict) -> dict:
        value = self.measure(shape)
        met = None if value is None else bool(_OPS[self.op](value, self.threshold))
        return {"id": self.id, "shape": shape_name, "description": self.description, "ratio": self.ratio,
                "measured": value, "op": self.op, "threshold": self.threshold, "met": met}


def _time(kind: str, name: str) -> Callable[[dict], float | None]:
    return lambda s: _get(s, kind, name, "median_s")


TARGETS = (
    Target("layer-vs-qwen3next", "our gated layer faster than transformers Qwen3NextAttention (fwd+bwd)",
           "time ours / HF", "<", 1.0,
           lambda s: _div(_time("layer", OURS_QWEN3_NEXT)(s), _time("layer", HF_QWEN3_NEXT)(s))),
    Target("train-vs-qwen3", "our training step >= 1.15x transformers Qwen3ForCausalLM tokens/s",
           "tokens/s ours / HF", ">=", 1.15,
           lambda s: _div(_get(s, "train", "baseline", "tokens_per_s"), _get(s, "train", HF_QWEN3, "tokens_per_s"))),
    Target("decode-vs-hf-generate", "our cached greedy decoding >= transformers generate tokens/s",
           "tokens/s ours / HF", ">=", 1.0,
           lambda s: _div(_get(s, "decode", "baseline", "tokens_per_s"), _get(s, "decode", HF_QWEN3, "tokens_per_s"))),
    Target("headwise-layer", "gated-headwise layer time <= 1.02x baseline", "time / baseline", "<=", 1.02,
           lambda s: _get(s, "layer", "gated-headwise", "time_ratio")),
    Target("gated-vs-flops", "gated layer time <= 1.1x what its extra FLOPs predict",
           "(time / baseline) / (FLOPs / baseline)", "<=", 1.1,
           lambda s: _div(_get(s, "layer", "gated", "time_ratio"), _get(s, "layer", "gated", "flop_ratio"))),
    Target("hyga-lowrank-step", "hyga-lowrank training step time <= gated's", "step time hyga-lowrank / gated",
           "<=", 1.0, lambda s: _div(_time("train", "hyga-lowrank")(s), _time("train", "gated")(s))),
    Target("gated-train-memory", "gated peak training memory <= 1.08x baseline", "memory / baseline", "<=", 1.08,
           lambda s: _get(s, "train", "gated", "memory_ratio")),
    Target("sink-long-time", "sink layer time at long context <= 1.05x baseline", "time / baseline", "<=", 1.05,
           lambda s: _get(s, "layer", "sink", "time_ratio"), ("long",)),
    Target("sink-long-memory", "sink layer memory at long context within 5% of baseline", "memory / baseline",
           "<=", 1.05, lambda s: _get(s, "layer", "sink", "memory_ratio"), ("long",)),
    Target("hyga-sink-long-time", "hyga-sink layer time at long context <= 1.05x baseline", "time / baseline",
           "<=", 1.05, lambda s: _get(s, "layer", "hyga-sink", "time_ratio"), ("long",)),
    Target("hyga-sink-long-memory", "hyga-sink layer memory at long context within 5% of baseline",
           "memory / baseline", "<=", 1.05, lambda s: _get(s, "layer", "hyga-sink", "memory_ratio"), ("long",)),
)


def evaluate(shapes: dict[str, dict]) -> list[dict]:
    """One row per target and shape it applies to, in the order of ``TARGETS``."""
    return [t.check(name, shape) for t in TARGETS for name, shape in shapes.items()
            if t.shapes is None or name in t.shapes]
