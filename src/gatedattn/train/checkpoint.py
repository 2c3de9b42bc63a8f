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

Each of its three files carries the checkpoint's identity: its step and the sha256 of the
run identity (config, seed, data fingerprint) in ``checkpoint.json``, in the safetensors
metadata of the weights and in the trainer state. A resume refuses a checkpoint without
its ``checksums.json`` and one whose files disagree (another run's or another step's
weights beside this optimizer state), whatever its manifest says.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import (CHECKSUMS, atomic_save_safetensors, atomic_torch_save, check_dtypes,
                                       has_manifest, read_verified, record, tensor_bytes, verify_dir)
from gatedattn.infra.io import (atomic_dir, atomic_write_json, atomic_write_text, check_free_space, loads_json,
                                remove_stale_temporaries)
from gatedattn.models.code import write_code
from gatedattn.models.lm import CONFIG_FILE, GENERATION_CONFIG_FILE, WEIGHTS_FILE, ModelConfig, generation_defaults
from gatedattn.models.shards import read_safetensors

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "checkpoint.json"
STATE_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


_META = "gatedattn."  # prefix of the identity entries in a checkpoint's safetensors metadata


def run_digest(run: Any) -> str:
    """The sha256 of a run identity (``rundir.run_identity``), as canonical JSON."""
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()


def _weights_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (its header only is read)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return {}
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            return {}
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _verified_info(ckpt: Path) -> dict[str, Any]:
    """``checkpoint.json`` of ``ckpt``, its manifest required (but for checkpoints older than
    manifests) and every file listed; the large files are hashed as they are read."""
    info = read_info(ckpt)
    if not has_manifest(ckpt) and _writes_manifests(info):
        raise GatedAttnError(f"{ckpt} has no {CHECKSUMS}; a checkpoint that cannot be verified is not resumed "
                             f"(resume from an earlier checkpoint: remove {ckpt.name})")
    hashed_when_read = (WEIGHTS_FILE, STATE_FILE, INFO_FILE)
    verify_dir(ckpt, required=(*hashed_when_read, CONFIG_FILE), skip=hashed_when_read)
    return info


def _writes_manifests(info: dict[str, Any]) -> bool:
    """Whether the checkpoint of ``info`` was written by a gatedattn that gives every checkpoint
    a ``checksums.json``: all but those of the flat, older run config (``run.train.variant``,
    no ``run.train.model``), which predate manifests and still resume."""
    train = (info.get("run") or {}).get("train")
    return "identity" in info or not (isinstance(train, dict) and "model" not in train)


def check_identity(ckpt: Path, info: dict[str, Any], state: dict[str, Any]) -> None:
    """The step and run identity recorded in ``checkpoint.json`` (``info``), in the weights'
    metadata and in the trainer state agree with one another and with the run identity
    ``info`` holds; a checkpoint from before identities were recorded has none of them."""
    recorded = info.get("identity")
    if recorded is None and "identity" not in state:
        return
    expected = {"step": str(info["step"]), "run": run_digest(info.get("run"))}
    meta = _weights_metadata(ckpt / WEIGHTS_FILE)
    sources = {f"{INFO_FILE}": recorded, WEIGHTS_FILE: {k: meta.get(f"{_META}{k}") for k in expected},
               STATE_FILE: state.get("identity")}
    for where, got in sources.items():
        got = got if isinstance(got, dict) else {}
        for key, want in expected.items():
            if got.get(key) != want:
                what = "step" if key == "step" else "run identity (config, seed, data)"
                raise GatedAttnError(f"{ckpt / where}: its {what} is {got.get(key)!r}, the checkpoint's is {want!r}; "
                                     f"the files of {ckpt.name} come from different runs or steps (resume from an "
                                     f"earlier checkpoint: remove {ckpt.name})")
    if str(state.get("step")) != expected["step"]:
        raise GatedAttnError(f"{ckpt / STATE_FILE}: step {state.get('step')!r} differs from {INFO_FILE}'s "
                             f"{info['step']}; the checkpoint is damaged")


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
def write_model_dir(directory: Path, state: dict[str, torch.Tensor], cfg: ModelConfig, *, finite: bool = True,
                    metadata: dict[str, str] | None = None, save_code: bool = False) -> None:
    """``model.safetensors`` + ``config.json`` in the ``GatedLM.save_pretrained`` format
    (``finite``: refuse NaN/infinity, as a load would; a diverged run's checkpoint keeps them;
    ``metadata``: more safetensors metadata entries; ``save_code``: the modelling code and
    its ``auto_map`` too, as ``save_pretrained`` writes them); ``generation_config.json``
    beside them."""
    state = dict(state)
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    atomic_save_safetensors(directory / WEIGHTS_FILE, state, metadata={"format": "pt", **(metadata or {})},
                            finite=finite)
    config = cfg.config_json()
    if save_code:
        config["auto_map"] = write_code(directory)
    record(atomic_write_json(directory / CONFIG_FILE, config))
    record(atomic_write_json(directory / GENERATION_CONFIG_FILE, generation_defaults(cfg)))


# ---------------------------------------------------------------------------- save / find / load
def save_checkpoint(run_dir: Path, step: int, model_state: dict[str, torch.Tensor], model_cfg: ModelConfig,
                    trainer_state: dict[str, Any], info: dict[str, Any], keep: int = 0) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, keep the newest ``keep``
    (0: all)."""
    ckpts = Path(run_dir) / CKPT_DIR
    target = ckpts / step_dir_name(step)
    check_free_space(target, tensor_bytes(model_state) + tensor_bytes(trainer_state))  # before anything is written
    identity = {"step": str(step), "run": run_digest(info.get("run"))}
    with atomic_dir(target) as tmp:
        write_model_dir(tmp, model_state, model_cfg, finite=False,  # a diverged run's last state resumes
                        metadata={f"{_META}{k}": v for k, v in identity.items()})
        atomic_torch_save(tmp / STATE_FILE, {"format": STATE_FORMAT, **trainer_state, "identity": identity})
        record(atomic_write_json(tmp / INFO_FILE, {"step": step, **info, "identity": identity}))
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
    """(model state dict, trainer state) of a checkpoint directory, on the CPU: verified
    against its ``checksums.json`` (required), its files of one run and one step
    (:func:`check_identity`)."""
    info = _verified_info(ckpt)
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
    check_identity(ckpt, info, state)
    state.pop("identity", None)
    return model_state, state
