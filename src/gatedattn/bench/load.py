"""The load row of ``gatedattn bench --real-model``: reading a model file into a float32
model, ours (``gatedattn.hf.load_model``) against transformers' own loader
(``AutoModelForCausalLM.from_pretrained``, with ``gguf_file=`` for a GGUF file) on the same
file. Each load runs in a child process of its own, so that no cache of an earlier load
(a parsed header, a built tokenizer, pages of the file already in the process) helps it and
its peak resident memory is its own; both children import the same libraries before the
clock starts, the architecture's transformers model module included
(:func:`import_for_load`), so the seconds are the load's alone and the two peaks differ by
what the two loads hold."""

from __future__ import annotations

import importlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gatedattn.hf import load_model
from gatedattn.hf.checkpoint import read_config
from gatedattn.hf.gguf import gguf_file_of, read_header
from gatedattn.hf.importers import quiet_transformers
from gatedattn.infra.errors import GatedAttnError

LOADERS = ("ours", "hf")
TIMEOUT_S = 1800  # a child that takes longer is stopped and named


def hf_model(path: Path):
    """transformers' own model of the file (GGUF) or directory, float32, eval."""
    from transformers import AutoModelForCausalLM  # lazy: heavy (transformers)

    with quiet_transformers():
        if path.is_file():
            return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                        dtype=torch.float32).eval()
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def load_once(loader: str, path: str | Path, threads: int) -> dict[str, float]:
    """Load ``path`` with ``loader`` in this process; its seconds and this process's peak
    resident bytes (what a child reports). A path that is not there is refused first, before
    the seconds of importing transformers."""
    path = Path(path)
    if not path.exists():
        raise GatedAttnError(f"{path} does not exist")
    import_for_load(path)
    torch.set_num_threads(threads)
    started = time.perf_counter()
    if loader == "ours":
        load_model(path)
    else:
        hf_model(path)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_bytes": peak_rss_bytes()}


def import_for_load(path: Path) -> None:
    """What either load of ``path`` would import on its clock, imported before it starts, for
    both loaders alike: transformers' auto classes and GGUF loader (ours reads GGUF metadata
    through them too) and the modeling module of the model's architecture, which
    transformers' load imports the first time it builds the model (seconds: the time it
    takes is in ``docs/benchmarks/real-model.md``)."""
    # lazy: heavy (transformers)
    from transformers import AutoModelForCausalLM, modeling_gguf_pytorch_utils  # noqa: F401

    model_type = _model_type(path)
    if model_type.isidentifier():
        try:
            importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ImportError:  # an architecture transformers does not ship (gatedattn's own format)
            pass


def _model_type(path: Path) -> str:
    """The architecture a GGUF file or a model directory states; "" where it states none that
    can be read (the load itself then says what is wrong)."""
    try:
        gguf = gguf_file_of(path)
        if gguf is not None:
            return read_header(gguf).architecture
        model_type = read_config(path).get("model_type")
    except (OSError, GatedAttnError):
        return ""
    return model_type if isinstance(model_type, str) else ""


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started its program: Linux's ``VmHWM``,
    which a new program starts afresh (``ru_maxrss`` keeps the parent's peak across fork and
    exec, so a child of a bench holding two models reported the bench's peak)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(loader: str, path: Path, threads: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "gatedattn.bench.load", loader, str(path), str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GatedAttnError(f"bench --real-model: the {loader} load of {path} took over {TIMEOUT_S} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GatedAttnError(f"bench --real-model: the {loader} load of {path} failed ({last})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_row(path: str | Path, *, repeats: int, threads: int) -> dict[str, Any]:
    """Ours and transformers' load of ``path``, each ``repeats`` times in fresh children
    (alternating, ours first): the median seconds, the speedup (transformers' over ours),
    the highest peak of each, their ratio (ours over transformers'), and the goal: met where
    ours is no slower and peaks no higher."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LOADERS}
    for _ in range(repeats):
        for name in LOADERS:
            runs[name].append(_child(name, Path(path), threads))
    row: dict[str, Any] = {}
    for name in LOADERS:
        row[f"{name}_s"] = statistics.median(r["seconds"] for r in runs[name])
        row[f"{name}_peak_bytes"] = max(r["peak_bytes"] for r in runs[name])
        row[f"{name}_samples"] = [r["seconds"] for r in runs[name]]
    row["speedup"] = row["hf_s"] / row["ours_s"]
    row["peak_ratio"] = row["ours_peak_bytes"] / row["hf_peak_bytes"]
    row["goal"] = load_goal(row)
    return row


def load_goal(row: dict[str, Any]) -> str:
    """``met`` where ours loads no slower than transformers' and peaks no higher, else ``missed``."""
    return "met" if row["speedup"] >= 1 and row["peak_ratio"] <= 1 else "missed"


def format_load(row: dict[str, Any], repeats: int) -> str:
    """The load row as one sentence of the bench's report."""
    return (f"Load of the file into a float32 model, each in a fresh process (median of {repeats}): ours "
            f"{row['ours_s']:.2f} s at a peak of {row['ours_peak_bytes'] / 2**30:.2f} GiB, transformers' "
            f"{row['hf_s']:.2f} s at {row['hf_peak_bytes'] / 2**30:.2f} GiB: {row['speedup']:.2f}x the speed, "
            f"{row['peak_ratio']:.2f}x the peak memory. Goal (no slower and no more memory than "
            f"transformers'): {load_goal(row)}.")


if __name__ == "__main__":
    print(json.dumps(load_once(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
