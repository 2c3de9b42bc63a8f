"""The main job end to end: `gatedattn reproduce --quick` on the bundled corpus."""

import json

import matplotlib.figure
import pytest

from gatedattn.cli import main
from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce import ReproduceConfig, TextConfig
from gatedattn.reproduce.pretrained import study as pretrained_study
from gatedattn.train.config import ModelRecipe

from test_batch import _no_training  # tests/reproduce is on the path, as pytest runs it
from test_pretrained_study import _tiny_model_dir


@pytest.mark.slow
def test_reproduce_quick_writes_report_plots_and_json(tmp_path, default_cache, capsys, small_study_text, monkeypatch):
    out = tmp_path / "report"
    # every part still trains (part 2 one arm: the three are the real-model study's own tests')
    shorter = ["--steps", "12", "--set", "text.train.micro_batch=4", "--set", "mechanism.steps=40", "--set",
               "pretrained.arms=sink"]
    assert main(["reproduce", "--quick", "--with-text", "--dtype", "fp32", "--out", str(out), "-q", *shorter]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["variants"]) == {"baseline", "gated"}
    for variant, summary in results["summary"].items():
        assert summary["val_loss"]["mean"] > 0 and summary["f_attn"]["mean"] >= 0
        run = results["variants"][variant]["runs"][0]
        assert run["steps"] == 12 and len(run["analysis"]["f_attn_per_layer"]) == 4
        assert run["over_training"]["f_attn"], "sink metrics recorded during training"
        assert run["extrapolation"]["lengths"] == [128, 256]
    assert results["summary"]["gated"]["gate_mean"]["mean"] is not None
    assert results["summary"]["baseline"]["gate_mean"] is None
    assert set(results["step_time"]) == {"baseline", "gated"} and all(t > 0 for t in results["step_time"].values())
    assert all(len(s) >= 3 for s in results["step_time_samples"].values()), "interleaved rounds for a noise estimate"
    report = (out / "report.md").read_text()
    for png in ("val_loss", "train_loss", "f_attn_per_layer", "m_act_per_layer", "gate_histograms",
                "attention_maps", "f_attn_over_training", "m_act_over_training", "extrapolation"):
        assert (out / f"{png}.png").stat().st_size > 1000
        assert f"({png}.png)" in report
    assert report.count("| Gated Attention |") >= 8 and "| HyGA |" in report
    assert "same batches in the same order" in report and "| precision | fp32 (asked `fp32`" in report
    assert all(c["verdict"] in ("held", "did not hold", "not measurable") for c in results["claims"])
    # part 1, the mechanism study, opens the report; part 2 says its scale
    mech = results["mechanism"]
    assert set(mech["depths"]["1"]["summary"]) == {"baseline", "gated"} and mech["minutes"] > 0
    assert (out / "mechanism" / "runs" / "baseline-L1-s0" / "mechanism.json").is_file()
    assert report.index("## Part 1: the attention sink") < report.index("## Part 2: a real pretrained") < \
        report.index("## Part 3: natural text") < report.index("## Setup")
    lm = results["pretrained"]  # part 2: the bundled model, cut to 4 layers in a quick run, and said so
    assert lm["model"]["layers"] == 4 and "cut from 30" in report and {c["key"] for c in lm["claims"]} >= {"lm-sink"}
    assert lm["sink"]["f_attn_per_layer"][3] > 0.3  # SmolLM2's fourth layer already parks its attention on position 0
    assert (out / "lm_noop_curve.png").stat().st_size > 1000 and "(lm_noop_curve.png)" in report
    assert "(bos_attention_L1.png)" in report and (out / "bos_attention_L1.png").stat().st_size > 1000
    assert "each run here trained 0.01 M tokens" in report and "12 steps × 512 tokens" in report
    from gatedattn.reproduce.report import write_report  # a section hook adds its lines before "Reproduce"

    text = write_report(results, tmp_path / "sections", sections=[lambda r, o: ["## Extra study", "", "extra", ""]],
                        plots=False).read_text()  # the report's text alone: no plot drawn, none linked
    assert text.index("## Extra study") < text.index("## Reproduce")
    assert not list((tmp_path / "sections").glob("*.png")) and ".png)" not in text and "## Plots" in text
    # --report-only rewrites the report from results.json alone, judging the claims anew (its plots, drawn
    # from the same results by the same code, were checked above: not drawn again)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)
    written = (out / "report.md").read_text()
    tampered = {**results, "claims": [], "mechanism": {**mech, "depths": {
        d: {**b, "claims": []} for d, b in mech["depths"].items()}}, "pretrained": {**lm, "claims": []}}
    (out / "results.json").write_text(json.dumps(tampered))
    assert main(["reproduce", "--quick", "--out", str(out), "--report-only"]) == 0
    assert (out / "report.md").read_text() == written
    rewritten = json.loads((out / "results.json").read_text())
    assert rewritten["claims"] == results["claims"] and rewritten["pretrained"]["claims"] == lm["claims"]
    # without the other parts the report starts with natural text's setup
    text_only = {k: v for k, v in results.items() if k not in ("mechanism", "pretrained")}
    plain = write_report(text_only, tmp_path / "text-only", plots=False).read_text()
    assert "## Part 1" not in plain and "## Part 2" not in plain and "## Setup" in plain


