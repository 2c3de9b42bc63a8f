"""The one reading of a ``--device`` / ``device`` setting."""

from __future__ import annotations

import torch

from gatedattn.infra.errors import GatedAttnError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``: CUDA (device ``local_rank``) when available, else the CPU; ``cuda``
    without CUDA is an error; any other name is a torch device (``cpu``, ``cuda:1``)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise GatedAttnError(f"device {name!r} is not a device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GatedAttnError(f"device {name!r}: CUDA is not available on this machine")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                     and torch.backends.mps.is_available()):
        raise GatedAttnError(f"device {name!r}: MPS (Apple GPUs) is not available on this machine; choose cpu"
                             + (", cuda" if torch.cuda.is_available() else "") + " or auto")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def model_device(name: str) -> torch.device:
    """A device that can hold a model's weights; ``meta`` and the like are refused."""
    dev = resolve_device(name)
    if dev.type not in DEVICE_TYPES:
        raise GatedAttnError(f"--device {name!r}: {dev.type} devices hold no data; choose cpu, cuda[:N], mps or auto")
    return dev
