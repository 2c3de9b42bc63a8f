"""Memory meters.

On CUDA the allocator keeps a peak: ``cuda_peak_bytes`` resets it, runs the call and
reports the peak above what was allocated before the call, plus the bytes the workload
itself keeps resident (its parameters and optimizer state), so workloads that share one
process compare fairly.

On the CPU there is no allocator statistic. ``SavedTensorMeter`` counts instead the
bytes of the tensors autograd saves for the backward pass (the activation memory a
training step holds at its peak), through ``torch.autograd.graph.saved_tensors_hooks``,
each storage counted once however many views of it are saved. ``cpu_training_bytes``
adds the parameters and one gradient per parameter. It is an estimate of the activation
plus weight memory, not an allocator peak: temporaries freed during the forward pass and
optimizer state are not in it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """The identity of the memory behind ``t``: (device, storage address)."""
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr())


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage once."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t.device.type == "meta":
            continue
        seen[storage_key(t)] = storage_nbytes(t)
    return sum(seen.values())


class SavedTensorMeter:
    """Context manager: the tensors autograd saves for backward inside it, deduplicated by
    storage; ``exclude`` storages (e.g. parameters, counted elsewhere) are not counted.
    After ``with SavedTensorMeter() as meter: y = x.sin()``, ``meter.bytes`` is the size of
    x's storage (``sin`` saves its input)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._exclude = {storage_key(t) for t in exclude if t.device.type != "meta"}
        self._saved: dict[tuple[str, int], int] = {}
        self._hooks = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            key = storage_key(t)
            if key not in self._exclude:
                self._saved[key] = max(self._saved.get(key, 0), storage_nbytes(t))
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> "SavedTensorMeter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None

    @property
    def bytes(self) -> int:
        return sum(self._saved.values())

    @property
    def count(self) -> int:
        return len(self._saved)


def cpu_training_bytes(fn: Callable[[], Any], params: list[torch.Tensor]) -> dict[str, int]:
    """Run ``fn`` (a forward + backward) once under a ``SavedTensorMeter``: bytes saved for
    backward, of the parameters ``params``, of their gradients (one per trainable
    parameter), and the total."""
    with SavedTensorMeter(exclude=params) as meter:
        fn()
    weights = unique_storage_bytes(params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return {"saved_for_backward": meter.bytes, "parameters": weights, "gradients": grads,
            "total": meter.bytes + weights + grads}


def cuda_peak_bytes(fn: Callable[[], Any], device: torch.device, resident: list[torch.Tensor]) -> dict[str, int]:
    """Run ``fn`` once: the allocator's peak above what was allocated before the call, the
    bytes of ``resident`` (what the workload keeps between calls) and their sum."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    kept = unique_storage_bytes(resident)
    return {"peak_above_start": peak, "resident": kept, "total": peak + kept}


def tensors_in(obj: Any, _seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes, lists, tuples and dicts
    (used to measure what a cache object holds without knowing its layout)."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    elif hasattr(obj, "__slots__"):
        items = [getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s)]
    else:
        return []
    out: list[torch.Tensor] = []
    for item in items:
        out.extend(tensors_in(item, seen))
    return out
