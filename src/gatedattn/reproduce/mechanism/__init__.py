"""The mechanism study (``gatedattn reproduce --study mechanism``, the main job's part 1):
the attention sink at toy scale.

Small models (one head, no q/k norm) are trained on the Bigram-Backcopy task
(:mod:`gatedattn.data.backcopy`), where ordinary positions have nothing useful to attend
to and trigger positions must copy the token before them. Every variant trains from the
same seeds on the same batches (the trainer's batches are a function of the seed and the
step).

- :mod:`.config`: ``MechanismConfig`` and the study's flags;
- :mod:`.run`: one run trained and measured, the study alone (``run_study``) and as a part
  of the main job (``run_part``);
- :mod:`.probe`: what a model does on the task, by query class (trigger, ordinary);
- :mod:`.summary`: the results per depth and variant from the runs' records;
- :mod:`.results`: ``MechanismResults``, the study's results as a frozen dataclass (a dict
  only in ``results.json``);
- :mod:`.claims`: the claims and their rules, judged per depth;
- :mod:`.report`: the study's report, alone and as a part of the main job;
- :mod:`.calibration`: ``--study calibrate-mechanism``, which recipe grows the full sink.

Layout of ``out``::

    out/results.json, out/report.md, out/*.png
    out/data/                       the generated task (a prepared data directory)
    out/runs/<variant>-L<depth>-s<seed>/   each run (the trainer's files, mechanism.json)

A second call with the same ``out`` reuses finished runs.

The names this package held as one module (``gatedattn.reproduce.mechanism.NAME``) keep
working for one release, each with a DeprecationWarning naming its new module.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# the names of the former module gatedattn/reproduce/mechanism.py -> the module that holds each now
_MOVED = {
    **dict.fromkeys(("FLAGS", "GATED", "MLP_WORDS", "MODEL_INIT_STD", "MechanismConfig", "NORMS", "POSITIONS",
                     "SCHEDULES", "SINKS", "STUDY_VARIANTS", "TASK_FAMILIES", "TOY_MLP_RATIO"), "config"),
    **dict.fromkeys(("ANALYSIS_SEED", "CURVE_KEYS", "LATER_RECIPE_FIELDS", "RECIPE_FIELDS", "ensure_task_data",
                     "mechanism_run", "model_parameters", "recipe_of", "run_part", "run_results", "train_config",
                     "train_model", "train_runs", "training_work"), "run"),
    **dict.fromkeys(("RUN_FIELDS", "SUMMARY_KEYS", "at_layer", "build_results", "depth_block", "strongest_layer",
                     "summarize"), "summary"),
    **dict.fromkeys(("DRAIN", "HYGA_FULL", "MECHANISM_CLAIMS", "PEAK", "REMOVAL_RATIO", "REMOVAL_TEXT", "SINKING",
                     "SINK_SHARE", "SOURCE", "judge_depths", "judge_mechanism", "mechanism_sink_shown"), "claims"),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        new = f"{__name__}.{_MOVED[name]}"
        warnings.warn(f"{__name__}.{name} moved to {new}.{name} (the old path goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
