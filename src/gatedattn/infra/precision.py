"""Which precision to compute in: ``dtype='auto'`` picks bf16 autocast only where the
device computes bf16 natively, fp32 elsewhere.

On CPUs without AVX512-BF16 or AMX, PyTorch emulates bf16 matrix products, which can be
tens of times slower than fp32; on CUDA devices without bf16 support it is unavailable.
``resolve_dtype`` returns the chosen precision together with the reason, which runs record.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gatedattn.infra.errors import GatedAttnError

DTYPES = ("auto", "fp32", "bf16")
EMULATED_RATIO = 4.0  # bf16 products this many times slower than fp32 are emulated (measured: 70-150x; native 0.25x)


@dataclass(frozen=True)
class Precision:
    """A resolved precision: ``dtype`` is ``'fp32'`` or ``'bf16'`` (autocast), ``reason`` says why."""

    dtype: str
    reason: str

    def autocast(self, device: torch.device | str):
        """The autocast context for this precision on ``device`` (a no-op for fp32)."""
        device_type = torch.device(device).type
        if self.dtype != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "reason": self.reason}


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (Linux ``/proc/cpuinfo``); empty if unknown."""
    return _cpu_flags()


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_native_bf16(flags: frozenset[str] | None = None,
                    timing: tuple[float, float] | None = None) -> tuple[bool, str]:
    """Whether bf16 matrix products run natively (fast) on this CPU, and the evidence.

    The CPU must list ``avx512_bf16`` or ``amx_bf16`` and a short timing must confirm that
    PyTorch uses them (with ``ATEN_CPU_CAPABILITY=avx2`` or an older oneDNN ISA cap, bf16 is
    emulated even on such a CPU). Emulated bf16 products run tens of times slower than fp32
    and native ones faster, so the timing reads emulation only past ``EMULATED_RATIO`` times
    fp32's: a busy machine, which slows one of the two by chance, does not flip the choice.
    ``flags`` and ``timing`` (fp32 s, bf16 s) can be given for testing.
    """
    flags = cpu_flags() if flags is None else flags
    native = sorted(f for f in ("avx512_bf16", "amx_bf16") if f in flags)
    capability = torch.backends.cpu.get_cpu_capability()
    if not flags:
        return False, f"CPU {capability}, feature flags unknown: fp32 is the safe choice"
    if not native:
        return False, f"CPU {capability} without avx512_bf16/amx_bf16: bf16 would be emulated (slow)"
    fp32_s, bf16_s = matmul_timing() if timing is None else timing
    measured = f"a 256x512x512 product took {fp32_s * 1e3:.2f} ms in fp32, {bf16_s * 1e3:.2f} ms in bf16"
    if bf16_s > EMULATED_RATIO * fp32_s:
        return False, f"CPU {capability} with {'+'.join(native)}, but bf16 runs emulated here ({measured})"
    return True, f"CPU {capability} with {'+'.join(native)}: native bf16 ({measured})"


@functools.lru_cache(maxsize=1)
def matmul_timing(repeats: int = 5) -> tuple[float, float]:
    """Best-of-``repeats`` seconds of one 256x512 @ 512x512 product in fp32 and in bf16, on
    one thread: with several, a core that another process holds stalls every product at the
    threads' barrier, so a busy machine could time fp32 as slowly as emulated bf16 and pick
    bf16 where it is emulated. One thread keeps the ratio the kernels' own."""
    a, b = torch.randn(256, 512), torch.randn(512, 512)
    best = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            x, y = a.to(dtype), b.to(dtype)
            x @ y  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                x @ y
                times.append(time.perf_counter() - t0)
            best.append(min(times))
    finally:
        torch.set_num_threads(threads)
    return best[0], best[1]


def resolve_dtype(requested: str, device: torch.device | str = "cpu") -> Precision:
    """Resolve ``'auto'`` / ``'fp32'`` / ``'bf16'`` for ``device`` into a ``Precision``."""
    if requested not in DTYPES:
        raise GatedAttnError(f"dtype: {requested!r} is not one of {', '.join(DTYPES)}")
    device = torch.device(device)
    if requested != "auto":
        return Precision(requested, "requested")
    if device.type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return Precision("bf16", f"CUDA {torch.cuda.get_device_name(device)}: native bf16")
        return Precision("fp32", "CUDA device without bf16 support")
    if device.type == "cpu":
        native, why = cpu_native_bf16()
        return Precision("bf16" if native else "fp32", why)
    return Precision("fp32", f"{device.type}: fp32 by default")
