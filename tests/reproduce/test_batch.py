"""The batch runner every study trains through: records reused, an interrupted batch
resumed, the process pool, a failed run named; and every study's second call trains
nothing again."""

import functools
import json

import pytest

from gatedattn.infra.errors import ConfigError, Interrupted
from gatedattn.reproduce.batch import Record, Run, RunFailed, run_batch


def _square(log, x, fail=None):
    """A stand-in run: appends its input to ``log`` (a file) and returns a record."""
    with open(log, "a") as f:
        f.write(f"{x}\n")
    if fail is not None:
        raise fail
    return {"x": x, "square": x * x, "key": {"x": x}}


def _trained(log):
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def _runs(tmp_path, xs, fail_at=None, fail=None):
    log = tmp_path / "trained.log"
    return log, [Run(f"run-{x}", functools.partial(_square, log, x, fail if x == fail_at else None),
                     Record(tmp_path / "runs" / f"run-{x}" / "record.json", {"x": x})) for x in xs]


@pytest.mark.parametrize("workers", [1, 2])
def test_finished_runs_are_reused_and_the_rest_trained(tmp_path, workers):
    log, runs = _runs(tmp_path, [1, 2])
    assert [r["square"] for r in run_batch(runs, workers=workers)] == [1, 4]
    log, runs = _runs(tmp_path, [1, 2, 3])
    lines = []
    records = run_batch(runs, workers=workers, progress=lambda i, r: lines.append((i, r["x"])) or f"x={r['x']}")
    assert [r["square"] for r in records] == [1, 4, 9]
    assert sorted(_trained(log)) == [1, 2, 3]  # 1 and 2 once each, in the first call
    assert lines == [(0, 1), (1, 2), (2, 3)]  # every run reported, in the batch's order
    assert json.loads((tmp_path / "runs" / "run-3" / "record.json").read_text())["square"] == 9


def test_a_record_of_another_key_is_trained_again_or_refused(tmp_path):
    log, runs = _runs(tmp_path, [1])
    run_batch(runs)
    path = tmp_path / "runs" / "run-1" / "record.json"
    other = Run("run-1", runs[0].train, Record(path, {"x": 5}))
    assert run_batch([other])[0]["x"] == 1 and _trained(log) == [1, 1]
    refused = Run("run-1", runs[0].train, Record(path, {"x": 5}, refuse="give another --out"))
    with pytest.raises(ConfigError, match=r"runs/run-1 holds a run of another key \(\{'x': 1\}\); give another --out"):
        run_batch([Run("run-0", runs[0].train), refused])
    assert _trained(log) == [1, 1]  # refused before any run trained


def test_key_fields_added_later_take_their_default(tmp_path):
    log, runs = _runs(tmp_path, [1])
    run_batch(runs)  # saved under {"x": 1}
    later = Record(tmp_path / "runs" / "run-1" / "record.json", {"x": 1, "y": 0}, defaults={"y": 0}, refuse="no")
    assert run_batch([Run("run-1", runs[0].train, later)])[0]["x"] == 1 and _trained(log) == [1]
    with pytest.raises(ConfigError, match="another key"):
        run_batch([Run("run-1", runs[0].train, Record(later.path, {"x": 1, "y": 1}, defaults={"y": 0}, refuse="no"))])


@pytest.mark.parametrize("workers", [1, 2])
def test_an_interrupted_batch_stops_and_the_same_call_resumes_it(tmp_path, workers):
    log, runs = _runs(tmp_path, [1, 2, 3], fail_at=2, fail=Interrupted("SIGTERM: run-2 stopped after step 1", 143))
    with pytest.raises(Interrupted, match="run-2 stopped") as e:
        run_batch(runs, workers=1)
    assert e.value.status == 143 and _trained(log) == [1, 2]  # run 3 never started
    log, runs = _runs(tmp_path, [1, 2, 3])
    assert [r["x"] for r in run_batch(runs, workers=workers)] == [1, 2, 3]
    assert sorted(_trained(log)) == [1, 2, 2, 3]  # run 1 reused


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_run_is_named(tmp_path, workers):
    log, runs = _runs(tmp_path, [1, 2], fail_at=2, fail=ValueError("no such thing"))
    with pytest.raises(RunFailed, match="^run run-2 failed: ValueError: no such thing$"):
        run_batch(runs, workers=workers)
    assert json.loads((tmp_path / "runs" / "run-1" / "record.json").read_text())["x"] == 1  # kept for the next call


def test_bad_batches_are_refused_before_any_run(tmp_path):
    log, runs = _runs(tmp_path, [1])
    with pytest.raises(ConfigError, match="workers=0 must be an integer of at least 1"):
        run_batch(runs, workers=0)
    with pytest.raises(ConfigError, match="more than one run run-1"):
        run_batch(runs + runs)
    assert _trained(log) == []


