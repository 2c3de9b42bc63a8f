"""Training metrics: ``metrics.jsonl``, ``metrics.csv``, optional TensorBoard, loss spikes.

``metrics.jsonl`` holds one JSON object per line, each with ``kind`` and ``step``:

- ``train``: step, tokens, loss, lr, grad_norm, tokens_per_s, model_flops_per_s and mfu
  (model FLOP/s and its ratio to the machine's measured peak in the run's dtype, times the
  devices: ``gatedattn.models.mfu``; mfu is null when no peak could be measured),
  peak_flops_per_s (per device), elapsed_s, spikes (count so far), skipped_steps (count so far);
- ``eval``: step, tokens, val_loss, val_ppl, elapsed_s and the eval hook's metrics;
- ``diverged``: step, loss, reason; ``resume``: step, the fields that changed.

``metrics.csv`` has one row per step (train and eval values side by side), rewritten from
the records at every checkpoint and at the end.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any, Iterable

from gatedattn.infra.device import resolve_device
from gatedattn.infra.io import atomic_write_text, json_safe, read_jsonl
from gatedattn.infra.precision import resolve_dtype
from gatedattn.models.mfu import Peak, peak_flops, speed_fields, train_flops_per_token

JSONL = "metrics.jsonl"
CSV = "metrics.csv"
TB_DIR = "tensorboard"
CSV_FIRST = ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "model_flops_per_s", "mfu",
             "elapsed_s", "spikes", "skipped_steps", "val_loss", "val_ppl")


def ppl(loss: float) -> float:
    """The perplexity of a mean cross-entropy ``loss`` (nats); inf where exp overflows."""
    return math.exp(loss) if loss < 700 else math.inf


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a run directory's, or the file itself); a torn
    last line (crash mid-write) is dropped. Non-finite numbers read back as None."""
    path = Path(path)
    if path.is_dir():
        path = path / JSONL
    return [rec for rec in read_jsonl(path) if "step" in rec]


class MetricsLog:
    """Writes the records of one run (rank 0 only). ``keep_until`` (resume) keeps the
    records of steps up to the checkpoint and drops the rest, so no step is duplicated."""

    def __init__(self, run_dir: Path, *, keep_until: int | None, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JSONL
        old = read_records(self.path) if keep_until is not None else []
        self.records = [r for r in old if r["step"] <= keep_until] if keep_until is not None else []
        atomic_write_text(self.path, "".join(self._line(r) for r in self.records))
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = self._open_tensorboard(keep_until) if tensorboard else None

    def _open_tensorboard(self, keep_until: int | None):
        """A SummaryWriter in ``tensorboard/`` when tensorboard is installed (else None);
        on resume it purges the events of steps after the checkpoint."""
        try:
            # lazy: optional extra (tensorboard)
            import tensorboard  # noqa: F401  (SummaryWriter needs it)
            from torch.utils.tensorboard import SummaryWriter  # lazy: optional extra (tensorboard)
        except Exception:
            return None
        return SummaryWriter(str(self.run_dir / TB_DIR), purge_step=None if keep_until is None else keep_until + 1)

    @staticmethod
    def _line(rec: dict[str, Any]) -> str:
        return json.dumps(json_safe(rec)) + "\n"

    def log(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        self._file.write(self._line(rec))
        self._file.flush()
        if self._tb is not None and rec.get("kind") in ("train", "eval"):
            prefix = rec["kind"]
            for k, v in rec.items():
                if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{prefix}/{k}", v, rec["step"])

    def write_csv(self) -> None:
        rows: dict[int, dict[str, Any]] = {}
        for rec in self.records:
            if rec.get("kind") in ("train", "eval"):
                row = rows.setdefault(rec["step"], {})
                for k, v in rec.items():
                    if k != "kind":
                        row.setdefault(k, v)  # a step's train values first, then its eval's
        keys = list(CSV_FIRST) + sorted({k for r in rows.values() for k in r} - set(CSV_FIRST))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        for step in sorted(rows):
            writer.writerow(rows[step])
        atomic_write_text(self.run_dir / CSV, buf.getvalue())

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


class SpikeTracker:
    """Online version of :func:`gatedattn.analysis.loss_spikes` (relative margin): a loss is
    a spike when it is non-finite or above ``m + margin * |m|``, ``m`` the median of the
    finite losses among the previous ``window`` steps."""

    def __init__(self, window: int, margin: float, history: Iterable[float] = ()):
        self.margin = margin
        self.recent: deque[float] = deque(history, maxlen=window)

    def update(self, loss: float) -> bool:
        finite = [x for x in self.recent if math.isfinite(x)]
        if finite:
            median = statistics.median(finite)
            spike = not math.isfinite(loss) or loss > median + self.margin * abs(median)
        else:
            spike = not math.isfinite(loss)
        self.recent.append(loss)
        return spike


class SpeedMeter:
    """Model FLOP/s and MFU of a training run: ``flops_per_token`` (forward + backward of
    the model at the run's context, ``gatedattn.models.mfu``), the ``peak`` of one device in the
    run's dtype (None: unknown) and the number of ``devices`` the tokens/s is over."""

    def __init__(self, flops_per_token: float, peak: Peak | None, devices: int = 1):
        self.flops_per_token, self.peak, self.devices = flops_per_token, peak, devices

    @classmethod
    def measure(cls, model_cfg, seq_len: int, dtype: str, device, devices: int = 1,
                warn=None) -> "SpeedMeter":
        """Count the model's FLOPs and read (or time) the peak of ``dtype`` on ``device``; a
        peak that cannot be timed leaves MFU unknown (``warn`` says why) and the run going."""
        try:
            peak = peak_flops(dtype, device)
        except Exception as e:  # never fail a run over its speed readout
            peak = None
            if warn is not None:
                warn(f"no peak FLOP/s for MFU ({type(e).__name__}: {e}); mfu is left empty")
        return cls(train_flops_per_token(model_cfg, seq_len), peak, devices)

    @classmethod
    def for_config(cls, train_cfg, data) -> "SpeedMeter":
        """The meter of a run of ``train_cfg`` (a ``TrainConfig``) on ``data`` (its
        vocabulary), one process on the config's device."""
        device = resolve_device(train_cfg.device)
        model_cfg = train_cfg.model_config(data.vocab_size, data.bos_id, data.eos_id)
        return cls.measure(model_cfg, train_cfg.seq_len, resolve_dtype(train_cfg.dtype, device).dtype, device)

    def fields(self, tokens_per_s: float) -> dict[str, Any]:
        """``model_flops_per_s``, ``mfu`` and ``peak_flops_per_s`` at ``tokens_per_s``."""
        return {**speed_fields(self.flops_per_token, tokens_per_s, self.peak, self.devices),
                "peak_flops_per_s": None if self.peak is None else self.peak.flops_per_s}

    def postfix(self, tokens_per_s: float) -> str:
        """MFU for a progress bar: ``12.3%`` (``?`` when unknown)."""
        m = self.fields(tokens_per_s)["mfu"]
        return "?" if m is None else f"{100 * m:.1f}%"
