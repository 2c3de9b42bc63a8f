"""The run directory: what a run records about itself, and whether a directory can take it.

``config.json`` holds the resolved ``TrainConfig``, ``ModelConfig``, world size, batch
geometry and a fingerprint of the data (vocabulary and the manifest's checksums);
``code_version`` the git commit of the source tree (if it is a checkout) with a dirty
flag and the gatedattn version, as JSON; ``env.json`` the software and machine.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.provenance import code_version
from gatedattn.infra.io import read_json_object
from gatedattn.infra.io import LOCK_FILE, DirLock, atomic_write_json
from gatedattn.models.lm import ModelConfig
from gatedattn.train.config import RESUMABLE_FIELDS, config_diff, lookup, upgrade_dict
from gatedattn.infra.integrity import tokenizer_fingerprint
from gatedattn.train.checkpoint import is_temporary, list_checkpoints

CONFIG = "config.json"
CODE_VERSION = "code_version"
ENV = "env.json"
SUMMARY = "summary.json"
FINAL = "final"


def data_fingerprint(data) -> dict[str, Any]:
    """What identifies a data directory's contents (not its path): the streams and the
    tokenizer (what it tokenizes, see ``integrity.tokenizer_fingerprint``)."""
    m = data.manifest
    return {"vocab_size": m.vocab_size, "bos_id": m.bos_id, "eos_id": m.eos_id,
            "train_tokens": m.train.tokens, "train_sha256": m.train.sha256,
            "val_tokens": m.val.tokens, "val_sha256": m.val.sha256,
            "tokenizer": tokenizer_fingerprint(data.data_dir / m.tokenizer_file)}


def run_identity(cfg, model_cfg, world_size: int, data) -> dict[str, Any]:
    return {
        "train": cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "world_size": world_size,
        "global_batch": cfg.global_batch(world_size),
        "tokens_per_step": cfg.tokens_per_step(world_size),
        "total_steps": cfg.total_steps(world_size),
        "data": data_fingerprint(data),
    }


_MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
# attention fields added since a run was recorded, with the value they had before they existed
_ATTENTION_ADDED = {"sink_init": 0.0}


def first_difference(old: dict[str, Any], new: dict[str, Any], ignore_train: frozenset[str]) -> str | None:
    """``"train.lr: 0.001 there, 0.003 here"`` for the first differing field (TrainConfig
    fields first, then the resolved model, the data, the world size), else None.
    ``ignore_train`` names TrainConfig fields allowed to differ."""
    old = {**old, "train": upgrade_dict(old.get("train") or {})}  # a run of the flat, older form
    if isinstance(old.get("model"), dict):  # a model field added since reads as its default there
        old["model"] = {**_MODEL_DEFAULTS, **old["model"]}
        if isinstance(old["model"].get("attention"), dict):
            old["model"]["attention"] = {**_ATTENTION_ADDED, **old["model"]["attention"]}
    if isinstance(old.get("data"), dict) and isinstance(new.get("data"), dict) and "tokenizer" not in old["data"]:
        old["data"] = {**old["data"], "tokenizer": new["data"].get("tokenizer")}  # recorded before tokenizers were
    old_t = {k: v for k, v in old["train"].items() if k not in ignore_train}
    new_t = {k: v for k, v in new["train"].items() if k not in ignore_train}
    key = config_diff({"train": old_t}, {"train": new_t})
    for part in ("model", "data", "world_size"):
        if key is None:
            key = config_diff({part: old.get(part)}, {part: new.get(part)})
    if key is None:
        return None
    return f"{'.'.join(key)}: {lookup(old, key)!r} there, {lookup(new, key)!r} here"


def _holds_anything(out: Path) -> bool:
    """Whether ``out`` holds more than a lock file and a killed write's temporaries."""
    return any(p.name != LOCK_FILE and not is_temporary(p) for p in out.iterdir())


RUN_FILES = (CONFIG, CODE_VERSION, ENV, "metrics.jsonl", "metrics.csv", SUMMARY, "tensorboard")


def remove_new_run_files(out: Path) -> None:
    """After a new run failed before its first checkpoint: remove the files it wrote
    (:data:`RUN_FILES`), so that the corrected command starts afresh in the same ``--out``.
    A run with a checkpoint keeps everything (it resumes)."""
    if list_checkpoints(out):
        return
    for name in RUN_FILES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()


def lock_run(out: Path) -> Any:
    """The run directory's lock (``io.DirLock``): one writer per run; a second one is refused
    naming the first one's PID."""
    return DirLock(out, "run directory")


def check_new_run(out: Path, identity: dict[str, Any]) -> None:
    """Without ``resume``: ``out`` must be absent, empty, or not yet hold a run."""
    if out.exists() and not out.is_dir():
        raise GatedAttnError(f"--out {out} exists and is not a directory")
    if not out.is_dir() or not _holds_anything(out):
        return
    cfg_path = out / CONFIG
    if not cfg_path.is_file():
        raise GatedAttnError(f"--out {out} is not empty and holds no run ({CONFIG} is missing); choose a new or empty directory")
    diff = first_difference(read_json_object(cfg_path), identity, RESUMABLE_FIELDS)
    if diff is not None:
        raise GatedAttnError(f"--out {out} holds a run with a different config ({diff}); choose another --out")
    raise GatedAttnError(f"--out {out} already holds this run; pass --resume to continue it, or choose another --out")


def check_resume(out: Path, identity: dict[str, Any], ckpt_info: dict[str, Any] | None) -> None:
    """With ``resume``: the checkpoint (or, before the first one, the recorded config)
    must describe the same run up to :data:`RESUMABLE_FIELDS`."""
    if out.exists() and not out.is_dir():
        raise GatedAttnError(f"--out {out} exists and is not a directory")
    if ckpt_info is not None:
        old, what = ckpt_info.get("run") or {}, f"checkpoint step {ckpt_info.get('step')}"
    elif (out / CONFIG).is_file():
        old, what = read_json_object(out / CONFIG), CONFIG
    else:
        if out.is_dir() and _holds_anything(out):
            raise GatedAttnError(f"--out {out} is not empty and holds no run ({CONFIG} is missing); nothing to resume")
        return
    diff = first_difference(old, identity, RESUMABLE_FIELDS)
    if diff is not None:
        raise GatedAttnError(f"cannot resume {out}: its {what} has a different config ({diff})")


def environment(device: torch.device, world_size: int) -> dict[str, Any]:
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "world_size": world_size,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return env


def write_run_files(out: Path, identity: dict[str, Any], device: torch.device, world_size: int,
                    precision: dict[str, str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / CONFIG, identity)
    atomic_write_json(out / CODE_VERSION, code_version())
    env = environment(device, world_size)
    if precision is not None:
        env["precision"] = precision  # the dtype 'auto' resolved to, and why
    atomic_write_json(out / ENV, env)


def record_env(out: Path, key: str, value: Any) -> None:
    """Set ``key`` in the run's env.json (a decision taken during the run, e.g. ``compile``)."""
    env = read_json_object(out / ENV)
    env[key] = value
    atomic_write_json(out / ENV, env)
