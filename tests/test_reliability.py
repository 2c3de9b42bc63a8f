"""Shutdown, damaged files and identity: SIGTERM/SIGINT save and resume exactly, temporaries
of a killed run are cleaned on resume, checksum manifests catch one flipped bit, tokenizers
are compared by what they do, ``train --resume RUN_DIR`` continues a run from its record,
and property tests of config validation and the data pipeline."""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatedattn.cli import main
from gatedattn.data import TokenData
from gatedattn.data.prepare import prepare
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.integrity import CHECKSUMS, read_verified, record, tokenizer_fingerprint
from gatedattn.infra.io import read_jsonl
from gatedattn.train import TrainConfig, train
from gatedattn.train import checkpoint as ckpt_mod

WORDS = "the gate sink softmax token layer head query key value attention model loss".split()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rel")
    rng = random.Random(1)
    texts = root / "texts"
    texts.mkdir()
    for i in range(12):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(150)))
    prepare([str(texts)], root / "data", vocab_size=300, val_fraction=0.25, progress=False)
    return root / "data"


def cfg_for(data_dir, out, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), out_dir=str(out), preset="micro", variant="gated", seq_len=16,
                micro_batch=2, steps=6, warmup_steps=1, eval_batches=1, eval_every=0, ckpt_every=0, log_every=1,
                progress=False, tensorboard=False, dtype="fp32", device="cpu")
    return TrainConfig(**{**base, **kw})


# ------------------------------------------------------------------------------ signals
TRAIN_ARGS = ["--preset", "micro", "--variant", "gated", "--set", "seq_len=16", "--set", "micro_batch=2",
              "--set", "warmup_steps=1", "--set", "eval_batches=1", "--set", "eval_every=0",
              "--set", "ckpt_every=0", "--set", "log_every=1", "--set", "progress=false",
              "--set", "tensorboard=false", "--set", "dtype=fp32", "--set", "device=cpu"]


def _train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_step_saves_and_resume_equals_uninterrupted(data_dir, tmp_path, sig):
    steps = 4000  # far more than the few seconds before the signal train
    run = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gatedattn.cli", "train", "--data", str(data_dir), "--out",
                             str(run), *TRAIN_ARGS, "--set", f"steps={steps}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not any(s >= 5 for s in _train_losses(run)):
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    last = err.strip().splitlines()[-1]
    assert f"continue with: gatedattn train --resume {run}" in last and "Traceback" not in err
    stopped = ckpt_mod.latest_checkpoint(run)
    assert stopped is not None
    step = int(stopped.name.split("_")[1])
    assert 5 <= step < steps and json.loads((run / "summary.json").read_text())["steps"] == step
    # continue to step + 3 (resume with the run's record alone), and compare with a run that was never stopped
    assert main(["train", "--resume", str(run), "--set", f"stop_at_step={step + 3}"]) == 0
    whole = train(cfg_for(data_dir, tmp_path / "whole", steps=steps, stop_at_step=step + 3, seed=0))
    resumed = _train_losses(run)
    assert [resumed[s] for s in range(1, step + 4)] == pytest.approx(whole.losses, abs=1e-6)


def test_kill_points_lose_nothing_and_temporaries_are_cleaned(data_dir, tmp_path, monkeypatch):
    """A kill while writing the final model, metrics.csv or summary.json leaves temporaries;
    resuming removes them and ends with the same model as an uninterrupted run."""
    ref = train(cfg_for(data_dir, tmp_path / "ref"))
    run = tmp_path / "run"
    train(cfg_for(data_dir, run, stop_at_step=3, ckpt_every=3))
    debris = [run / ".final.abc.tmp", run / ".metrics.csv.abc.tmp", run / ".summary.json.abc.tmp",
              run / ".config.json.x.tmp", run / "checkpoints" / ".step_00000006.y.tmp"]
    debris[0].mkdir()
    (debris[0] / "model.safetensors").write_bytes(b"partial")
    for p in debris[1:]:
        p.parent.mkdir(exist_ok=True)
        p.mkdir() if p.name.startswith(".step") else p.write_text("partial")
    result = train(cfg_for(data_dir, run), resume=True)
    assert not [p for p in debris if p.exists()]
    assert result.complete and result.losses == pytest.approx(ref.losses, abs=1e-6)
    assert not [p for p in run.rglob(".*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------ integrity
def test_checksum_manifest_catches_one_flipped_bit(tmp_path):
    from gatedattn.models.lm import GatedLM, ModelConfig

    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64))
    model.save_pretrained(tmp_path / "m")
    sums = json.loads((tmp_path / "m" / CHECKSUMS).read_text())
    from gatedattn.models.code import bundle_sources

    assert set(sums) == {"model.safetensors", "config.json", "generation_config.json", *bundle_sources()}
    path = tmp_path / "m" / "model.safetensors"
    clean = path.read_bytes()
    # every byte position class: header, first tensor, last tensor
    for pos in (9, len(clean) // 2, len(clean) - 2):
        b = bytearray(clean)
        b[pos] ^= 0x01
        path.write_bytes(bytes(b))
        with pytest.raises(GatedAttnError, match="damaged"):
            GatedLM.from_pretrained(tmp_path / "m")
    path.write_bytes(clean)
    GatedLM.from_pretrained(tmp_path / "m")
    assert read_verified(path) == clean


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_every_chunk_of_a_tensor_is_checked_finite(bad):
    from gatedattn.infra.integrity import FINITE_CHUNK, all_finite, check_finite

    t = torch.zeros(3, FINITE_CHUNK)  # three chunks; a bad value in each in turn, the last element too
    assert all_finite(t) and all_finite(t.bfloat16()) and all_finite(t.t())  # strided: checked as well
    for where in (0, FINITE_CHUNK + 5, 3 * FINITE_CHUNK - 1):
        t.view(-1)[where] = bad
        assert not all_finite(t) and not all_finite(t.t())
        with pytest.raises(GatedAttnError, match="'w' holds 1 non-finite"):
            check_finite({"w": t}, "src")
        t.view(-1)[where] = 0.0


def test_nonfinite_weights_are_refused_even_with_a_good_checksum(tmp_path):
    from safetensors.torch import load_file, save_file

    from gatedattn.models.lm import GatedLM, ModelConfig

    GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64)).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["embed.weight"][3, 1] = float("inf")
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    record(tmp_path / "model.safetensors")
    with pytest.raises(GatedAttnError, match="'embed.weight' holds 1 non-finite"):
        GatedLM.from_pretrained(tmp_path)


