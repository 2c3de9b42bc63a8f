"""Each part of the main job returns a frozen dataclass of its results (the keyed parts'
under their key, the natural-text part's at the top level), which becomes a dict only in
``results.json``: every committed results block reads back and writes again
unchanged (key order included), a block with a key the part does not write (or without one
it always writes) is refused naming the key and the part, and the runners return the
dataclass."""

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from gatedattn.cli import main
from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce.mechanism import run as mechanism_run
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.pretrained import study as pretrained_study
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.pretrained.results import PretrainedResults
from gatedattn.reproduce.studies import MAIN_PARTS
from gatedattn.reproduce.text import run as text_run
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.reproduce.text.results import TextResults

DOCS = Path(__file__).parents[2] / "docs"


def _committed() -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(DOCS.glob("*/results.json"))}


def _blocks(kind: type) -> dict[str, dict]:
    """Every committed block of the part ``kind`` types: a mechanism study's whole results,
    or the block under the part's key."""
    found = {}
    for name, results in _committed().items():
        if kind.PART in results and isinstance(results[kind.PART], dict):
            found[f"{name}:{kind.PART}"] = results[kind.PART]
        elif results.get("study") == kind.PART and kind is MechanismResults:
            found[name] = results
    return found


MECHANISM_BLOCKS = _blocks(MechanismResults)
PRETRAINED_BLOCKS = _blocks(PretrainedResults)


def test_the_committed_blocks_of_each_part_are_found():
    assert {"reproduction:mechanism", "mechanism-random", "mechanism-hyga-gates"} <= set(MECHANISM_BLOCKS)
    assert {"reproduction:pretrained", "real-model-continued:pretrained", "real-model-w64:pretrained"} <= \
        set(PRETRAINED_BLOCKS)


@pytest.mark.parametrize("kind,name", [(MechanismResults, n) for n in MECHANISM_BLOCKS]
                         + [(PretrainedResults, n) for n in PRETRAINED_BLOCKS])
def test_a_committed_block_reads_back_and_writes_again_unchanged(kind, name):
    block = {**MECHANISM_BLOCKS, **PRETRAINED_BLOCKS}[name]
    typed = kind.from_dict(block)
    assert isinstance(typed, kind)
    again = typed.to_dict()
    assert again == block and list(again) == list(block)
    assert json.dumps(again) == json.dumps(block)  # the key order at every depth


def test_the_typed_fields_are_what_the_code_reads():
    mech = MechanismResults.from_dict(MECHANISM_BLOCKS["reproduction:mechanism"])
    assert mech.study == "mechanism" and mech.minutes > 0 and mech.meta is None and set(mech.depths) == {"1", "2"}
    alone = MechanismResults.from_dict(MECHANISM_BLOCKS["mechanism-random"])
    assert alone.minutes is None and alone.meta["command"].startswith("gatedattn reproduce")
    pre = PretrainedResults.from_dict(PRETRAINED_BLOCKS["reproduction:pretrained"])
    assert pre.window == 128 and pre.continued is None and pre.noop_plain is None and len(pre.claims) == 11
    with pytest.raises(dataclasses.FrozenInstanceError):
        pre.window = 64  # type: ignore[misc]


@pytest.mark.parametrize("kind,block", [(MechanismResults, "reproduction:mechanism"),
                                        (PretrainedResults, "reproduction:pretrained")])
def test_an_unknown_or_missing_key_is_refused_naming_it_and_the_part(kind, block):
    data = {**MECHANISM_BLOCKS, **PRETRAINED_BLOCKS}[block]
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results hold an unknown key 'sink_size'"):
        kind.from_dict({**data, "sink_size": 3})
    required = "depths" if kind is MechanismResults else "window_why"
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results miss the key '{required}'"):
        kind.from_dict({k: v for k, v in data.items() if k != required})
    optional = "minutes" if kind is MechanismResults else "claims"
    assert optional not in kind.from_dict({k: v for k, v in data.items() if k != optional}).to_dict()
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results hold '{optional}' as null"):
        kind.from_dict({**data, optional: None})


def test_a_value_of_the_wrong_kind_is_refused_naming_the_key():
    data = PRETRAINED_BLOCKS["reproduction:pretrained"]
    with pytest.raises(ConfigError, match=r"results hold 'window' as str; it must be an integer or null"):
        PretrainedResults.from_dict({**data, "window": "128"})
    with pytest.raises(ConfigError, match=r"results hold 'noop' as dict; it must be a list"):
        PretrainedResults.from_dict({**data, "noop": {}})
    with pytest.raises(ConfigError, match=r"results hold 'run_minutes' as bool; it must be a number"):
        MechanismResults.from_dict({**MECHANISM_BLOCKS["reproduction:mechanism"], "run_minutes": True})
    assert PretrainedResults.from_dict({**data, "window": None}).window is None  # no window chosen: null
    with pytest.raises(ConfigError, match=r"the mechanism part's results must be a JSON object, got list"):
        MechanismResults.from_dict([])