@pytest.mark.slow
def test_the_default_main_job_leaves_natural_text_out_and_says_where_it_went(tmp_path, capsys, small_study_text,
                                                                           default_corpus_dir, monkeypatch,
                                                                           unrendered_plots):
    out = tmp_path / "report"
    model = _tiny_model_dir(tmp_path, default_corpus_dir)  # the real-model part on a micro model: seconds
    args = ["reproduce", "--quick", "--model", str(model), "--set", "mechanism.steps=40", "--out", str(out), "-q"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert "variants" not in results and "claims" not in results and results["pretrained"]["claims"]
    assert list(results["mechanism"]["depths"]) == ["1"] and results["pretrained"]["arms"]
    assert not (out / "data").exists() and not list(out.glob("baseline*"))  # no corpus prepared, nothing trained
    report = (out / "report.md").read_text()
    assert "**Natural text:**" in report
    assert "`gatedattn reproduce --study text`" in report and "## Setup" not in report
    assert report.index("## Part 1: the attention sink") < report.index("## Part 2: a real pretrained")
    assert report.index("**Natural text:**") < report.index("## Reproduce")
    # a second call reuses every part's finished work: no step trained, the model not even loaded
    _no_training(monkeypatch)
    monkeypatch.setattr(pretrained_study, "load", lambda cfg: pytest.fail("a finished stage of part 2 was run again"))
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["mechanism"]["depths"] == results["mechanism"]["depths"]
    assert again["pretrained"]["arms"] == results["pretrained"]["arms"]
    report = (out / "report.md").read_text()  # this call's: its own time
    assert main(["reproduce", "--out", str(out), "--report-only"]) == 0
    assert (out / "report.md").read_text() == report  # byte for byte from results.json


def test_a_natural_text_flag_without_with_text_is_refused_in_one_line(capsys, tmp_path):
    assert main(["reproduce", "--steps", "5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--steps applies to the text part, which this study runs only with --with-text; add "
                        "--with-text (or use --study text)") and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_fold_without_natural_text_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="^ReproduceConfig.fold joins studies to the natural-text claims, and text "
                                          "is None \\(left out\\): give --with-text with --fold"):
        ReproduceConfig(fold=("runs/lr",))


@pytest.mark.parametrize("fields,match", [
    (dict(variants=("baseline", "gatd")), "unknown variant 'gatd'"),
    (dict(variants=()), "variants is empty"),
    (dict(lrs=(1e-3,)), r"TextConfig has no field 'lrs'"),
    (dict(timing_rounds=2), r"timing_rounds=2 must be >= 3"),
    (dict(preset="huge"), r"preset='huge'"),
    (dict(seeds=0), r"seeds=0 must be > 0"),
    (dict(multiples=(0, 2)), r"multiples"),
    (dict(dtype="fp8"), r"dtype"),
    (dict(steps=None, budget_minutes=None), r"exactly one of steps and budget_minutes"),
    (dict(model=ModelRecipe(size="tiny", lm={"position_embedding": "learned"})),
     r"multiples=\(1, 2, 4, 8\): a model with position_embedding='learned' cannot be read beyond"),
    (dict(min_steps=0), r"min_steps=0 must be > 0"),
    (dict(steps=100, budget_minutes=5.0), r"exactly one of steps and budget_minutes"),
])
def test_bad_text_config(fields, match):
    with pytest.raises(ConfigError, match=match):
        TextConfig.make(**fields)


def _tiny_data(tmp_path):
    """A prepared data directory of six short documents (300-token vocabulary)."""
    from gatedattn.data import TokenData, prepare

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"{i}.txt").write_text(f"Document {i}. " + "The cat sat on the mat. " * 80)
    prepare([docs], tmp_path / "data", vocab_size=300, progress=False)
    return TokenData(tmp_path / "data")


