"""The sink calibration, the HyGA rank sweep and folding studies into the main report,
on a small prepared corpus."""

import dataclasses
import json

import pytest

from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce import RankConfig, ReproduceConfig, TextConfig, reproduce
from gatedattn.reproduce.text.run import add_strongest_layer


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from gatedattn.data import prepare

    root = tmp_path_factory.mktemp("studies")
    docs = root / "docs"
    docs.mkdir()
    for i in range(8):
        (docs / f"{i}.txt").write_text(f"Document {i}. " + "The cat sat on the mat and the dog ran. " * 120)
    prepare([docs], root / "data", vocab_size=300, progress=False)
    return str(root / "data")


def test_calibration_trains_each_lever_and_writes_its_report(tmp_path, data_dir):
    from gatedattn.reproduce.calibration import CalibrationConfig, run_calibration
    from gatedattn.reproduce.verdicts import uniform_first_token_attention

    cfg = CalibrationConfig.quick(levers=("reference", "no-qk-norm"), steps=6, data_dir=data_dir,
                                  out_dir=str(tmp_path / "cal"), progress=False, base_sets=("train.model.size=micro",))
    report = run_calibration(cfg).read_text()
    results = json.loads((tmp_path / "cal" / "results.json").read_text())
    rows = {r["lever"]: r for r in results["levers"]}
    assert set(rows) == {"reference", "no-qk-norm"} and sorted(results["ranking"]) == sorted(rows)
    assert "train.model.attention.qk_norm=false" in rows["no-qk-norm"]["sets"]
    for r in rows.values():
        assert r["steps"] == 6 and r["n_layers"] == 2 and len(r["f_attn_per_layer"]) == 2
        assert r["f_attn_strongest"] == max(r["f_attn_per_layer"])
        # the uniform level of the analysed input (BOS + seq_len - 1 queries), as the claims' rule reads it
        assert r["uniform"] == uniform_first_token_attention(r["seq_len"] - 1)
        curve = r["over_training"]
        assert len(curve["f_attn_max"]) == len(curve["tokens"]) >= 2
        assert all(m >= a for m, a in zip(curve["f_attn_max"], curve["f_attn"]))
    assert (tmp_path / "cal" / "calibration.png").stat().st_size > 0
    assert "| `no-qk-norm` | q/k RMSNorm off | 6 |" in report and "![calibration](calibration.png)" in report


def test_calibration_reuses_finished_levers_and_adds_new_ones(tmp_path, data_dir, unrendered_plots):
    from gatedattn.reproduce.calibration import CalibrationConfig, run_calibration

    base = dict(steps=4, data_dir=data_dir, out_dir=str(tmp_path / "cal"), progress=False,
                base_sets=("train.model.size=micro",))
    run_calibration(CalibrationConfig.quick(levers=("reference",), **base), command="first")
    first = json.loads((tmp_path / "cal" / "results.json").read_text())["levers"][0]
    report = run_calibration(CalibrationConfig.quick(levers=("reference", "no-qk-norm"), **base), command="second")
    results = json.loads((tmp_path / "cal" / "results.json").read_text())
    assert results["levers"][0] == {**first, "session": 1}  # reused as it was
    assert results["levers"][1]["lever"] == "no-qk-norm" and results["levers"][1]["session"] == 2
    assert results["commands"] == ["first", "second"]
    text = report.read_text()
    assert "| command 1 | `first` |" in text and "| call |" in text
    # a call that trains nothing rewrites the report but is not listed
    run_calibration(CalibrationConfig.quick(levers=("reference", "no-qk-norm"), **base), command="again")
    assert json.loads((tmp_path / "cal" / "results.json").read_text())["commands"] == ["first", "second"]
    # another budget in the same directory is refused: nothing there is overwritten
    with pytest.raises(ConfigError, match="holds a calibration with other settings .steps: 4 there, 5 here"):
        run_calibration(CalibrationConfig.quick(levers=("no-qk-norm",), **{**base, "steps": 5}), command="third")


