"""Every size option of analyze, extrapolate and generate is checked against the memory
its command would allocate before any window is built or any weight read: a huge value
is refused in one line naming the option, the estimate and the limit; a normal one passes."""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from pathlib import Path

import pytest
import torch

from gatedattn import cli
from gatedattn.infra import sizes
from gatedattn.infra.errors import GatedAttnError

WORDS = "the gate sink softmax token layer head query key value attention model loss".split()


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    """A prepared data directory and a micro model of its vocabulary (no tokenizer of its own)."""
    from gatedattn.data import prepare
    from gatedattn.models.lm import GatedLM, ModelConfig

    root = tmp_path_factory.mktemp("sizes")
    rng = random.Random(0)
    with open(root / "docs.jsonl", "w", encoding="utf-8") as f:
        for _ in range(30):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(100))}) + "\n")
    data = root / "data"
    manifest = prepare([root / "docs.jsonl"], data, vocab_size=300, val_fraction=0.3, progress=False)
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=manifest.vocab_size,
                                            bos_token_id=manifest.bos_id))
    model.save_pretrained(root / "model")
    return {"root": root, "data": data, "model": root / "model", "tokenizer": data / "tokenizer.json"}


class Reached(GatedAttnError):
    """The command got past its size checks to reading the model."""


@pytest.fixture
def no_loading(monkeypatch):
    """Reading the weights ends the command: a case that gets there passed its checks."""
    analyze_mod = importlib.import_module("gatedattn.analysis.analyze")
    load_mod = importlib.import_module("gatedattn.hf.load")

    def reached(*args, **kwargs):
        raise Reached("reached the weights")

    for module in (analyze_mod, importlib.import_module("gatedattn.analysis.cli")):
        monkeypatch.setattr(module, "load_any", reached)
    for module in (load_mod, importlib.import_module("gatedattn.hf.cli")):
        monkeypatch.setattr(module, "load_model", reached)


def run(capsys, *argv) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def commands(fx) -> dict[str, list]:
    return {
        "analyze": ["analyze", "--model", fx["model"], "--data", fx["data"], "--device", "cpu",
                    "--batches", 1, "--batch-size", 2, "--seq-len", 16],
        "extrapolate": ["extrapolate", "--model", fx["model"], "--data", fx["data"], "--device", "cpu",
                        "--batch-size", 2, "--train-len", 16, "--multiples", "1,2"],
        "generate": ["generate", "--model", fx["model"], "--tokenizer", fx["tokenizer"], "--prompt", "the gate",
                     "--max-new-tokens", 4],
    }


def with_value(argv: list, flag: str, value) -> list:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


HUGE = [("analyze", "--batch-size", 10**9), ("analyze", "--seq-len", 10**7), ("analyze", "--batches", 10**13),
        ("extrapolate", "--batch-size", 10**9), ("extrapolate", "--train-len", 10**9),
        ("extrapolate", "--multiples", "1,1e9")]


@pytest.mark.parametrize("command, flag, value", HUGE)
def test_a_huge_size_option_is_refused_before_any_work(fx, capsys, no_loading, command, flag, value):
    code, err = run(capsys, *with_value(commands(fx)[command], flag, value))
    assert code == 2 and len(err) == 1, err
    line = err[0]
    assert line.startswith(f"gatedattn {command}: error: ") and f"{flag} " in line, line
    assert "needs at least" in line and "available: lower" in line, line
    assert "reached the weights" not in line


@pytest.mark.parametrize("command", ["analyze", "extrapolate", "generate"])
def test_normal_sizes_pass_the_check(fx, capsys, no_loading, command):
    code, err = run(capsys, *commands(fx)[command])
    assert code == 2 and err == [f"gatedattn {command}: error: reached the weights"], err