def test_budget_sets_the_same_steps_for_every_variant(tmp_path, monkeypatch):
    from gatedattn.reproduce.text import plan as runner

    data = _tiny_data(tmp_path)
    cfg = TextConfig.quick(steps=None, budget_minutes=1.0, variants=("baseline", "gated"), preset="micro")
    monkeypatch.setattr(runner, "time_steps", lambda c, d: {"baseline": 0.1, "gated": 0.2})
    steps, timed = runner.plan_steps(cfg, data, 1)
    assert timed == {"baseline": 0.1, "gated": 0.2}
    assert steps == 160  # 60 s * 0.8 / (0.1 + 0.2) s, rounded down to tens
    fixed = TextConfig.quick()
    assert runner.plan_steps(fixed, data, 1) == (40, {})


def test_budget_steps_down_to_a_smaller_model_then_fewer_seeds(monkeypatch):
    from gatedattn.reproduce.text import plan as runner

    seconds = {"small": 1.0, "tiny": 0.2}  # per step of each variant at each preset

    def fake_plan(cfg, data, n_runs):
        step_s = {v: seconds[cfg.train.model.size] for v in cfg.variants}
        return runner._fit(cfg, step_s, n_runs), step_s

    monkeypatch.setattr(runner, "plan_steps", fake_plan)
    base = TextConfig.make(budget_minutes=20.0, preset="small", seeds=3)
    # small x 3 seeds x 2 variants at 1 s: 160 steps < 500, so `tiny` at 0.2 s: 800 steps
    cfg, steps, _, cuts = runner.fit_eager_plan(base, None)
    assert (cfg.train.model.size, cfg.seeds, steps) == ("tiny", 3, 800)
    assert "160 steps" in cuts[0] and "`tiny`" in cuts[1]
    # a slower machine: tiny fits 266 at 3 seeds, so the seeds step down (2: 400, 1: 800)
    seconds.update(small=3.0, tiny=0.6)
    cfg, steps, _, cuts = runner.fit_eager_plan(base, None)
    assert (cfg.train.model.size, cfg.seeds, steps) == ("tiny", 1, 800) and "seeds step down to 1" in cuts[-1]
    # a fast machine keeps the model and the seeds
    seconds.update(small=0.1)
    cfg, steps, _, cuts = runner.fit_eager_plan(base, None)
    assert (cfg.train.model.size, cfg.seeds, steps, cuts) == ("small", 3, 1600, [])
    # warm-up is at most a tenth of the run
    assert cfg.train_config("gated", 0, steps=300).warmup_steps == 30