def test_an_interrupted_lever_resumes_with_its_step_count(tmp_path, data_dir, unrendered_plots):
    from gatedattn.reproduce.calibration import CalibrationConfig, run_calibration

    base = dict(data_dir=data_dir, out_dir=str(tmp_path / "cal"), progress=False, base_sets=("train.model.size=micro",))
    run_calibration(CalibrationConfig.quick(levers=("reference", "no-qk-norm"), steps=4, **base))
    results_path = tmp_path / "cal" / "results.json"
    results = json.loads(results_path.read_text())
    lost = results["levers"].pop()  # as if the call had stopped before writing the row
    results_path.write_text(json.dumps(results))
    run_calibration(CalibrationConfig.quick(levers=("reference", "no-qk-norm"), steps=4, **base))
    again = json.loads(results_path.read_text())["levers"][1]
    assert {k: again[k] for k in ("steps", "f_attn", "val_loss")} == {k: lost[k] for k in ("steps", "f_attn", "val_loss")}


def test_calibration_settings_are_checked_before_training(data_dir):
    from gatedattn.reproduce.calibration import CalibrationConfig, rank

    with pytest.raises(ConfigError, match="levers='nope' is not allowed; choose one of 'reference'"):
        CalibrationConfig(levers=("nope",))
    with pytest.raises(ConfigError, match="vocab-1024 prepare their own data"):
        CalibrationConfig(levers=("reference", "vocab-1024"), data_dir=data_dir)
    with pytest.raises(ConfigError, match="minutes_per_run"):
        CalibrationConfig(minutes_per_run=0)
    rows = [{"lever": "a", "sink_eps": 0.0, "f_attn_strongest": 0.08, "uniform": 0.02},
            {"lever": "b", "sink_eps": 0.1, "f_attn_strongest": 0.05, "uniform": 0.02},
            {"lever": "c", "sink_eps": 0.0, "f_attn_strongest": 0.05, "uniform": 0.01}]
    assert rank(rows) == ["b", "c", "a"]  # sink heads first, then the strongest layer relative to uniform


def test_wiki_only_lever_prepares_wikipedia_alone(tmp_path, data_dir):
    from gatedattn.data import TokenData
    from gatedattn.data.corpus import default_sources
    from gatedattn.reproduce.calibration import LEVERS, CalibrationConfig, lever_data

    lever = next(lv for lv in LEVERS if lv.name == "wiki-only")
    path = lever_data(CalibrationConfig.quick(levers=("reference",), progress=False), lever, data_dir, tmp_path)
    texts = [json.loads(line)["text"] for line in (tmp_path / "data" / "wiki-only.jsonl").read_text().splitlines()]
    wiki = next(s for s in default_sources() if s.name == "wikipedia")
    assert texts == [d.text for d in wiki.documents()]
    assert TokenData(path).train_tokens > 0 and TokenData(path).vocab_size <= TokenData(data_dir).vocab_size  # at most the shared vocabulary


@pytest.mark.slow
def test_rank_sweep_and_fold_into_the_main_report(tmp_path, data_dir, unrendered_plots):
    base = dict(preset="micro", steps=4, evals=1, analysis_sequences=4, data_dir=data_dir, progress=False)
    reproduce(RankConfig.quick(ranks=(4, 8), out_dir=str(tmp_path / "rank"), **base))
    sweep = json.loads((tmp_path / "rank" / "results.json").read_text())["rank_sweep"]
    points = [(r["variant"], r["d_int"]) for r in sweep["rows"]]
    assert points == [("gated", None), ("hyga-lowrank", 4), ("hyga-lowrank", 8)]
    flops = [r["gate_flops"] for r in sweep["rows"]]
    assert flops[1] < flops[2] and all(f > 0 for f in flops)
    assert "share of G1's" in (tmp_path / "rank" / "report.md").read_text()

    text = TextConfig.quick(variants=("baseline", "gated"), multiples=(1,), **base)
    report = reproduce(ReproduceConfig.quick(fold=(str(tmp_path / "rank"),), text=text, out_dir=str(tmp_path / "main"),
                                             mechanism=None, pretrained=None)).read_text()
    results = json.loads((tmp_path / "main" / "results.json").read_text())
    assert results["rank_sweep"] == sweep and results["folded"][0]["studies"] == ["rank_sweep"]
    assert "## HyGA low-rank width: loss against gate cost" in report and (tmp_path / "main" / "rank_sweep.png").is_file()
    assert "--study rank" in report  # the folded study's command is part of the reproduce block
    lowrank = next(c for c in results["claims"] if c["key"] == "hyga-lowrank")
    assert "d_int 4:" in lowrank["measured"]
    assert isinstance(results["strongest_layer"], int)
    assert set(results["summary"]["gated"]["f_attn_strongest"]) == {"mean", "std", "values"}


