"""A batch of training runs, the way every study trains them.

A study describes each of its runs as a :class:`Run`: its name (in progress lines and
errors), how to train and measure it (``train``: a module-level function with its
arguments bound, so that a worker process can run it) and, where the study keeps one,
the finished run's :class:`Record` (a JSON file and the key it must match to be reused).
:func:`run_batch` reuses every finished run, trains the others in order, in this process
or ``workers`` at a time in worker processes, says a line as each run ends, stops the
whole batch on a signal (the run a signal stopped keeps its checkpoint, and the same
command continues it), and names the run that failed.

Runs without a record (the natural-text runs) are reused by the trainer itself: their
run directory resumes from its last checkpoint, and a finished one trains no step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gatedattn.infra.errors import ConfigError, GatedAttnError, Interrupted
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.infra.provenance import say


class RunFailed(GatedAttnError):
    """A run of a batch raised; the message names the run and what it raised."""


@dataclass(frozen=True)
class Record:
    """A finished run's record, kept as JSON at ``path``: reused while the key saved in
    its field ``key_at`` equals ``key`` (``defaults`` fills in the key fields added after such
    records were first written, with the value those runs had). A record of another key
    is trained again, or, with ``refuse`` (the advice given), refused."""

    path: Path
    key: Any
    key_at: str = "key"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    refuse: str | None = None

    def load(self) -> dict[str, Any] | None:
        """The saved record when it may be reused; None when there is none to reuse."""
        if not self.path.is_file():
            return None
        saved = read_json_object(self.path)
        key = saved.get(self.key_at)
        if self.defaults:
            key = {**self.defaults, **(key if isinstance(key, dict) else {})}
        if key == self.key:
            return saved
        if self.refuse is not None:
            raise ConfigError(f"{self.path.parent} holds a run of another {self.key_at} ({saved.get(self.key_at)}); "
                              f"{self.refuse}")
        return None

    def save(self, record: dict[str, Any]) -> None:
        atomic_write_json(self.path, json_safe(record))


@dataclass(frozen=True)
class Run:
    """One run of a batch: ``train()`` trains and measures it and returns its record."""

    name: str
    train: Callable[[], dict[str, Any]]
    record: Record | None = None


def check_interrupted(result: Any, name: str) -> None:
    """Raise :class:`Interrupted` where a signal stopped the run that ``result`` (a
    ``TrainResult``) ended: a signal stops the whole batch, not just this run."""
    if result.interrupted is not None:
        raise Interrupted(f"{result.interrupted}: {name} stopped after step {result.steps} with a checkpoint; the same "
                          "command continues it", 128 + result.interrupted_signal)


def run_batch(runs: Sequence[Run], *, workers: int = 1, threads: int | None = None, label: str = "reproduce",
              progress: Callable[[int, dict[str, Any]], str] | None = None) -> list[dict[str, Any]]:
    """Every run's record, in the order of ``runs``: a finished run's from its record, the
    others trained (``workers`` at a time, each in its own process, when above 1).
    ``threads``: the torch threads each run trains with. ``progress(i, record)``: the
    line said (with ``label``) as run ``i`` ends, after its place in the batch."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"workers={workers!r} must be an integer of at least 1")
    _check_names(runs)
    reused = {i: saved for i, run in enumerate(runs) if run.record is not None
              and (saved := run.record.load()) is not None}  # every record checked before any run trains
    if runs and threads is not None and workers == 1:
        torch.set_num_threads(threads)
    records: list[dict[str, Any]] = []

    def done(i: int, record: dict[str, Any]) -> None:
        records.append(record)
        if progress is not None:
            say(label, f"[{i + 1}/{len(runs)}] {progress(i, record)}")

    if workers == 1:
        for i, run in enumerate(runs):
            done(i, reused[i] if i in reused else _named(run, _execute, run))
        return records
    with ProcessPoolExecutor(max_workers=workers, initializer=_set_threads, initargs=(threads,)) as pool:
        futures = {i: pool.submit(_execute, run) for i, run in enumerate(runs) if i not in reused}
        try:
            for i, run in enumerate(runs):
                done(i, reused[i] if i in reused else _named(run, Future.result, futures[i]))
        except BaseException:
            for f in futures.values():  # the runs not started never start; the running ones end
                f.cancel()
            raise
    return records


def _check_names(runs: Sequence[Run]) -> None:
    """Two runs of one name would share a run directory: refused before any trains."""
    seen: set[str] = set()
    twice = []
    for run in runs:
        if run.name in seen:
            twice.append(run.name)
        seen.add(run.name)
    if twice:
        raise ConfigError(f"a batch names more than one run {', '.join(dict.fromkeys(twice))}; each run's name must "
                          "be unique (it names its directory)")


def _execute(run: Run) -> dict[str, Any]:
    """Train one run and keep its record (in the process that trained it)."""
    record = run.train()
    if run.record is not None:
        run.record.save(record)
    return record


def _named(run: Run, call: Callable[[Any], dict[str, Any]], arg: Any) -> dict[str, Any]:
    """``call(arg)``; an error it raises names ``run`` (a signal passes as it is)."""
    try:
        return call(arg)
    except (Interrupted, KeyboardInterrupt):
        raise
    except Exception as e:
        what = str(e) if isinstance(e, GatedAttnError) else f"{type(e).__name__}: {e}"
        raise RunFailed(f"run {run.name} failed: {what}") from e


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
