"""How long a workload's matrix products take on their own: the floor its other work sits on.

A square-product peak says what the CPU can do at its best shape; a language model's
products have their own shapes (576-wide projections, a 49,152-row head, four-row products
when decoding, which read every weight from memory once per step), and no implementation
runs them faster than they run alone. ``products_alone(fn)`` runs ``fn`` once, records every
matrix product it dispatches (``mm``, ``addmm``, ``bmm``, ``baddbmm``: the linear layers and
the LM head; attention kernels are not counted) together with its operands, and times those
products replayed back to back on the same operands, in the same dtype and memory layout.

``time_of_fn / products_alone`` is then the share of a workload spent outside its products,
and ``theirs / products_alone(ours)`` the largest speedup ours could reach over another
implementation if everything but ours' products were free.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")


class _Recorder(TorchDispatchMode):
    """Keeps every matrix product dispatched inside the ``with``, with its operands."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in PRODUCTS:
            self.calls.append((func, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args),
                               dict(kwargs)))
        return func(*args, **kwargs)


def record_products(fn: Callable[[], Any]) -> list[tuple[Any, tuple, dict]]:
    """The matrix products ``fn()`` dispatches, in order, with their operands."""
    recorder = _Recorder()
    with recorder:
        fn()
    return recorder.calls


def products_alone(fn: Callable[[], Any], repeats: int = 3) -> dict[str, Any]:
    """Run ``fn`` once, then time its matrix products replayed alone: the median seconds of
    ``repeats`` replays (after one warm-up), the number of products and their FLOPs."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an int >= 1")
    calls = record_products(fn)

    def replay() -> None:
        with torch.no_grad():
            for func, args, kwargs in calls:
                func(*args, **kwargs)

    replay()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        replay()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "products": len(calls),
            "flops": sum(_flops(func, args) for func, args, _ in calls)}


def _flops(func, args: tuple) -> int:
    """2 m k n per product (times the batch of a batched one)."""
    name = func.overloadpacket.__name__
    a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