def test_cli_bad_variant_is_one_line(capsys):
    assert main(["reproduce", "--variants", "baseline,nope", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown variant 'nope'" in err


@pytest.mark.slow
def test_lr_study_records_divergence(tmp_path, default_cache, capsys):
    out = tmp_path / "lr"
    # 3.0 is far past stability for AdamW: at least one run must diverge and be reported
    assert main(["reproduce", "--quick", "--study", "lr", "--lrs", "1e-3,3.0", "--steps", "8", "--batch-size", "4",
                 "--preset", "micro", "--seq-len", "32", "--dtype", "fp32", "--out", str(out), "-q"]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = results["lr_study"]["runs"]
    assert {(r["variant"], r["lr"]) for r in runs} == {(v, lr) for v in ("baseline", "gated") for lr in (1e-3, 3.0)}
    assert not any(r["diverged"] for r in runs if r["lr"] == 1e-3)
    assert any(r["diverged"] for r in runs if r["lr"] == 3.0)
    report = (out / "report.md").read_text()
    assert "| `baseline` | 3 |" in report and "Gating keeps training stable" in report
    # --report-only writes the same report again; another study's --report-only refuses the directory
    assert main(["reproduce", "--study", "lr", "--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == report
    assert main(["reproduce", "--report-only", "--out", str(out)]) == 2
    assert "holds the results of --study lr, not main" in capsys.readouterr().err


def test_time_compiled_times_both_modes_of_every_variant_in_the_same_rounds(tmp_path, monkeypatch):
    from gatedattn import GatedLM
    from gatedattn.reproduce.text import plan as runner
    from torch import nn

    data = _tiny_data(tmp_path)
    monkeypatch.setattr(GatedLM, "compile", lambda self: nn.Module.compile(self, backend="eager"))  # dynamo alone
    rounds = []

    def median_times(workloads, *, repeats, warmup=1):
        rounds.append(sorted(workloads))
        return {name: 0.25 if name.startswith("compiled") else 0.5 for name in workloads}

    monkeypatch.setattr(runner, "median_times", median_times)
    cfg = TextConfig.quick(preset="micro", seq_len=32, micro_batch=2)
    timed = runner.time_compiled(cfg, data)
    assert rounds == [["compiled baseline", "compiled gated", "eager baseline", "eager gated"]]
    assert set(timed) == {"baseline", "gated"}
    for compile_s, compiled_s, eager_s in timed.values():
        assert (compiled_s, eager_s) == (0.25, 0.5) and compile_s >= 0


def test_compile_auto_compiles_where_it_fits_more_steps(monkeypatch):
    """auto with a budget: compiled steps (their compile time paid once per run) against the
    eager plan; the faster over the budget wins, and the decision carries its figures."""
    from gatedattn.reproduce.text import plan as runner

    base = TextConfig.make(budget_minutes=10.0, preset="small", seeds=2, min_steps=100)
    eager = {"baseline": 1.0, "gated": 1.0}
    steps = runner._fit(base, eager, 2)  # 600 s * 0.8 / (2 s * 2 runs) = 120
    monkeypatch.setattr(runner, "time_compiled", lambda cfg, data: {"baseline": (20.0, 0.5, 1.0), "gated": (20.0, 0.5, 1.0)})
    cfg, n, step_s, decision = runner.choose_compile(base, None, steps, eager)
    # (480 s - 2 runs x 40 s of compiling) / (1 s x 2 runs) = 200 steps > 120
    assert (cfg.train.compile, n, decision["compiled_steps"], decision["eager_steps"]) == ("on", 200, 200, 120)
    assert step_s == {"baseline": 0.5, "gated": 0.5} and cfg.train_config("gated", 0, steps=10).compile == "on"
    monkeypatch.setattr(runner, "time_compiled", lambda cfg, data: {"baseline": (200.0, 0.9, 1.0), "gated": (200.0, 0.9, 1.0)})
    cfg, n, step_s, decision = runner.choose_compile(base, None, steps, eager)
    assert (cfg.train.compile, n, step_s, decision["compile"]) == ("off", 120, eager, False)  # compiling costs more
    for mode, on in (("on", True), ("off", False)):  # as asked, nothing timed
        monkeypatch.setattr(runner, "time_compiled", None)
        cfg, n, _, decision = runner.choose_compile(base.replace(compile=mode), None, steps, eager)
        assert (cfg.train.compile, n, decision) == (mode, 120, {"mode": mode, "compile": on})
    # both plans under the min_steps floor: compared on what fits, the compiled run gets the floor
    floor = base.replace(min_steps=500)
    monkeypatch.setattr(runner, "time_compiled", lambda cfg, data: {"baseline": (20.0, 0.5, 1.0), "gated": (20.0, 0.5, 1.0)})
    cfg, n, _, decision = runner.choose_compile(floor, None, 500, eager)
    assert (cfg.train.compile, n, decision["eager_steps"], decision["compiled_steps"]) == ("on", 500, 120, 200)
    fixed = TextConfig.make(steps=50)  # auto with fixed steps stays eager
    assert runner.choose_compile(fixed, None, 50, {})[0].train.compile == "off"
    with pytest.raises(ConfigError, match="compile='maybe' is not allowed"):
        TextConfig.make(compile="maybe")


@pytest.mark.parametrize("variant", ["baseline", "gated", "hyga-sink"])
def test_the_model_of_a_variant_is_what_each_of_its_runs_trains(variant):
    from gatedattn.train.optim import lr_at

    cfg = TextConfig.quick(preset="micro").replace(variants=("baseline", "gated", "hyga-sink"))
    model = cfg.model_config(variant, 300)
    for seed, steps in ((0, 10), (2, 500)):
        assert cfg.train_config(variant, seed, steps=steps).model_config(300) == model
    assert model.variant == variant and model.vocab_size == 300
    assert (model.attention.gate is not None) == (variant != "baseline")
    # a timed step: warm-up over, the schedule never decays within any run's length
    t = cfg.step_config(variant)
    assert t.model_config(300) == model and t.seed == 0 and t.out_dir is None
    peak = [lr_at(s, lr=t.lr, total_steps=t.steps, warmup_steps=t.warmup_steps, min_lr_ratio=t.min_lr_ratio,
                  schedule=t.schedule) for s in (t.warmup_steps, t.warmup_steps + 10_000)]
    assert peak == pytest.approx([t.lr, t.lr], rel=1e-3)
