"""Model FLOP utilisation (MFU): the model FLOP/s a run achieves over a peak measured here.

**Model FLOPs** (:func:`train_flops_per_token`) count what the model needs, not what an
implementation does: a forward pass of ``GatedLM`` is, per block, one attention layer as
``gatedattn.cost`` counts it (projections, causal attention, gates, sink) plus the MLP's
three matrix products, and the LM head's product once; norms, embeddings, the MLP's
elementwise work and the loss are left out. A training step costs forward + backward, three
times the forward (the backward takes two products per forward product), as nanoGPT and
torchtitan count for MFU; recomputation by activation checkpointing is not model work and
is not counted.

**Peak** (:func:`peak_flops`): the best FLOP/s of square matrix products in the run's dtype
on the run's device, timed for well under a second (sizes grow from 256 until a product
takes a noticeable time) and kept in ``$GATEDATTN_CACHE`` (default ``~/.cache/gatedattn``)
``/peak_flops.json``, one entry per machine key: the device (CPU model or GPU name), its
capability, the torch version, the thread count and the dtype. A later run on the same key
reads the entry instead of timing again; a missing, unreadable or corrupt file is timed
anew and rewritten (atomically). ``gatedattn bench`` times the peak on every run and keeps
the higher figure, so a peak first timed on a busy machine (too low, so every MFU too high)
is corrected by the next bench on an idle one. A measured peak is what this machine reaches in practice,
below the vendor's figure, so MFU here reads higher than against a datasheet.

**MFU** = model FLOP/s / (peak x devices).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gatedattn.infra.cache import cache_root
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.io import atomic_write_json, read_json
from gatedattn.infra.provenance import cpu_model
from gatedattn.layers.cost import cost

CACHE_FILE = "peak_flops.json"
SCHEMA = "gatedattn-peak-flops/1"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SIZES = (256, 512, 1024, 2048, 4096, 8192)
TIMED = 3  # timed products per size (best counts), after one untimed
BUDGET_S = 0.25  # stop growing the size once the products have taken this long


# ------------------------------------------------------------------------- model FLOPs
def forward_flops(cfg, seq_len: int) -> int:
    """Forward FLOPs of one sequence of ``seq_len`` tokens through ``GatedLM(cfg)``
    (``cfg`` a :class:`~gatedattn.models.lm.ModelConfig`): per block the attention layer
    (``gatedattn.cost``) and the MLP's products (SwiGLU three, a two-matrix MLP two), then the LM head."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be an integer >= 1")
    attention = cost(cfg.attention, seq_len).total_flops
    products = 3 if cfg.mlp == "swiglu" else 2  # SwiGLU: gate, up, down; else up, down
    mlp = products * 2 * cfg.d_model * cfg.ffn_dim * seq_len
    head = 2 * cfg.d_model * cfg.vocab_size * seq_len
    return cfg.n_layers * (attention + mlp) + head


def train_flops_per_token(cfg, seq_len: int) -> float:
    """Model FLOPs of one trained token (forward + backward = 3 x forward) at context ``seq_len``."""
    return 3 * forward_flops(cfg, seq_len) / seq_len


def mfu(achieved_flops_per_s: float | None, peak_flops_per_s: float | None) -> float | None:
    """``achieved / peak``; None when either is unknown, not finite or not positive."""
    a, p = achieved_flops_per_s, peak_flops_per_s
    if a is None or p is None or not (math.isfinite(a) and math.isfinite(p)) or p <= 0 or a < 0:
        return None
    return a / p


def speed_fields(flops_per_token: float, tokens_per_s: float, peak: "Peak | None", devices: int = 1) -> dict:
    """What a speed is shown with: ``model_flops_per_s`` and ``mfu`` against ``peak`` on
    each of ``devices`` devices (``tokens_per_s`` over all of them)."""
    achieved = flops_per_token * tokens_per_s
    return {"model_flops_per_s": achieved,
            "mfu": mfu(achieved, None if peak is None else peak.flops_per_s * devices)}


