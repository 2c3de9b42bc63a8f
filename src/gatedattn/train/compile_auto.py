"""``TrainConfig.compile = "auto"``: whether a run compiles, decided on its own first steps.

The run starts eager. After one warm-up step and ``PROBE_STEPS`` timed ones it knows its
eager seconds per step. If the steps left would take less than ``MIN_RUN_S`` eagerly, a
compile (tens of seconds on a CPU, and a saving of 0-25 % a step where it saves anything:
``docs/benchmarks/real-model.md``) cannot pay for itself, and the run stays eager. Otherwise
the model is compiled in place, and its first compiled step's time beyond a compiled step is the
compile. Then the run alternates compiled and eager steps, ``PROBE_STEPS`` of each (switching
costs nothing once both exist), so that a burst of load on the machine falls on both modes
alike, and keeps the compiled model when the median compiled step is faster than the median
eager one (the compile is paid by then either way). Every step of the probe is a step of the
run; nothing is trained twice.

Under torchrun every rank times its steps, and rank 0's decision is every rank's; an FSDP
run is not probed and stays eager unless ``compile`` is ``on``. The
decision and its figures go to ``metrics.jsonl`` (a record of kind ``compile``), to the
run's ``env.json`` (``"compile"``), and to stderr where a compile was tried.
"""

from __future__ import annotations

import statistics
from typing import Any

from gatedattn.train import distributed as D

PROBE_STEPS = 4  # timed steps of each mode (after an untimed eager one and the compiling one)
MIN_RUN_S = 300.0  # eager seconds the rest of a run must take before a compile is tried


class CompileProbe:
    """Fed every step's seconds by the training loop; compiles, alternates, and keeps or
    drops the compiled model on the schedule above. ``decision`` is set once the run's mode
    is settled."""

    def __init__(self, trainer: Any, *, probe_steps: int | None = None, min_run_s: float | None = None) -> None:
        self.trainer = trainer
        self.probe_steps = PROBE_STEPS if probe_steps is None else probe_steps
        self.min_run_s = MIN_RUN_S if min_run_s is None else min_run_s
        self.eager_times: list[float] = []  # the first one is the warm-up
        self.compiled_times: list[float] = []  # the first one holds the compile
        self.decision: dict[str, Any] | None = None
        left = trainer.end - trainer.state.step
        if trainer.cfg.fsdp:  # switching FSDP2's hooked modules between compiled and eager is not tried
            self._settle(False, "fsdp: not probed (compile=on compiles an FSDP run)")
        elif left <= 3 * self.probe_steps + 2:
            self._settle(False, f"{left} steps to train: too few to time both modes")

    def after_step(self, seconds: float) -> dict[str, Any] | None:
        """Take one step's seconds; return the decision at the step that settles it, else None."""
        if self.decision is not None:
            return None
        if not self.compiled_times and not self.trainer.compiled:  # the eager steps before trying
            self.eager_times.append(seconds)
            return self._try_compile() if len(self.eager_times) == self.probe_steps + 1 else None
        (self.compiled_times if self.trainer.compiled else self.eager_times).append(seconds)
        if len(self.compiled_times) == self.probe_steps + 1 and len(self.eager_times) == 2 * self.probe_steps + 1:
            return self._compare()
        self.trainer.set_compiled(not self.trainer.compiled)  # alternate
        return None

    # ------------------------------------------------------------------ the two decisions
    def _try_compile(self) -> dict[str, Any] | None:
        eager_s = statistics.median(self.eager_times[1:])
        left = self.trainer.end - self.trainer.state.step
        go = D.broadcast_object(left * eager_s >= self.min_run_s, self.trainer.env)
        if not go:
            return self._settle(False, f"the {left} steps left take {left * eager_s:.0f} s eager, under "
                                       f"{self.min_run_s:.0f} s: too short for a compile to pay back",
                                eager_step_s=eager_s)
        self.trainer.say(f"compile auto: eager steps take {eager_s:.3f} s; compiling to compare")
        self.trainer.set_compiled(True)
        return None

    def _compare(self) -> dict[str, Any]:
        eager_s = statistics.median(self.eager_times[1:])
        compiled_s = statistics.median(self.compiled_times[1:])
        compile_s = max(self.compiled_times[0] - compiled_s, 0.0)
        left = self.trainer.end - self.trainer.state.step
        keep = D.broadcast_object(compiled_s < eager_s, self.trainer.env)
        self.trainer.set_compiled(keep)
        verdict = (f"compiled steps {compiled_s:.3f} s vs eager {eager_s:.3f} s, alternated (compiling took "
                   f"{compile_s:.0f} s): {'saves' if keep else 'would cost'} {abs(eager_s - compiled_s) * left:.0f} s "
                   f"over the {left} steps left")
        return self._settle(keep, verdict, eager_step_s=eager_s, compiled_step_s=compiled_s, compile_s=compile_s)

    def _settle(self, compiled: bool, reason: str, **figures: float) -> dict[str, Any]:
        self.decision = {"mode": "auto", "compile": compiled, "step": self.trainer.state.step, "reason": reason,
                         **figures}
        if self.compiled_times or compiled:  # a run too short to try says so in env.json and metrics.jsonl only
            self.trainer.say(f"compile auto: {'compiled' if compiled else 'eager'} ({reason})")
        return self.decision