def test_fold_needs_a_study_directory(tmp_path):
    with pytest.raises(ConfigError, match="has no results.json"):
        reproduce(ReproduceConfig.quick(fold=(str(tmp_path),), text=TextConfig.quick(), out_dir=str(tmp_path / "out")))
    (tmp_path / "results.json").write_text(json.dumps({"variants": {}}))
    with pytest.raises(ConfigError, match="holds no lr_study or rank_sweep"):
        reproduce(ReproduceConfig.quick(fold=(str(tmp_path),), text=TextConfig.quick(), out_dir=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_strongest_layer_is_the_baselines():
    def run(per_layer):
        return {"analysis": {"f_attn_per_layer": per_layer}}

    results = {"variants": {"baseline": {"runs": [run([0.02, 0.30, 0.10]), run([0.02, 0.20, 0.25])]},
                            "gated": {"runs": [run([0.02, 0.03, 0.50]), run([0.02, 0.05, 0.40])]}},
               "summary": {"baseline": {}, "gated": {}}}
    add_strongest_layer(results)
    assert results["strongest_layer"] == 1  # 0.25 mean beats 0.175
    assert results["summary"]["baseline"]["f_attn_strongest"]["values"] == [0.30, 0.20]
    assert results["summary"]["gated"]["f_attn_strongest"]["values"] == [0.03, 0.05]


def test_time_steps_times_every_variant(data_dir):
    from gatedattn.data import TokenData
    from gatedattn.reproduce.text.plan import time_steps

    import time

    cfg = TextConfig.quick(preset="micro", variants=("baseline", "gated"), data_dir=data_dir, progress=False)
    start = time.perf_counter()
    timed = time_steps(cfg, TokenData(data_dir), repeats=2)
    wall = time.perf_counter() - start
    assert set(timed) == {"baseline", "gated"} and all(t > 0 for t in timed.values())
    # seconds per step, each the median (here the mean) of 2 timed rounds that lie within the call
    assert 2 * sum(timed.values()) <= wall


def test_time_steps_reports_each_variants_own_seconds_per_step(data_dir, monkeypatch):
    import time

    from gatedattn.reproduce.text import plan

    seconds = {"baseline": 0.01, "gated": 0.04}  # steps of known length, in place of training
    monkeypatch.setattr(plan, "step_fn", lambda cfg, v, data: lambda: time.sleep(seconds[v]))
    cfg = TextConfig.quick(preset="micro", variants=("baseline", "gated"), data_dir=data_dir, progress=False)
    timed = plan.time_steps(cfg, None, repeats=3)
    for v, s in seconds.items():
        assert s <= timed[v] < s + 0.025  # the median of its own rounds, not the other's or their sum
    assert timed["gated"] > timed["baseline"]


def test_levers_are_timed_together(data_dir):
    from pathlib import Path

    from gatedattn.reproduce.calibration import CalibrationConfig, time_levers

    cfg = CalibrationConfig.quick(levers=("reference", "tiny"), data_dir=data_dir, progress=False,
                                  base_sets=("train.seq_len=64",))
    import time

    start = time.perf_counter()
    timed = time_levers(cfg, {"reference": Path(data_dir), "tiny": Path(data_dir)}, repeats=1)
    wall = time.perf_counter() - start
    assert set(timed) == {"reference", "tiny"} and all(t > 0 for t in timed.values())
    assert sum(timed.values()) <= wall  # one timed step of each lever, both within the call


def test_cli_calibrate_refuses_flags_of_other_studies(capsys):
    from gatedattn.cli import main

    assert main(["reproduce", "--study", "calibrate", "--variants", "gated", "--quick"]) == 2
    assert "--variants do not apply to --study calibrate" in capsys.readouterr().err
    assert main(["reproduce", "--levers", "tiny", "--quick"]) == 2
    assert "--levers do not apply to --study main; it takes --variants" in capsys.readouterr().err
    assert main(["reproduce", "--study", "calibrate", "--levers", "nope", "--quick"]) == 2
    assert "levers='nope' is not allowed" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_scale_up_script_runs_its_pipeline_on_cpu(tmp_path, data_dir):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": sys.executable, "OUT": str(tmp_path / "gpu")}
    proc = subprocess.run(["bash", str(root / "scripts" / "reproduce_gpu.sh"), "--quick", "--steps", "2",
                           "--batch-size", "2", "--seq-len", "32", "--multiples", "1", "--data", data_dir, "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "gpu" / "results.json").read_text())
    assert set(results["variants"]) == {"baseline", "gated"}
    assert results["config"]["train"]["device"] == "cpu" and results["config"]["steps"] == 2


def test_gpu_scale_up_script_default_arguments_make_a_valid_config(tmp_path):
    """The script's full run (not its --quick one) has never had a GPU to run on here: its
    argument line, caught by a stand-in for Python, must still build the study's config."""
    import os
    import shlex
    import subprocess
    from pathlib import Path

    from gatedattn.cli import build_parser
    from gatedattn.reproduce.cli import _check_flags, study_config
    from gatedattn.reproduce.studies import STUDIES

    root = Path(__file__).resolve().parents[2]
    args_file = tmp_path / "args"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%q " "$@" > {shlex.quote(str(args_file))}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "gpu")}
    subprocess.run(["bash", str(root / "scripts" / "reproduce_gpu.sh")], env=env, check=True, timeout=60)
    argv = shlex.split(args_file.read_text())
    assert argv[:2] == ["-m", "gatedattn.cli"]
    args = build_parser("reproduce").parse_args(argv[2:])
    _check_flags(STUDIES["main"], args)
    cfg = study_config(STUDIES["main"], args)
    assert (cfg.text.compile, cfg.text.train.model.size, cfg.text.train.device, cfg.mechanism) == ("on", "base", "cuda",
                                                                                                  None)


def test_levers_spell_out_their_recipe_and_one_is_the_main_default():
    from gatedattn.reproduce.calibration import CalibrationConfig

    cfg = CalibrationConfig(levers=("reference", "lr-1e-2", "deep-narrow"))
    ref, lr, deep = (cfg.recipe(lv, steps=10).train for lv in cfg.chosen())
    assert (ref.lr, ref.model.size, ref.model.attention) == (0.003, "small", {"qk_norm": True})
    assert (deep.model.size, deep.model.lm, deep.model.attention) == ("tiny", {"n_layers": 8}, {"qk_norm": False})
    from gatedattn.reproduce.calibration import main_default_lever

    assert main_default_lever(CalibrationConfig()) == "lr-1e-2"
    from gatedattn.reproduce.main_job import text_part_config

    main = text_part_config().train  # the main job's natural-text recipe is the calibrated lever's
    assert (lr.lr, lr.model.size, lr.model.attention, lr.weight_decay, lr.seq_len, lr.micro_batch) == \
        (main.lr, main.model.size, main.model.attention, main.weight_decay, main.seq_len, main.micro_batch)


@pytest.mark.slow
def test_a_second_call_reuses_finished_runs_and_their_analysis(tmp_path, data_dir, monkeypatch, unrendered_plots):
    from gatedattn.reproduce.text import run as runner

    cfg = TextConfig.quick(preset="micro", steps=4, evals=1, analysis_sequences=4, multiples=(1,), data_dir=data_dir,
                           variants=("baseline",), out_dir=str(tmp_path / "r"), progress=False)
    reproduce(cfg)
    first = json.loads((tmp_path / "r" / "results.json").read_text())["variants"]["baseline"]["runs"][0]

    def no_analysis(*args, **kwargs):
        raise AssertionError("a finished run was analysed again")

    analyze, extrapolate = runner.analyze, runner.extrapolate
    monkeypatch.setattr(runner, "analyze", no_analysis)
    monkeypatch.setattr(runner, "extrapolate", no_analysis)
    reproduce(cfg)
    again = json.loads((tmp_path / "r" / "results.json").read_text())["variants"]["baseline"]["runs"][0]
    assert again["analysis"] == first["analysis"] and again["extrapolation"] == first["extrapolation"]
    # another analysis setting analyses again
    monkeypatch.setattr(runner, "analyze", analyze)
    monkeypatch.setattr(runner, "extrapolate", extrapolate)
    reproduce(dataclasses.replace(cfg, analysis_sequences=8))
    third = json.loads((tmp_path / "r" / "results.json").read_text())["variants"]["baseline"]["runs"][0]
    assert third["analysis"]["n_sequences"] == 8


def test_a_signal_stops_the_whole_study(tmp_path, data_dir, monkeypatch):
    import types

    from gatedattn.infra.errors import Interrupted
    from gatedattn.reproduce.text import run as runner

    trained = []

    def interrupted_train(cfg, **kwargs):
        trained.append(cfg.model.variant)
        return types.SimpleNamespace(interrupted="SIGTERM", interrupted_signal=15, steps=2)

    monkeypatch.setattr(runner, "train", interrupted_train)
    cfg = TextConfig.quick(preset="micro", steps=4, data_dir=data_dir, variants=("baseline", "gated"),
                           out_dir=str(tmp_path / "r"), progress=False)
    with pytest.raises(Interrupted, match="SIGTERM: baseline-s0 stopped after step 2") as e:
        reproduce(cfg)
    assert e.value.status == 143 and trained == ["baseline"]  # gated never started


def test_each_study_has_its_own_default_directory():
    from gatedattn.cli import build_parser
    from gatedattn.reproduce.cli import study_config
    from gatedattn.reproduce.studies import STUDIES

    parse = build_parser("reproduce").parse_args
    outs = {name: study_config(study, parse(["reproduce"])).out_dir for name, study in STUDIES.items()}
    assert outs["main"] == "runs/reproduce" and outs["rank"] == "runs/reproduce-rank"
    assert all(out == f"runs/reproduce-{name}" for name, out in outs.items() if name != "main")
    assert len(set(outs.values())) == len(outs)  # one study's runs are never resumed as another's
    quick = {name: study_config(study, parse(["reproduce", "--quick"])).out_dir for name, study in STUDIES.items()}
    assert all(quick[name] == outs[name] + "-quick" for name in STUDIES)


def test_calibration_report_only_recomputes_the_uniform_level_and_says_when_the_ranking_moved(tmp_path):
    """--study calibrate --report-only: each row's uniform level from its own context (T - 1
    positions after BOS), the ranking anew, and the ranking it replaces named."""
    import shutil
    from pathlib import Path

    from gatedattn.cli import main
    from gatedattn.reproduce.verdicts import uniform_first_token_attention

    docs = Path(__file__).parents[2] / "docs"
    out = tmp_path / "cal"
    shutil.copytree(docs / "sink-calibration", out)
    results = json.loads((out / "results.json").read_text())
    for row in results["levers"]:
        row["uniform"] = 1.0  # a stale level: every sink score 1/1
    results["ranking"] = list(reversed(results["ranking"]))
    (out / "results.json").write_text(json.dumps(results))
    assert main(["reproduce", "--study", "calibrate", "--report-only", "--out", str(out)]) == 0
    again = json.loads((out / "results.json").read_text())
    assert all(r["uniform"] == uniform_first_token_attention(r["seq_len"] - 1) for r in again["levers"])
    assert again["ranking_before"] == results["ranking"] and again["ranking"] != results["ranking"]
    assert "This ranking replaces the one" in (out / "report.md").read_text()
    # a directory of another study is refused in one line, and left as it was
    other = tmp_path / "main"
    shutil.copytree(docs / "reproduction", other)
    before = (other / "results.json").read_bytes()
    assert main(["reproduce", "--study", "calibrate", "--report-only", "--out", str(other)]) == 2
    assert (other / "results.json").read_bytes() == before


@pytest.mark.parametrize("argv,match", [
    (["--seeds", "0"], "seeds=0 must be > 0"), (["--steps", "0"], "steps=0 must be > 0"),
    (["--study", "lr", "--seeds", "0"], "LrConfig.seeds=0 must be > 0"),
    (["--study", "mechanism", "--steps", "0"], "MechanismConfig.steps=0 must be > 0"),
])
def test_a_zero_flag_value_is_a_value_and_refused_before_anything_runs(argv, match, tmp_path, capsys):
    from gatedattn.cli import main

    assert main(["reproduce", *argv, "--out", str(tmp_path / "out")]) == 2
    assert match in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_compile_vs_eager_script_parses_its_arguments(monkeypatch, capsys):
    """scripts/compile_vs_eager.py times with the planner's own ``time_compiled`` (tested in
    test_reproduce.py); here its command line, run in this interpreter (the script is
    plain Python on the installed package: a child process would add only its imports)."""
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "compile_vs_eager.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:  # run as `python scripts/compile_vs_eager.py --help`
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--budget-minutes" in out and "interleaved rounds" in out