# ------------------------------------------------------------------------- peak
@dataclass(frozen=True)
class Peak:
    """A measured peak: ``flops_per_s`` of ``dtype`` products on the machine ``key``;
    ``measured`` True when timed by this call, False when read from the cache."""

    flops_per_s: float
    dtype: str
    key: str
    measured: bool

    def to_dict(self) -> dict:
        return {"flops_per_s": self.flops_per_s, "dtype": self.dtype, "key": self.key,
                "source": "measured now" if self.measured else "cache"}


def cache_path() -> Path:
    """``$GATEDATTN_PEAK_CACHE`` (a file) where set, else ``peak_flops.json`` in the cache
    directory (the test suite keeps its peaks, timed while tests run, out of the user's)."""
    if os.environ.get("GATEDATTN_PEAK_CACHE"):
        return Path(os.environ["GATEDATTN_PEAK_CACHE"])
    return cache_root() / CACHE_FILE


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of {', '.join(DTYPES)}")


def machine_key(dtype: str, device: torch.device | str = "cpu") -> str:
    """What a peak depends on: device model and capability, torch version, threads, dtype."""
    _check_dtype(dtype)
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        where = f"cuda|{torch.cuda.get_device_name(device)}|sm_{major}{minor}"
    else:
        where = f"{device.type}|{cpu_model()}|{torch.backends.cpu.get_cpu_capability()}"
    return f"{where}|torch {torch.__version__}|threads {torch.get_num_threads()}|{dtype}"


def _time_matmul(n: int, dtype: str, device: torch.device) -> float:
    """Seconds of one n x n @ n x n product (the best of ``TIMED``, after one untimed)."""
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    a @ b
    best = math.inf
    for _ in range(TIMED):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peak_flops(dtype: str, device: torch.device | str = "cpu", *, budget_s: float = BUDGET_S,
                       timer: Callable[[int, str, torch.device], float] | None = None) -> float:
    """The best FLOP/s of square ``dtype`` products on ``device``: sizes grow from 256
    while the products so far took under ``budget_s`` and the next size (8x the work)
    would not take several times that."""
    _check_dtype(dtype)
    timer = timer or _time_matmul
    device = torch.device(device)
    best, spent = 0.0, 0.0
    for n in SIZES:
        t = timer(n, dtype, device)
        if t > 0:
            best = max(best, 2 * n**3 / t)
        spent += (TIMED + 1) * t
        if spent >= budget_s or (TIMED + 1) * 8 * t > 2 * budget_s:
            break
    if best <= 0:
        raise RuntimeError(f"no {dtype} product could be timed on {device}")
    return best


def _read_entries(path: Path) -> dict:
    """The cache's entries; {} when the file is missing, unreadable, corrupt or of another schema."""
    try:
        data = read_json(path)
    except (GatedAttnError, OSError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("peaks"), dict):
        return {}
    return data["peaks"]


def _valid(entry) -> bool:
    v = entry.get("flops_per_s") if isinstance(entry, dict) else None
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def peak_flops(dtype: str, device: torch.device | str = "cpu", *, path: str | os.PathLike | None = None,
               timer: Callable[[int, str, torch.device], float] | None = None, retime: bool = False) -> Peak:
    """The peak FLOP/s of ``dtype`` on ``device``: from the cache when it holds this
    machine's key, else timed (:func:`measure_peak_flops`) and written to the cache.
    ``retime`` times it even when cached and keeps the higher of the two: a product timed
    on a busy machine runs slower, so a later timing can only correct a peak upwards
    (``gatedattn bench`` retimes on every run). A cache that cannot be written leaves the
    peak measured for this call only."""
    key = machine_key(dtype, device)
    path = Path(path) if path is not None else cache_path()
    entries = _read_entries(path)
    cached = float(entries[key]["flops_per_s"]) if _valid(entries.get(key)) else None
    if cached is not None and not retime:
        return Peak(cached, dtype, key, measured=False)
    measured = measure_peak_flops(dtype, device, timer=timer)
    if cached is not None and cached >= measured:
        return Peak(cached, dtype, key, measured=False)
    entries = {k: v for k, v in entries.items() if _valid(v)}
    entries[key] = {"flops_per_s": measured, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        atomic_write_json(path, {"schema": SCHEMA, "peaks": entries})
    except (GatedAttnError, OSError):
        pass  # a read-only cache: measured again next time
    return Peak(measured, dtype, key, measured=True)