def test_checkpoints_and_final_have_manifests_and_train_refuses_flipped_data(data_dir, tmp_path):
    run = tmp_path / "run"
    train(cfg_for(data_dir, run, steps=2, ckpt_every=1))
    for d in [run / "final", *ckpt_mod.list_checkpoints(run)]:
        sums = json.loads((d / CHECKSUMS).read_text())
        assert "model.safetensors" in sums and "config.json" in sums
    assert "trainer_state.pt" in json.loads((ckpt_mod.list_checkpoints(run)[-1] / CHECKSUMS).read_text())
    assert "tokenizer.json" in json.loads((run / "final" / CHECKSUMS).read_text())
    bad = tmp_path / "data"
    bad.mkdir()
    for f in data_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    b = bytearray((bad / "train.bin").read_bytes())
    b[4] ^= 0x10
    (bad / "train.bin").write_bytes(bytes(b))
    with pytest.raises(GatedAttnError, match="sha256 differs"):
        train(cfg_for(bad, tmp_path / "r2"))
    assert not (tmp_path / "r2").exists()


def test_token_ids_beyond_the_manifest_vocabulary_are_refused(data_dir, tmp_path):
    bad = tmp_path / "data"
    bad.mkdir()
    for f in data_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    m = json.loads((bad / "manifest.json").read_text())
    top = int(np.fromfile(bad / "train.bin", dtype=m["dtype"]).max())
    (bad / "manifest.json").write_text(json.dumps({**m, "vocab_size": top}))
    with pytest.raises(GatedAttnError, match=f"token id {top} is outside the vocabulary of {top}"):
        TokenData(bad, verify=True)


# ------------------------------------------------------------------------------ tokenizers
def test_tokenizer_fingerprint_is_what_it_tokenizes(data_dir, tmp_path):
    path = data_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    (tmp_path / "same.json").write_text(json.dumps(tok, indent=None, sort_keys=True))  # other bytes, same tokenizer
    assert tokenizer_fingerprint(tmp_path / "same.json") == tokenizer_fingerprint(path)
    merges = tok["model"]["merges"]
    tok["model"]["merges"] = merges[1:] + merges[:1]  # same vocabulary size, other merge order
    (tmp_path / "other.json").write_text(json.dumps(tok))
    assert tokenizer_fingerprint(tmp_path / "other.json") != tokenizer_fingerprint(path)


def test_analyze_refuses_data_of_another_tokenizer_unless_forced(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    train(cfg_for(data_dir, run, steps=1))
    tok = json.loads((data_dir / "tokenizer.json").read_text())
    merges = tok["model"]["merges"]
    tok["model"]["merges"] = merges[1:] + merges[:1]  # another tokenizer of the same size
    (tmp_path / "other.json").write_text(json.dumps(tok))
    other = tmp_path / "other"  # data prepared with it: consistent in itself, not the model's
    prepare([str(_texts(tmp_path / "t"))], other, tokenizer=tmp_path / "other.json", progress=False)
    args = ["analyze", "--model", str(run / "final"), "--data", str(other), "--batches", "1", "--batch-size", "1",
            "--device", "cpu", "--json"]
    assert main(args) == 2
    assert "is not the tokenizer the model was trained with" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0


def test_resume_run_dir_alone_continues_the_recorded_config(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    first = train(cfg_for(data_dir, run, steps=6, stop_at_step=3, ckpt_every=3, lr=2e-3, seed=4))
    assert not first.complete
    assert main(["train", "--resume", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["steps"] == 6
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 2e-3
    whole = train(cfg_for(data_dir, tmp_path / "whole", steps=6, lr=2e-3, seed=4))
    assert list(_train_losses(run).values()) == pytest.approx(whole.losses, abs=1e-6)


def test_set_cannot_change_a_runs_identity(data_dir, tmp_path, capsys):
    base = ["train", "--data", str(data_dir), "--out", str(tmp_path / "a"), *TRAIN_ARGS, "--set", "steps=1"]
    for item, flag in (("out_dir=b", "--out"), ("data_dir=x", "--data"), ("variant=baseline", "--variant"),
                       ("model.size=small", "--preset")):
        assert main(base + ["--set", item]) == 2
        assert f"is set by {flag}, not --set" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------ properties
INT_FIELDS = ["seq_len", "micro_batch", "grad_accum", "steps", "warmup_steps", "seed", "eval_every",
              "eval_batches", "ckpt_every", "keep_checkpoints", "log_every", "spike_window", "overfit_batches"]
LOWS = {"seq_len": 1, "micro_batch": 1, "grad_accum": 1, "steps": 1, "eval_batches": 1, "log_every": 1,
        "spike_window": 1}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(INT_FIELDS), value=st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                                                         st.text(max_size=5), st.booleans(), st.none()))
def test_property_integer_fields_accept_exactly_their_range(field, value):
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= LOWS.get(field, 0)
    if field == "warmup_steps" and ok:
        ok = True  # its bound against steps is checked by train, not the config
    if ok:
        assert getattr(TrainConfig(**{field: value}), field) == value
    else:
        with pytest.raises(ConfigError, match=field):
            TrainConfig(**{field: value})


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(["lr", "eps", "weight_decay", "grad_clip", "min_lr_ratio", "spike_margin",
                            "diverge_factor", "muon_momentum"]),
       text=st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6)))
