"""The guard around a long command's output directory: its limits checked before the
directory is created, one writer at a time, and a signal answered with one line.

``reproduce`` (and any study that writes one directory of runs) wraps its work::

    with study_output(cfg.out_dir, budget_minutes=cfg.budget_minutes):
        reproduce(cfg)

- the budget is checked (finite, at most a week) before anything is created;
- the directory is new, empty or one the study wrote (``outputs.check_study_output``);
- the directory is locked (``io.DirLock``): a second ``reproduce --out DIR`` while the
  first runs is refused naming its PID; the kernel drops the lock with the process;
- SIGINT / SIGTERM outside a training step (planning, analysis, the report) end with one
  line saying that finished runs are kept and the same command continues.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from gatedattn.infra.io import DirLock, interruptible
from gatedattn.infra.outputs import check_study_output, mark_study_output, unmark_study_output
from gatedattn.infra.sizes import check_budget_minutes


@contextlib.contextmanager
def study_output(out_dir: str | os.PathLike, *, budget_minutes: float | None = None,
                 command: str = "reproduce", budget_flag: str = "--budget-minutes",
                 study: str | None = None) -> Iterator[None]:
    """Check ``budget_minutes`` and ``out_dir`` (another ``study``'s output is refused),
    then hold ``out_dir``'s lock and turn signals into one-line errors while inside."""
    check_budget_minutes(budget_minutes, budget_flag)
    check_study_output(out_dir, command, study)  # a directory of the user's own files is never written into
    stopped = (f"stopped; the finished runs and analyses in {out_dir} are kept; run the same command again "
               f"to continue")
    lock = DirLock(out_dir, f"{command} --out")
    with lock, interruptible(stopped):
        mark_study_output(out_dir, command, study)
        try:
            yield
        except BaseException:
            if lock.created_dir:
                unmark_study_output(out_dir)  # nothing written: the directory goes with the lock
            raise