def _micro_mechanism(out, **changes):
    from gatedattn.reproduce.mechanism.config import MechanismConfig

    return MechanismConfig(**{**dict(variants=("baseline", "gated"), depths=(1,), deep_variants=(), seeds=1, deep_seeds=1,
                                     steps=3, seq_len=16, micro_batch=4, d_model=16, warmup_steps=0, evals=1,
                                     analysis_sequences=4, train_tokens=1 << 12, task_family="random", workers=2,
                                     out_dir=str(out), progress=False), **changes})


def _no_training(monkeypatch):
    """From now on, a run that would train a step (or a mechanism run trained at all) fails the test."""
    from gatedattn.reproduce.mechanism import run as mechanism
    from gatedattn.train import loop

    fit = loop._fit

    def finished_only(trainer):
        if trainer.state.step < trainer.end:
            raise AssertionError(f"{trainer.out} was trained again from step {trainer.state.step}")
        return fit(trainer)

    def trains(*args, **kwargs):
        raise AssertionError("a finished mechanism run was trained again")

    monkeypatch.setattr(loop, "_fit", finished_only)
    monkeypatch.setattr(mechanism, "_train_and_measure", trains)


@pytest.mark.slow
def test_mechanism_runs_in_two_worker_processes_and_are_reused(tmp_path, monkeypatch):
    from gatedattn.reproduce.mechanism.run import train_runs

    cfg = _micro_mechanism(tmp_path / "m")
    first = train_runs(cfg, tmp_path / "m")
    assert [(r["variant"], r["depth"], r["seed"]) for r in first] == [("baseline", 1, 0), ("gated", 1, 0)]
    assert all(0 < r["final"]["bos_attn_ordinary"] < 1 for r in first)
    _no_training(monkeypatch)
    assert train_runs(cfg, tmp_path / "m") == first == train_runs(cfg.replace(workers=1), tmp_path / "m")
    with pytest.raises(ConfigError, match="holds a run of another recipe"):
        train_runs(cfg.replace(lr=1e-3), tmp_path / "m")


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    from gatedattn.data import prepare

    root = tmp_path_factory.mktemp("batch")
    docs = root / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"{i}.txt").write_text(f"Document {i}. " + "The cat sat on the mat and the dog ran. " * 60)
    prepare([docs], root / "data", vocab_size=280, progress=False)
    return str(root / "data")


def _study(name, out, data_dir):
    """A micro config of study ``name`` writing into ``out``."""
    from gatedattn.reproduce import RankConfig, TextConfig
    from gatedattn.reproduce.lr_study import LrConfig
    from gatedattn.reproduce.mechanism.calibration import MechCalibrationConfig

    text = dict(preset="micro", seq_len=32, micro_batch=2, steps=3, evals=1, analysis_sequences=4, multiples=(),
                compile="off", data_dir=data_dir, out_dir=str(out), progress=False)
    return {
        "text": lambda: TextConfig.quick(variants=("baseline",), **text),
        "lr": lambda: LrConfig.quick(variants=("baseline",), lrs=(1e-3,), **text),
        "rank": lambda: RankConfig.quick(ranks=(4,), **text),
        "calibrate-mechanism": lambda: MechCalibrationConfig.quick(levers=("default",), steps=3, out_dir=str(out),
                                                                   progress=False),
    }[name]()


# the mechanism study's runs are the two-worker test's above; the natural-text calibration keeps each
# finished lever's row and trains no run for it again (tests/reproduce/test_studies.py); the text
# study's runs train through the same path as the lr study's (text/run.py::text_run)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["lr", "rank", "calibrate-mechanism"])
def test_every_study_reuses_its_finished_runs(name, tmp_path, text_data, monkeypatch):
    import matplotlib.figure

    from gatedattn.reproduce.studies import run

    # about the runs: the reports' plots are laid out but not rendered to PNG (the costly part)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: None)
    cfg = _study(name, tmp_path / name, text_data)
    run(cfg)
    first = json.loads((tmp_path / name / "results.json").read_text())
    assert first.get("variants") or first.get("lr_study") or first.get("rank_sweep") or first.get("rows")  # it trained something
    _no_training(monkeypatch)
    run(cfg)
    again = json.loads((tmp_path / name / "results.json").read_text())
    assert _untimed(again) == _untimed(first)  # every run's record as it was


TIMED = ("meta", "step_time", "step_time_samples", "step_mfu", "text_minutes", "train_seconds")  # this call's clock


def _untimed(results):
    """``results`` without the figures a call measures on its own clock."""
    if isinstance(results, dict):
        return {k: _untimed(v) for k, v in results.items() if k not in TIMED}
    if isinstance(results, list):
        return [_untimed(v) for v in results]
    return results
