"""Training checkpoints: written atomically, found by a ``latest`` pointer.

Layout of a run directory's ``checkpoints/``::

    step_00000400/
        model.safetensors    the model, GatedLM.save_pretrained format (from_pretrained reads it)
        config.json          its ModelConfig
        trainer_state.pt     optimizer state, RNG states, step, tokens, loss history
                             (plain tensors and containers: torch.load(weights_only=True))
        checkpoint.json      step, tokens and the run identity (to check a resume)
    latest                   the name of the newest complete checkpoint

A checkpoint is assembled in a hidden temporary directory and renamed into place; only
then is ``latest`` replaced (itself atomically). A crash at any moment leaves ``latest``
pointing at a complete checkpoint.
"""

from __future__ import annotations

import io
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import (atomic_save_safetensors, atomic_torch_save, check_dtypes, read_verified, record,
                                       tensor_bytes)
from gatedattn.infra.io import (atomic_dir, atomic_write_json, atomic_write_text, check_free_space, loads_json,
                                remove_stale_temporaries)
from gatedattn.models.lm import CONFIG_FILE, WEIGHTS_FILE, ModelConfig, read_safetensors

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "checkpoint.json"
STATE_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# ---------------------------------------------------------------------------- RNG
def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states, as plain tensors/containers."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- model directories
def write_model_dir(directory: Path, state: dict[str, torch.Tensor], cfg: ModelConfig, *, finite: bool = True) -> None:
    """``model.safetensors`` + ``config.json`` in the ``GatedLM.save_pretrained`` format
    (``finite``: refuse NaN/infinity, as a load would; a diverged run's checkpoint keeps them)."""
    state = dict(state)
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    atomic_save_safetensors(directory / WEIGHTS_FILE, state, metadata={"format": "pt"}, finite=finite)
    record(atomic_write_json(directory / CONFIG_FILE, cfg.to_dict()))


# ---------------------------------------------------------------------------- save / find / load
def save_checkpoint(run_dir: Path, step: int, model_state: dict[str, torch.Tensor], model_cfg: ModelConfig,
                    trainer_state: dict[str, Any], info: dict[str, Any], keep: int = 0) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, keep the newest ``keep``
    (0: all)."""
    ckpts = Path(run_dir) / CKPT_DIR
    target = ckpts / step_dir_name(step)
    check_free_space(target, tensor_bytes(model_state) + tensor_bytes(trainer_state))  # before anything is written
    with atomic_dir(target) as tmp:
        write_model_dir(tmp, model_state, model_cfg, finite=False)  # a diverged run's last state resumes
        atomic_torch_save(tmp / STATE_FILE, {"format": STATE_FORMAT, **trainer_state})
        record(atomic_write_json(tmp / INFO_FILE, {"step": step, **info}))
    remove_stale_temporaries(ckpts / LATEST)  # a killed run's half-written pointer (the run is locked)
    atomic_write_text(ckpts / LATEST, target.name + "\n")
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    return target


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    ckpts = Path(run_dir) / CKPT_DIR
    if not ckpts.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpts.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names (or the newest one when the pointer is missing)."""
    ckpts = Path(run_dir) / CKPT_DIR
    pointer = ckpts / LATEST
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _STEP_DIR.match(name) and (ckpts / name).is_dir():
            return ckpts / name
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def is_temporary(p: Path) -> bool:
    """A hidden file or directory left by an interrupted atomic write (``io.atomic_write``,
    ``io.temp_dir_beside``, ``io.replace_dir``)."""
    return p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".old") or ".old-" in p.name)


def cleanup_temporaries(run_dir: Path) -> list[Path]:
    """Remove what an interrupted write left behind in a run directory and its
    ``checkpoints/`` (``.final.*.tmp/``, ``.metrics.csv.*.tmp``, checkpoint temporaries);
    return what was removed."""
    removed = []
    for where in (Path(run_dir), Path(run_dir) / CKPT_DIR):
        if where.is_dir():
            for p in where.iterdir():
                if is_temporary(p):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
                    removed.append(p)
    return removed


def read_info(ckpt: Path) -> dict[str, Any]:
    """``checkpoint.json`` of a checkpoint: an object with an integer ``step`` and a ``run`` object."""
    path = ckpt / INFO_FILE
    if not path.is_file():
        raise GatedAttnError(f"{ckpt} is not a complete checkpoint: {INFO_FILE} is missing")
    info = loads_json(read_verified(path), path)
    if not isinstance(info, dict):
        raise GatedAttnError(f"{path} must hold a JSON object, got {type(info).__name__}; the checkpoint is damaged")
    step = info.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise GatedAttnError(f"{path}: field 'step' is {step!r}, not an integer >= 0; the checkpoint is damaged")
    if not isinstance(info.get("run", {}), dict):
        raise GatedAttnError(f"{path}: field 'run' must be an object; the checkpoint is damaged")
    return info


# what trainer_state.pt must hold for a resume (``Trainer.save`` writes them all)
STATE_KEYS = ("step", "tokens", "losses", "optimizer", "rng")
RNG_KEYS = ("python", "numpy", "torch")


def load_checkpoint(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state dict, trainer state) of a checkpoint directory, on the CPU."""
    model_state = read_safetensors(ckpt / WEIGHTS_FILE, finite=False)  # a diverged run's last state resumes
    path = ckpt / STATE_FILE
    if not path.is_file():
        raise GatedAttnError(f"{path} is missing")
    try:
        state = torch.load(io.BytesIO(read_verified(path)), map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        if isinstance(e, GatedAttnError):
            raise
        raise GatedAttnError(f"{path} is truncated or corrupt ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise GatedAttnError(f"{path}: unknown trainer state format {state.get('format') if isinstance(state, dict) else None!r}")
    missing = [k for k in STATE_KEYS if k not in state]
    rng = state.get("rng")
    missing += [f"rng.{k}" for k in RNG_KEYS if isinstance(rng, dict) and k not in rng]
    if missing or not isinstance(rng, dict) or not isinstance(state["optimizer"], dict):
        what = f"lacks {', '.join(missing)}" if missing else "has a malformed 'rng' or 'optimizer' entry"
        raise GatedAttnError(f"{path} {what}; the checkpoint is damaged (resume from an earlier one: remove "
                             f"{ckpt.name})")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise GatedAttnError(f"{path}: step {step!r} is not an integer >= 0; the checkpoint is damaged")
    check_dtypes(model_state, ckpt / WEIGHTS_FILE)
    return model_state, state