def test_max_new_tokens_beyond_the_context_or_the_memory_is_refused(fx, capsys, no_loading, monkeypatch):
    from gatedattn.hf.load import load_config

    cfg = load_config(fx["model"])
    gen = commands(fx)["generate"]
    code, err = run(capsys, *with_value(gen, "--max-new-tokens", 10**12))
    assert code == 2 and err == [f"gatedattn generate: error: --max-new-tokens {10**12} exceeds the model's context "
                                 f"of {cfg.max_seq_len} tokens"], err
    # memory for the weights and 10 positions of KV cache: 4 new tokens fit, the whole context does not
    weights, per_token = 4 * sizes.model_params(cfg), sizes.kv_cache_bytes_per_token(cfg)
    monkeypatch.setattr(sizes, "device_memory", lambda device="cpu": weights + 10 * per_token)
    assert run(capsys, *gen) == (2, ["gatedattn generate: error: reached the weights"])
    code, err = run(capsys, *with_value(gen, "--max-new-tokens", cfg.max_seq_len))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"gatedattn generate: error: --max-new-tokens {cfg.max_seq_len}: decoding needs at "
                             f"least"), err
    assert "KV cache" in err[0] and "lower --max-new-tokens" in err[0], err


@pytest.mark.parametrize("attention", [dict(n_kv_heads=2), dict(kv="mla", qk_norm=False)])
def test_the_kv_cache_estimate_is_what_the_caches_hold(attention):
    """The per-token estimate equals the bytes that decoding's caches hold (measured)."""
    from gatedattn.bench.kvcache import cache_bytes_per_token
    from gatedattn.layers.config import MLAConfig
    from gatedattn.models.lm import GatedLM, ModelConfig

    cfg = ModelConfig.from_preset("micro", "gated", vocab_size=50)
    if attention.get("kv") == "mla":
        attention = {**attention, "n_kv_heads": cfg.attention.n_heads, "mla": MLAConfig(kv_rank=24, rope_dim=8)}
    cfg = dataclasses.replace(cfg, attention=cfg.attention.replace(**attention))
    measured = cache_bytes_per_token(GatedLM(cfg), prompt=5, steps=3)
    assert sizes.kv_cache_bytes_per_token(cfg) == measured["bytes_per_token"]


def test_check_memory_names_the_options_the_estimate_and_the_limit(monkeypatch):
    monkeypatch.setattr(sizes, "device_memory", lambda device="cpu": 3 << 30)
    sizes.check_memory("the analysis", {"logits": 2 << 30, "windows": 1 << 30}, {"--batch-size": 8})
    with pytest.raises(GatedAttnError) as e:
        sizes.check_memory("the analysis", {"logits": 3 << 30, "windows": 1 << 30},
                           {"--batch-size": 8, "--seq-len": 512})
    assert str(e.value) == ("--batch-size 8, --seq-len 512: the analysis needs at least 4.0 GB (logits 3.0 GB, "
                            "windows 1.0 GB); this cpu has 3.0 GB available: lower --batch-size or --seq-len")


@pytest.mark.parametrize("bench", ["--real-model", "--decode"])
@pytest.mark.parametrize("flag, low", [("--repeats", 1), ("--warmup", 0)])
def test_real_model_bench_rounds_are_bounded_before_the_model_is_read(tmp_path, capsys, no_loading, flag, low, bench):
    code, err = run(capsys, "bench", bench, tmp_path / "missing", flag, 10**12)
    assert code == 2 and err == [f"gatedattn bench: error: {flag} must be an integer in [{low}, 10,000], "
                                 f"got {10**12}"], err


@pytest.mark.parametrize("flag, value", [("--batch-size", 10**9), ("--seq-len", 10**8)])
def test_a_study_too_large_to_train_is_refused_before_its_data_or_output(tmp_path, capsys, flag, value):
    out = tmp_path / "study"
    code, err = run(capsys, "reproduce", "--study", "text", flag, value, "--out", out)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("gatedattn reproduce: error: --batch-size ") and f"{flag} {value}" in err[0], err
    assert "this run needs at least" in err[0], err
    assert not out.exists()


def test_every_study_trains_within_memory_at_its_defaults():
    from gatedattn.reproduce.cli import _train_configs, check_training_sizes
    from gatedattn.reproduce.studies import STUDIES

    from gatedattn.reproduce.main_job import ReproduceConfig
    from gatedattn.reproduce.text.config import TextConfig

    recipes = 0
    for study in STUDIES.values():
        for cfg in (study.config(), study.config.quick()):
            check_training_sizes(cfg)
            recipes += len(_train_configs(cfg))
    assert recipes >= 6  # text, lr and rank, each at its defaults and quick (the default main job trains none)
    with_text = ReproduceConfig(text=TextConfig())  # the main job's natural-text part (--with-text)
    check_training_sizes(with_text)
    assert len(_train_configs(with_text)) >= 1