def test_property_set_values_parse_or_fail_naming_the_key(key, text):
    try:
        cfg = TrainConfig.from_sets({}, [f"{key}={text}"])
    except ConfigError as e:
        assert key in str(e) and "\n" not in str(e)
    else:
        value = getattr(cfg, key)
        assert isinstance(value, float) and np.isfinite(value)


@settings(max_examples=30, deadline=None)
@given(seq_len=st.integers(1, 64), max_len=st.integers(1, 64))
def test_property_model_context_covers_the_training_length(seq_len, max_len):
    if max_len < seq_len:
        with pytest.raises(ConfigError, match="max_seq_len"):
            TrainConfig(seq_len=seq_len, model_overrides={"max_seq_len": max_len})
    else:
        assert TrainConfig(seq_len=seq_len, model_overrides={"max_seq_len": max_len}).model_config(300).max_seq_len == max_len


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                             max_size=60), min_size=2, max_size=8),
       seed=st.integers(0, 2**31), val=st.floats(0.05, 0.95))
def test_property_prepare_round_trips_every_document(tmp_path_factory, data_dir, docs, seed, val):
    """Any documents, seed and split: every non-empty document lands, decoded, in exactly one
    split; the streams verify and hold only ids of the vocabulary."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("prop")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    kept = [d for d in docs if d.strip()]
    try:
        prepare([str(src)], root / "d", tokenizer=data_dir / "tokenizer.json", val_fraction=val, seed=seed,
                progress=False)
    except GatedAttnError as e:
        assert len(kept) < 2 and "\n" not in str(e)  # too few documents to split: a clear error
        return
    data = TokenData(root / "d", verify=True)
    tok = Tokenizer.from_file(str(root / "d" / "tokenizer.json"))
    streams = np.concatenate([np.asarray(data.train), np.asarray(data.val)]).astype(np.int64)
    assert streams.max() < data.vocab_size
    pieces = [tok.decode(list(map(int, seg)), skip_special_tokens=False)
              for seg in np.split(streams, np.flatnonzero(streams == data.eos_id) + 1) if len(seg)]
    decoded = sorted(p.removesuffix(data.manifest.eos_token) for p in pieces)
    assert decoded == sorted(kept)


# ------------------------------------------------------------------------------ nothing a user owns is lost
def _texts(root: Path, n: int = 6) -> Path:
    rng = random.Random(3)
    texts = root / "texts"
    texts.mkdir(parents=True)
    for i in range(n):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(80)))
    return texts


@pytest.mark.parametrize("out", ["same", "parent", "child", "link"])
def test_prepare_never_replaces_its_input(tmp_path, capsys, out):
    texts = _texts(tmp_path / "docs")
    before = {p.name: p.read_bytes() for p in texts.iterdir()}
    (tmp_path / "link").symlink_to(texts, target_is_directory=True)
    target = {"same": texts, "parent": tmp_path / "docs", "child": texts / "sub", "link": tmp_path / "link"}[out]
    code = main(["data", "prepare", "-q", "--input", str(texts), "--out", str(target), "--force",
                 "--vocab-size", "300"])
    assert code == 2 and "may not overlap an input" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in texts.iterdir()} == before


def test_force_replaces_only_an_earlier_output(data_dir, tmp_path, capsys):
    texts = _texts(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["data", "prepare", "-q", "--input", str(texts), "--out", str(mine), "--force"]) == 2
    assert "not a data directory gatedattn wrote" in capsys.readouterr().err
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(mine), "--force"]) == 2
    assert "not a model directory gatedattn wrote" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"
    thesis = tmp_path / "thesis"  # a checksums.json of the user's own, listing the user's files
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    (thesis / CHECKSUMS).write_text(json.dumps({"thesis.tex": "0" * 64}))
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(thesis), "--force"]) == 2
    assert "not a model directory gatedattn wrote (no .gatedattn-output)" in capsys.readouterr().err
    assert (thesis / "thesis.tex").read_text() == "years of work"
    earlier = tmp_path / "converted"  # an earlier convert output ...
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(earlier)]) == 0
    (earlier / ".my-notes").write_text("hidden, but mine")  # ... with a dot-file of the user's in it
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(earlier), "--force"]) == 2
    assert "holds '.my-notes', which gatedattn did not write" in capsys.readouterr().err
    (earlier / ".my-notes").unlink()
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(earlier), "--force"]) == 0
    # an earlier data directory is replaced
    out = tmp_path / "data"
    prepare([str(texts)], out, vocab_size=300, progress=False)
    assert main(["data", "prepare", "-q", "--input", str(texts), "--out", str(out), "--force", "--seed", "3"]) == 0
    assert json.loads((out / "manifest.json").read_text())["seed"] == 3


_FINALS: dict[str, Path] = {}


def _final(data_dir: Path, tmp_path: Path) -> Path:
    """A trained model directory (``final/``), trained once per session."""
    if str(data_dir) not in _FINALS:
        run = data_dir.parent / "final_run"
        if not run.exists():
            train(cfg_for(data_dir, run, steps=1))
        _FINALS[str(data_dir)] = run / "final"
    return _FINALS[str(data_dir)]


def test_export_over_an_existing_directory_is_atomic(data_dir, tmp_path, monkeypatch):
    from gatedattn.hf import export_hf, load_model
    from gatedattn.hf import export as export_mod

    model = load_model(_final(data_dir, tmp_path))
    target = tmp_path / "hf"
    export_hf(model, target)
    (target / "README.md").write_text("mine")
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def fail(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(export_mod, "atomic_write_json", fail)  # the second file fails, after the weights
    with pytest.raises(OSError):
        export_hf(model, target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    load_model(target)
    export_hf(model, target)  # a second export keeps what it does not write, with its checksum entries
    assert (target / "README.md").read_text() == "mine"
    assert "config.json" in json.loads((target / CHECKSUMS).read_text())


def test_export_and_convert_refuse_what_a_load_would_refuse(data_dir, tmp_path):
    from gatedattn.hf import export_hf, load_model

    model = load_model(_final(data_dir, tmp_path))
    with torch.no_grad():
        model.norm.weight[0] = float("nan")
    with pytest.raises(GatedAttnError, match="non-finite"):
        export_hf(model, tmp_path / "nan")
    with pytest.raises(GatedAttnError, match="non-finite"):
        model.save_pretrained(tmp_path / "nan2")
    assert not (tmp_path / "nan").exists()


def test_hf_directories_are_verified_like_our_own(data_dir, tmp_path, capsys):
    from gatedattn.hf import load_model

    hf = tmp_path / "hf"
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(hf), "--format", "hf"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(json.loads((hf / CHECKSUMS).read_text()))
    load_model(hf)
    cfg = (hf / "config.json").read_text()
    (hf / "config.json").write_text(cfg.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    with pytest.raises(GatedAttnError, match="config.json: sha256 differs"):
        load_model(hf)
    (hf / "config.json").write_text(cfg)
    weights = hf / "model.safetensors"
    clean = weights.read_bytes()
    for pos in (20, len(clean) // 2, len(clean) - 1):
        b = bytearray(clean)
        b[pos] ^= 0x04
        weights.write_bytes(bytes(b))
        with pytest.raises(GatedAttnError, match="damaged"):
            load_model(hf)
    weights.write_bytes(clean)
    load_model(hf)


# ------------------------------------------------------------------------------ tokenizer identity
def test_a_swapped_tokenizer_is_refused_everywhere(data_dir, tmp_path, capsys):
    swapped = tmp_path / "data"
    shutil.copytree(data_dir, swapped)
    tok = json.loads((swapped / "tokenizer.json").read_text())
    tok["model"]["merges"] = tok["model"]["merges"][::-1]  # same size, other tokenizer
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GatedAttnError, match="not the tokenizer the streams were encoded with"):
        train(cfg_for(swapped, tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    assert main(["data", "info", str(swapped)]) == 2
    assert "tokenizer_sha256" in capsys.readouterr().err
    final = tmp_path / "final"
    shutil.copytree(_final(data_dir, tmp_path), final)
    shutil.copy(swapped / "tokenizer.json", final / "tokenizer.json")
    assert main(["generate", "--model", str(final), "--prompt", "the"]) == 2
    assert "tokenizer.json: sha256 differs" in capsys.readouterr().err
    assert main(["analyze", "--model", str(final), "--data", str(data_dir), "--force"]) == 2
    assert "tokenizer.json: sha256 differs" in capsys.readouterr().err


def test_a_resumed_run_refuses_data_with_another_tokenizer(data_dir, tmp_path):
    run = tmp_path / "run"
    train(cfg_for(data_dir, run, stop_at_step=2, ckpt_every=2))
    other = tmp_path / "other"
    texts = _texts(tmp_path)
    prepare([str(texts)], other, tokenizer=None, vocab_size=300, progress=False)
    with pytest.raises(GatedAttnError, match="different config"):
        train(cfg_for(other, run), resume=True)


def test_analysis_verifies_val_bin(data_dir, tmp_path, capsys):
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    b = bytearray((bad / "val.bin").read_bytes())
    b[3] ^= 0x20
    (bad / "val.bin").write_bytes(bytes(b))
    final = _final(data_dir, tmp_path)
    for cmd in (["analyze", "--batches", "1", "--batch-size", "1"], ["extrapolate", "--tokens", "32"]):
        assert main([*cmd, "--model", str(final), "--data", str(bad), "--device", "cpu"]) == 2
        assert "val.bin: sha256 differs" in capsys.readouterr().err


# ------------------------------------------------------------------------------ one writer per run
_HOLD = """
import sys, time
from gatedattn.infra.io import DirLock
DirLock(sys.argv[1], "run directory").acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_writer_of_a_run_is_refused_naming_the_first(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    train(cfg_for(data_dir, run, stop_at_step=2, ckpt_every=2))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["train", "--resume", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"in use by another gatedattn process (PID {holder.pid})" in err and len(err.strip().splitlines()) == 1
    finally:
        holder.kill()  # the kernel drops the lock with the process: no stale lock
        holder.wait()
    assert main(["train", "--resume", str(run), "--set", "stop_at_step=3"]) == 0
    assert not (run / ".gatedattn.lock").exists()


def test_a_second_reproduce_on_one_out_is_refused_before_any_work(data_dir, tmp_path, capsys):
    out = tmp_path / "repro"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["reproduce", "--quick", "--with-text", "--no-mechanism", "--data", str(data_dir), "--out", str(out),
                     "--steps", "1", "-q"]) == 2
        err = capsys.readouterr().err
        assert f"reproduce --out {out} is in use by another gatedattn process (PID {holder.pid})" in err
        assert sorted(p.name for p in out.iterdir()) == [".gatedattn.lock"]  # the holder's, nothing else
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_survives_its_file_being_recreated(tmp_path):
    from gatedattn.infra.io import DirLock

    first = DirLock(tmp_path / "d", "run directory").acquire()
    with pytest.raises(GatedAttnError, match=f"PID {os.getpid()}"):
        DirLock(tmp_path / "d", "run directory").acquire()
    first.release()
    assert (tmp_path / "d").is_dir() and not (tmp_path / "d" / ".gatedattn.lock").exists()
    second = DirLock(tmp_path / "d", "run directory").acquire()
    second.release()
    third = DirLock(tmp_path / "e", "run directory").acquire()  # a directory the lock created ...
    third.release(remove_empty_dir=True)
    assert not (tmp_path / "e").exists()  # ... goes with it when nothing was written there


# ------------------------------------------------------------------------------ debris
def test_temporaries_of_a_killed_prepare_are_removed_and_a_live_ones_kept(tmp_path):
    texts = _texts(tmp_path)
    out = tmp_path / "data"
    dead = tmp_path / ".data.k1ll3d.tmp"
    dead.mkdir()
    (dead / "train.bin").write_bytes(b"partial")
    live = tmp_path / ".data.l1ve.tmp"
    live.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(120)", str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = tmp_path / ".data.notours"  # not the project's naming: never touched
        mine.mkdir()
        prepare([str(texts)], out, vocab_size=300, progress=False)
        assert not dead.exists() and live.is_dir() and mine.is_dir()
    finally:
        holder.kill()
        holder.wait()


def test_train_writes_no_run_files_before_the_model_is_built(data_dir, tmp_path, monkeypatch):
    from gatedattn.train import trainer as trainer_mod

    real = trainer_mod.GatedLM

    def fail(*a, **k):
        raise GatedAttnError("no memory for the model")

    monkeypatch.setattr(trainer_mod, "GatedLM", fail)
    with pytest.raises(GatedAttnError, match="no memory"):
        train(cfg_for(data_dir, tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(trainer_mod, "GatedLM", real)
    assert train(cfg_for(data_dir, tmp_path / "run", steps=1)).complete  # the corrected rerun is accepted


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_run(data_dir, tmp_path, monkeypatch):
    from gatedattn.train.trainer import Trainer

    def fail(self):
        raise GatedAttnError("out of memory in the first step")

    monkeypatch.setattr(Trainer, "train_step", fail)
    run = tmp_path / "run"
    with pytest.raises(GatedAttnError, match="out of memory"):
        train(cfg_for(data_dir, run))
    assert not run.exists()
    monkeypatch.undo()
    assert train(cfg_for(data_dir, run, steps=1, micro_batch=1)).complete  # the corrected command, same --out


# ------------------------------------------------------------------------------ signals outside a training step
def _signal_during(monkeypatch, module, name, sig=signal.SIGTERM):
    """Make ``module.name`` send this process ``sig`` and go on (as a signal arriving there)."""
    real = getattr(module, name)

    def wrapped(*a, **k):
        os.kill(os.getpid(), sig)
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapped)


def test_sigterm_during_prepare_and_convert_is_one_line_and_leaves_nothing(data_dir, tmp_path, monkeypatch, capsys):
    from gatedattn.hf import export as export_mod

    prepare_mod = importlib.import_module("gatedattn.data.prepare")  # (the package exports a function of that name)

    texts = _texts(tmp_path)
    _signal_during(monkeypatch, prepare_mod, "_encode_documents")
    assert main(["data", "prepare", "-q", "--input", str(texts), "--out", str(tmp_path / "d"),
                 "--vocab-size", "300"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gatedattn data: SIGTERM:") and "run the same command again" in err[0]
    _signal_during(monkeypatch, export_mod, "atomic_save_safetensors", signal.SIGINT)
    assert main(["convert", "--from", str(_final(data_dir, tmp_path)), "--to", str(tmp_path / "c"),
                 "--format", "hf"]) == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SIGINT" in err[0] and "run the same command again" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts"]


def test_sigterm_during_analysis_and_the_first_evaluation(data_dir, tmp_path, monkeypatch, capsys):
    from gatedattn.train.trainer import Trainer

    _signal_during(monkeypatch, importlib.import_module("gatedattn.analysis.cli"), "analyze")  # as the command calls it
    final = _final(data_dir, tmp_path)
    assert main(["analyze", "--model", str(final), "--data", str(data_dir), "--device", "cpu", "--batches", "1",
                 "--out", str(tmp_path / "r.json")]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SIGTERM" in err[0] and not (tmp_path / "r.json").exists()
    _signal_during(monkeypatch, Trainer, "evaluate")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data_dir), "--out", str(run), *TRAIN_ARGS, "--set", "steps=2"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"continue with: gatedattn train --resume {run}" in err[0]
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0


# ------------------------------------------------------------------------------ modes and JSON
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_follow_the_umask(data_dir, tmp_path, umask):
    old = os.umask(umask)
    try:
        run = tmp_path / "run"
        train(cfg_for(data_dir, run, steps=1, ckpt_every=1))
        assert main(["convert", "--from", str(run / "final"), "--to", str(tmp_path / "hf"), "--format", "hf"]) == 0
    finally:
        os.umask(old)
    for p in [*run.rglob("*"), *(tmp_path / "hf").rglob("*"), tmp_path / "hf"]:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert p.stat().st_mode & 0o777 == want, p


def test_json_nesting_is_limited(tmp_path):
    from gatedattn.infra.io import MAX_JSON_DEPTH, read_json

    for depth, ok in ((MAX_JSON_DEPTH, True), (MAX_JSON_DEPTH + 1, False), (100000, False)):
        (tmp_path / "x.json").write_text("[" * depth + "]" * depth)
        if ok:
            read_json(tmp_path / "x.json")
        else:
            with pytest.raises(GatedAttnError, match="deeper than"):
                read_json(tmp_path / "x.json")


def test_generated_data_directories_record_their_tokenizer(tmp_path):
    from gatedattn.data.backcopy import BigramBackcopy

    gen = BigramBackcopy.from_text(" ".join(WORDS) * 40, n_chars=12)
    gen.write_data_dir(tmp_path / "bb", train_tokens=4000, val_tokens=800)
    TokenData(tmp_path / "bb", verify=True)
    assert json.loads((tmp_path / "bb" / "manifest.json").read_text())["tokenizer_sha256"] == \
        tokenizer_fingerprint(tmp_path / "bb" / "tokenizer.json")
    tok = json.loads((tmp_path / "bb" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[3:5]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two characters' ids swapped: same size, other text
    (tmp_path / "bb" / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GatedAttnError, match="tokenizer_sha256"):
        TokenData(tmp_path / "bb", verify=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_save_pretrained_over_a_model_survives_a_failed_write(tmp_path, monkeypatch):
    """A write that fails part-way (disk full on config.json) leaves the old model whole and
    loadable, with the other files of its directory."""
    from gatedattn import GatedLM, ModelConfig
    from gatedattn.models import lm as model_mod

    old = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64))
    target = old.save_pretrained(tmp_path / "m")
    (target / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    new = GatedLM(ModelConfig.from_preset("micro", "baseline", vocab_size=64))

    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_mod, "atomic_write_json", disk_full)
    with pytest.raises(OSError, match="No space left"):
        new.save_pretrained(target)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary left beside it
    assert GatedLM.from_pretrained(target).cfg.variant == "gated"
    new.save_pretrained(target)  # a write that succeeds replaces the model and keeps the tokenizer
    assert GatedLM.from_pretrained(target).cfg.variant == "baseline" and (target / "tokenizer.json").is_file()


# ------------------------------------------------------------------------------ a crash at any step of a replace
class _Crash(BaseException):
    """Raised by the fault hook where a kill would land."""


def _crash_image(monkeypatch, where: Path, image: Path, at: int, *, swap: bool):
    """A fault hook that, at its ``at``-th call, copies ``where`` (the directory of the output)
    to ``image`` as a SIGKILL at that moment would leave it (no cleanup runs there, no lock
    is held), then stops the writer. ``swap``: the one-step exchange, else the two-step
    rename; a write takes the same steps either way until it first tries the exchange, so
    the two-step variant counts (and kills at) only the steps from there on."""
    from gatedattn.infra import io
    from gatedattn.models.code import bundle_sources

    # the modelling code's files are written alike, one after another: a kill at the first or
    # the last of them stands for a kill at any (each of the rest is passed over)
    code = sorted(bundle_sources())
    alike = set(code[1:-1])
    calls = []
    tried = []  # the exchanges tried so far

    def hook(point, path):
        if Path(path).name in alike or (not swap and not tried):
            return
        calls.append(point)
        if len(calls) - 1 == at:
            shutil.copytree(where, image, symlinks=True)
            raise _Crash(point)

    def exchange(a, b):
        tried.append(b)
        return real_exchange(a, b) if swap else False

    real_exchange = io.exchange
    monkeypatch.setattr(io, "FAULT_HOOK", hook)
    monkeypatch.setattr(io, "exchange", exchange)
    return calls


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") and p.name != ".gatedattn.lock")


def _writers(data_dir: Path, tmp_path: Path):
    """(name, write(root, new: bool), load(root) -> a value telling old from new), for every
    writer that replaces an output: convert, data prepare, export, save_pretrained, checkpoints."""
    from gatedattn import GatedLM, ModelConfig
    from gatedattn.hf import export_hf, load_model
    from gatedattn.hf.cli import convert
    from gatedattn.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    final = _final(data_dir, tmp_path)
    texts = _texts(tmp_path / "corpus")
    model = load_model(final)
    small = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64))
    other = GatedLM(ModelConfig.from_preset("micro", "baseline", vocab_size=64))

    def saved_dtype(directory: Path) -> str:
        """Loads the model (verified), then tells the dtype it was saved in."""
        from safetensors import safe_open

        load_model(directory)
        with safe_open(directory / "model.safetensors", "pt") as f:
            return f.get_slice(next(iter(f.keys()))).get_dtype()

    def ckpt(root: Path, new: bool) -> None:
        step = 2 if new else 1
        state = {"step": step, "tokens": 0, "losses": [], "optimizer": {}, "rng": ckpt_mod.rng_state()}
        save_checkpoint(root / "run", step, small.state_dict(), small.cfg, state, {"tokens": 0, "run": {}})

    return [
        ("convert", lambda root, new: convert(final, root / "out", force=True, dtype="float32" if new else "float16"),
         lambda root: saved_dtype(root / "out")),
        ("prepare", lambda root, new: prepare([str(texts)], root / "out", vocab_size=300, seed=int(new),
                                              overwrite=True, progress=False),
         lambda root: TokenData(root / "out", verify=True).manifest.seed),
        ("export", lambda root, new: export_hf(model if new else load_model(final, dtype=torch.float16), root / "out"),
         lambda root: saved_dtype(root / "out")),
        ("save_pretrained", lambda root, new: (other if new else small).save_pretrained(root / "out"),
         lambda root: GatedLM.from_pretrained(root / "out").cfg.variant),
        ("checkpoint", ckpt, lambda root: load_checkpoint(latest_checkpoint(root / "run"))[1]["step"]),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-step"])
def test_a_crash_at_any_step_of_a_replace_keeps_an_output_whole(data_dir, tmp_path, monkeypatch, swap):
    """For every writer that replaces an output, a kill at each step of the write (each file
    written, the swap, the rename aside, the rename in) leaves the previous output (or, once
    it is in place, the new one) loadable; the next run of the writer succeeds and leaves
    no temporaries beside it. (What a kill leaves does not depend on fsync: the page cache
    outlives the process. The writers' fsyncs are skipped here.)"""
    with pytest.MonkeyPatch.context() as no_fsync:  # kept across the monkeypatch.undo() below
        no_fsync.setattr(os, "fsync", lambda fd: None)
        for name, write, load in _writers(data_dir, tmp_path):
            _crash_at_every_step(monkeypatch, tmp_path, name, write, load, swap)


def _crash_at_every_step(monkeypatch, tmp_path: Path, name: str, write, load, swap: bool) -> None:
    root = tmp_path / name
    root.mkdir()
    write(root, False)
    old = load(root)
    new_value = None
    for at in range(64):
        image = tmp_path / f"{name}-crash-{at}"
        calls = _crash_image(monkeypatch, root, image, at, swap=swap)
        try:
            write(root, True)
        except _Crash:
            pass
        else:  # the write passed every fault point: done
            monkeypatch.undo()
            new_value = load(root)
            write(root, False)  # back to the previous output, for the next round's runs
            break
        finally:
            monkeypatch.undo()
        point = calls[-1]
        got = load(image)
        if point in ("replace:swapped", "replace:placed") and name != "checkpoint":  # (its pointer comes last)
            assert got != old, (name, point)  # the new output is in place and whole
        else:
            assert got == old, (name, point)
        write(image, True)
        assert load(image) != old, (name, point)
        out = image / ("run/checkpoints" if name == "checkpoint" else "")
        assert not _leftovers(out), (name, point, _leftovers(out))
        shutil.rmtree(image)
    assert new_value is not None and new_value != old, name
    assert {"replace:swapped" if swap else "replace:aside"} <= set(calls) or name == "checkpoint", (name, calls)
    assert load(root) == old and not _leftovers(root)


_KILL_BETWEEN_RENAMES = """
import os, signal, sys
from gatedattn.infra import io
io.exchange = lambda a, b: False  # the two-step rename (file systems without RENAME_EXCHANGE)
io.FAULT_HOOK = lambda point, path: point == "replace:aside" and os.kill(os.getpid(), signal.SIGKILL)
from gatedattn.cli import main
main(["convert", "--from", sys.argv[1], "--to", sys.argv[2], "--force", "--dtype", "float16"])
"""


@pytest.mark.slow
def test_a_sigkill_between_the_renames_of_convert_loses_nothing(data_dir, tmp_path, capsys):
    """A real SIGKILL between moving the old --to aside and renaming the new one in: the old
    copy is put back by the next command on the path (a load, or the rerun), never removed."""
    from gatedattn.hf import load_model

    final, dst = _final(data_dir, tmp_path), tmp_path / "converted"
    assert main(["convert", "--from", str(final), "--to", str(dst)]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", _KILL_BETWEEN_RENAMES, str(final), str(dst)], env=env)
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".old")]
    load_model(dst)  # the old copy is back
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert main(["convert", "--from", str(final), "--to", str(dst), "--force"]) == 0
    load_model(dst)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the killed run's partial copy too


# ------------------------------------------------------------------------------ a full disk
def _enospc_on(name: str, message: str | None = None):
    """A write hook raising what a full disk raises when ``name`` is written (``message``:
    as PyTorch's own writer words it, a RuntimeError)."""
    import errno

    def hook(point, path):
        if point == "write" and path.name == name:
            if message is not None:
                raise RuntimeError(message)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    return hook


@pytest.mark.parametrize("message", [None, "[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                                           "failed writing file data/0: file write failed"], ids=["oserror", "torch"])
def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_earlier_checkpoint_resumes(data_dir, tmp_path, capsys,
                                                                                      monkeypatch, message):
    from gatedattn.infra import io

    run = tmp_path / "run"
    args = ["train", "--data", str(data_dir), "--out", str(run), *TRAIN_ARGS, "--set", "steps=4",
            "--set", "ckpt_every=2"]
    writes = []

    def full_at_second(point, path):
        if point == "write" and path.name == "trainer_state.pt":
            writes.append(path)
            if len(writes) == 2:
                _enospc_on("trainer_state.pt", message)(point, path)

    monkeypatch.setattr(io, "FAULT_HOOK", full_at_second)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer_state.pt: the disk is full" in err[0] and "Traceback" not in err[0], err
    monkeypatch.undo()
    assert ckpt_mod.latest_checkpoint(run).name == "step_00000002"  # nothing half-written is taken for a checkpoint
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")] == ["step_00000002"]
    assert main(["train", "--resume", str(run)]) == 0
    assert ckpt_mod.latest_checkpoint(run).name == "step_00000004"


def test_a_checkpoint_too_large_for_the_free_space_is_refused_before_it_is_written(tmp_path, monkeypatch):
    from gatedattn import GatedLM, ModelConfig
    from gatedattn.infra import io

    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64))
    state = {"step": 1, "tokens": 0, "losses": [], "optimizer": {}, "rng": ckpt_mod.rng_state()}
    monkeypatch.setattr(io, "free_bytes", lambda path: 1000)
    with pytest.raises(GatedAttnError, match=r"step_00000001: the disk is full \(needs [\d,]+ bytes, 1,000 bytes free"):
        ckpt_mod.save_checkpoint(tmp_path, 1, model.state_dict(), model.cfg, state, {"run": {}})
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").iterdir())


def test_a_full_disk_during_prepare_is_one_line_and_keeps_the_earlier_data(tmp_path, capsys, monkeypatch):
    from gatedattn.infra import io

    prepare_mod = importlib.import_module("gatedattn.data.prepare")
    texts, out = _texts(tmp_path), tmp_path / "data"
    prepare([str(texts)], out, vocab_size=300, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv = ["data", "prepare", "-q", "--input", str(texts), "--out", str(out), "--force", "--vocab-size", "300"]

    def tokenizer_disk_full(*a, **k):
        raise Exception("No space left on device (os error 28)")  # the tokenizers library's own error

    def manifest_disk_full(self, path):
        raise OSError(28, "No space left on device", str(path))

    for setup in (lambda: monkeypatch.setattr(prepare_mod, "_train_into", tokenizer_disk_full),
                  lambda: monkeypatch.setattr(prepare_mod.Manifest, "save", manifest_disk_full),
                  lambda: monkeypatch.setattr(io, "free_bytes", lambda path: 0)):
        setup()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the disk is full" in err[0], err
        monkeypatch.undo()
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "texts"]


def test_an_input_that_changes_between_the_passes_of_prepare_is_refused(tmp_path, capsys, monkeypatch):
    """prepare reads its inputs three times; a file rewritten or grown in between is refused,
    and nothing is written."""
    prepare_mod = importlib.import_module("gatedattn.data.prepare")
    texts = _texts(tmp_path)
    train_into = prepare_mod._train_into

    def grow_then_train(*args, **kw):
        with open(texts / "d0.txt", "a") as f:
            f.write(" more words appended while the tokenizer trains")
        return train_into(*args, **kw)

    monkeypatch.setattr(prepare_mod, "_train_into", grow_then_train)
    code = main(["data", "prepare", "-q", "--input", str(texts), "--out", str(tmp_path / "data"), "--vocab-size", "300"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "d0.txt changed while it was being read" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts"]


# ------------------------------------------------------------------------------ interrupts and smaller items
def test_an_interrupt_that_a_reader_wrapped_is_still_an_interrupt(capsys, monkeypatch):
    """A Ctrl-C that lands inside code turning errors into messages (a tokenizer read, an
    import hit by a second Ctrl-C) ends as the interrupt: one line, exit 130, not exit 2."""
    from gatedattn import cli

    def wrapped(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise GatedAttnError("tokenizer.json is not a valid tokenizer.json (KeyboardInterrupt)") from None

    def import_hit(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("cannot import name 'pyplot' from partially initialized module 'matplotlib'")

    for func in (wrapped, import_hit):
        monkeypatch.setattr(cli, "build_parser", lambda command: _parser_running(func))
        assert cli.main(["analyze"]) == 130
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["gatedattn analyze: interrupted"], err


def _parser_running(func):
    import argparse

    parser = argparse.ArgumentParser(prog="gatedattn")
    parser.add_argument("command")
    parser.set_defaults(func=func)
    return parser


def test_an_interrupt_before_a_run_wrote_anything_advises_the_same_command(data_dir, tmp_path, capsys, monkeypatch):
    from gatedattn.train import loop

    def stop(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises here

    monkeypatch.setattr(loop, "Trainer", stop)
    run = tmp_path / "run"
    assert main(["train", "--data", str(data_dir), "--out", str(run), *TRAIN_ARGS, "--set", "steps=2"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run the same command again" in err[0] and "--resume" not in err[0], err


def test_outputs_with_names_near_the_limit_are_written(tmp_path, capsys):
    texts = _texts(tmp_path)
    out = tmp_path / ("d" * 250)
    assert main(["data", "prepare", "-q", "--input", str(texts), "--out", str(out), "--vocab-size", "300"]) == 0
    assert TokenData(out, verify=True).manifest.vocab_size > 0
    assert main(["data", "prepare", "-q", "--input", str(texts), "--out", str(out), "--vocab-size", "300",
                 "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["texts", out.name])


def test_a_prompt_is_text_as_in_data_prepare(data_dir, tmp_path):
    """Special-token text typed in a prompt is encoded as text (as prepare encodes documents),
    and UTF-8 that a C locale passed as surrogates is read as UTF-8."""
    from gatedattn.hf.cli import generate_text
    from gatedattn.infra.io import argv_text

    assert argv_text("caf\udcc3\udca9") == "café" and argv_text("the \udcff gate") == "the \udcff gate"
    final = _final(data_dir, tmp_path)
    eos = TokenData(data_dir).manifest.eos_token
    text = generate_text(final, f"the {eos} gate", max_new_tokens=0, temperature=0)
    assert text == f"the {eos} gate"  # not dropped as a special id when decoded
