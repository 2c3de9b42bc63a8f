"""Where and with what a result was made: the one home of run metadata.

Every study's ``results.json`` carries ``run_meta(...)`` (the command, the machine, the
software, the code version, when and how long) and ``bench`` records ``cpu_model()`` with
its own timing details. Progress lines of every study go through :func:`say`.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gatedattn.infra.fmt import shown
from gatedattn.infra.version import PACKAGE_DIR, __version__


def code_version() -> dict[str, Any]:
    """Git commit and dirty flag of the source tree gatedattn was imported from (None when
    it is not a git checkout), and the gatedattn version."""
    src = PACKAGE_DIR
    commit, dirty = None, None
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            commit = out.stdout.strip()
            st = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
            dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"git_commit": commit, "git_dirty": dirty, "gatedattn_version": __version__}


def describe_code_version(version: dict[str, Any]) -> str:
    """``code_version()`` in words: ``"commit abc1234 + local changes"``."""
    commit = version.get("git_commit")
    if not commit:
        return "unknown commit"
    return f"commit {commit[:7]}{' + local changes' if version.get('git_dirty') else ''}"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    """One line: CPU, cores, GPU (or none), operating system."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu_model()}, {os.cpu_count()} cores, {device}, {platform.system()} {platform.release()}"


def run_meta(command: str, started: float) -> dict[str, Any]:
    """The provenance of a study's results: ``command``, machine, software, code version,
    start (UTC) and minutes since ``started`` (a ``time.time()``)."""
    return {
        "command": shown(command),
        "machine": machine_description(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gatedattn": __version__,
        "code_version": describe_code_version(code_version()),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_min": (time.time() - started) / 60,
    }


def say(tag: str, msg: str) -> None:
    """A progress line on stderr: ``[tag] msg``."""
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)