def test_report_only_refuses_a_block_with_an_unknown_key_in_one_line(tmp_path, capsys):
    out = tmp_path / "reproduction"
    shutil.copytree(DOCS / "reproduction", out)
    results = json.loads((out / "results.json").read_text())
    results["pretrained"]["sink_size"] = 3
    (out / "results.json").write_text(json.dumps(results))
    assert main(["reproduce", "--study", "main", "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "the pretrained part's results hold an unknown key 'sink_size'" in err
    assert (out / "report.md").read_bytes() == (DOCS / "reproduction" / "report.md").read_bytes()  # not rewritten


def _record(variant: str, seed: int, bos: float) -> dict:
    final = {"bos_attn_ordinary": bos, "bos_attn_ordinary_per_layer": [bos], "bos_attn_trigger": 0.01,
             "uniform_bos_attn_ordinary": 0.06, "uniform_bos_attn_trigger": 0.07, "trigger_fraction": 0.2}
    return {"variant": variant, "depth": 1, "seed": seed, "final": final, "final_loss": 2.0, "wall_seconds": 1.0,
            "train_seconds": 1.0, "curve": {"step": [0, 10], "bos_attn_ordinary": [0.06, bos]}}


def test_the_mechanism_runner_returns_its_dataclass_and_the_job_records_its_dict(tmp_path, monkeypatch):
    records = [_record(v, s, bos) for v, bos in (("baseline", 0.9), ("gated", 0.1)) for s in range(2)]
    monkeypatch.setattr(mechanism_run, "train_runs", lambda cfg, out: records)  # what training would record
    cfg = MechanismConfig(variants=("baseline", "gated"), depths=(1,), deep_variants=(), seeds=2)
    found = mechanism_run.run_part(cfg, tmp_path)
    assert type(found) is MechanismResults and found.minutes >= 0 and found.meta is None
    assert [c["key"] for c in found.depths["1"]["claims"]][:1] == ["mech-sink"]
    results: dict = {}
    MAIN_PARTS["mechanism"].start(cfg, tmp_path)(results)
    assert list(results["mechanism"]) == ["study", "config", "task", "depths", "run_minutes", "minutes"]
    assert MechanismResults.from_dict(results["mechanism"]).run_minutes == pytest.approx(4 / 60)


def test_the_pretrained_runner_returns_its_dataclass_judged_without_touching_what_it_read(tmp_path, monkeypatch):
    old = copy.deepcopy(PRETRAINED_BLOCKS["reproduction:pretrained"])  # as written before the credit rule
    del old["claims"], old["config"]["kept_tol"]
    for arm in old["arms"].values():
        del arm["credited"]
    unjudged = PretrainedResults.from_dict(old)
    monkeypatch.setattr(pretrained_study, "pretrained_part", lambda cfg, out: unjudged)
    found = pretrained_study.run_part(PretrainedConfig.quick(), tmp_path)
    assert type(found) is PretrainedResults and len(found.claims) == 11
    assert found.config["kept_tol"] == PretrainedConfig().kept_tol and all("credited" in a for a in found.arms.values())
    assert unjudged.claims is None and "kept_tol" not in unjudged.config  # the results it judged are as they were
    assert not any("credited" in a for a in unjudged.arms.values())
    assert list(found.to_dict())[-1] == "claims"


# the natural-text part: its keys sit at the top level of results.json, beside the job's own and the folded studies'
TEXT_RESULTS = {name: results for name, results in _committed().items() if "variants" in results}
NOT_TEXT = ("study", "config", "meta", "folded", "lr_study", "rank_sweep", "mechanism", "pretrained")


def test_the_committed_results_with_a_text_part_are_found():
    assert set(TEXT_RESULTS) == {"reproduction-extended"}


@pytest.mark.parametrize("name", list(TEXT_RESULTS))
def test_a_committed_text_part_reads_back_and_writes_again_unchanged(name):
    results = TEXT_RESULTS[name]
    picked = {k: v for k, v in results.items() if k in TextResults.keys()}
    typed = TextResults.from_results(results)
    again = typed.to_dict()
    assert again == picked and json.dumps(again) == json.dumps(picked)  # the key order at every depth
    assert TextResults.from_dict(again) == typed
    whole = {k: (None if k in picked else v) for k, v in results.items()}  # the part's keys emptied where they stand
    typed.merge_into(whole)
    assert json.dumps(whole) == json.dumps(results)  # reassembled, the job's and folded keys still between


@pytest.mark.parametrize("name", list(TEXT_RESULTS))
def test_the_jobs_own_and_folded_keys_are_not_text_keys(name):
    results = TEXT_RESULTS[name]
    typed = TextResults.from_results(results)
    assert not set(typed.to_dict()) & set(NOT_TEXT)
    assert [k for k in results if k not in typed.to_dict()] == [k for k in results if k in NOT_TEXT]
    with pytest.raises(ConfigError, match=r"the text part's results hold an unknown key 'config'"):
        TextResults.from_dict(results)  # the whole results are not the part's


def test_a_text_part_with_an_unknown_or_missing_key_is_refused_naming_it():
    data = TextResults.from_results(TEXT_RESULTS["reproduction-extended"]).to_dict()
    with pytest.raises(ConfigError, match=r"the text part's results hold an unknown key 'sink_size'"):
        TextResults.from_dict({**data, "sink_size": 3})
    with pytest.raises(ConfigError, match=r"the text part's results miss the key 'gate_cost'"):
        TextResults.from_results({k: v for k, v in TEXT_RESULTS["reproduction-extended"].items() if k != "gate_cost"})
    with pytest.raises(ConfigError, match=r"results hold 'step_time' as list; it must be an object"):
        TextResults.from_dict({**data, "step_time": []})
    with pytest.raises(ConfigError, match=r"the text part's results hold 'claims' as null"):
        TextResults.from_dict({**data, "claims": None})
    old = TextResults.from_dict({k: v for k, v in data.items() if k not in ("text_minutes", "step_mfu")})
    assert old.text_minutes is None and list(old.to_dict()) == [k for k in data if k not in ("text_minutes", "step_mfu")]


def test_the_text_part_is_judged_through_its_dataclass_in_place():
    results = copy.deepcopy(TEXT_RESULTS["reproduction-extended"])
    MAIN_PARTS["text"].rejudge(results)
    assert json.dumps(results) == json.dumps(TEXT_RESULTS["reproduction-extended"])  # judged as committed, in place
    del results["claims"]
    MAIN_PARTS["text"].rejudge(results)
    assert list(results)[-1] == "claims" and results["claims"] == TEXT_RESULTS["reproduction-extended"]["claims"]
    del results["gate_cost"]
    with pytest.raises(ConfigError, match=r"the text part's results miss the key 'gate_cost'"):
        MAIN_PARTS["text"].rejudge(results)


def test_the_text_runner_returns_its_dataclass_and_the_job_merges_its_keys_after_its_own(tmp_path, monkeypatch):
    cfg = TextConfig.quick(variants=("baseline", "gated"), seeds=2)
    runs = [{"tokens_per_s": 10.0, "final_loss": 2.0, "analysis": {"f_attn_per_layer": [0.1, 0.3 + s]}}
            for s in (0.0, 0.1)]
    monkeypatch.setattr(text_run, "open_data", lambda cfg: (tmp_path, None))
    monkeypatch.setattr(text_run, "fit_plan", lambda cfg, data: (cfg, 5, 0.1, [], "eager"))
    monkeypatch.setattr(text_run, "run_batch", lambda batch: copy.deepcopy(runs))
    monkeypatch.setattr(text_run, "gate_costs", lambda cfg, data, variants: {v: {"gate_params": 0} for v in variants})
    monkeypatch.setattr(text_run, "step_fn", lambda cfg, variant, data: lambda: None)
    monkeypatch.setattr(text_run, "interleaved_times", lambda fns, **kw: {v: [0.1, 0.3, 0.2] for v in fns})
    monkeypatch.setattr(text_run, "step_speed", lambda train_cfg, data, t: {"mfu": t})
    monkeypatch.setattr(text_run, "text_meta", lambda cfg, data: {"data": "corpus"})
    results: dict = {"study": "main", "config": {"out_dir": str(tmp_path)}, "lr_study": {}, "folded": []}
    ran, found = text_run.text_part(cfg, tmp_path, None, tmp_path, dict(results))
    assert type(found) is TextResults and found.strongest_layer == 1 and found.step_time == {"baseline": 0.2,
                                                                                             "gated": 0.2}
    assert found.claims is None and list(found.to_dict())[-1] == "step_mfu"
    progress = json.loads((tmp_path / "results.json").read_text())  # written after each variant
    assert list(progress) == ["study", "config", "lr_study", "folded", "variants", "summary"]
    text_run.start_part(cfg, tmp_path)(results)
    assert list(results) == ["study", "config", "lr_study", "folded", *found.to_dict(), "meta"]
    assert results["config"]["steps"] == 5 and results["meta"] == {"data": "corpus"}
    assert TextResults.from_results(results).summary == found.summary
