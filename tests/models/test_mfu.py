"""Model FLOPs, the measured peak and its cache, MFU in the trainer's records (gatedattn.models.mfu)."""

import json
import random

import pytest
import torch

from gatedattn.models import mfu
from gatedattn.layers.config import AttentionConfig
from gatedattn.models.lm import ModelConfig


def tiny_model(**kw) -> ModelConfig:
    att = AttentionConfig(d_model=8, n_heads=2, **kw)  # head_dim 4, no biases
    return ModelConfig(vocab_size=32, n_layers=2, attention=att, ffn_dim=16, max_seq_len=4)


def test_flops_per_token_match_a_hand_count():
    T = 4
    pairs = T * (T + 1) // 2  # causal (query, key) pairs: 10
    projections = 4 * 2 * 8 * 8 * T  # q, k, v, o: 8 x 8 each, a multiply-add is 2 FLOPs
    attention = 2 * 2 * pairs * (4 + 4) + 3 * 2 * pairs  # QK^T and PV per head, 3 softmax steps per pair
    mlp = 3 * 2 * 8 * 16 * T  # SwiGLU: gate, up, down
    head = 2 * 8 * 32 * T
    forward = 2 * (projections + attention + mlp) + head
    assert forward == 13048
    assert mfu.forward_flops(tiny_model(), T) == forward
    assert mfu.train_flops_per_token(tiny_model(), T) == 3 * forward / T
    # a sink adds 3 FLOPs per head and row to the attention layer
    assert mfu.forward_flops(tiny_model(sink=True), T) == forward + 2 * 3 * 2 * T
    # a two-matrix MLP (OPT / GPT-2) has two products, not three
    assert mfu.forward_flops(tiny_model().replace(mlp="relu"), T) == forward - 2 * 2 * 8 * 16 * T
    with pytest.raises(ValueError, match="seq_len"):
        mfu.forward_flops(tiny_model(), 0)


def test_mfu_is_achieved_over_peak():
    assert mfu.mfu(25.0, 100.0) == 0.25
    assert mfu.mfu(25.0, None) is None and mfu.mfu(None, 100.0) is None
    assert mfu.mfu(25.0, 0.0) is None and mfu.mfu(float("nan"), 100.0) is None
    peak = mfu.Peak(1000.0, "fp32", "k", measured=False)
    assert mfu.speed_fields(10.0, 20.0, peak) == {"model_flops_per_s": 200.0, "mfu": 0.2}
    assert mfu.speed_fields(10.0, 20.0, peak, devices=2)["mfu"] == 0.1  # tokens/s over two devices
    assert mfu.speed_fields(10.0, 20.0, None)["mfu"] is None


class FakeTimer:
    """Seconds of an n x n product at ``rate`` FLOP/s; counts its calls."""

    def __init__(self, rate: float = 1e9):
        self.rate, self.calls = rate, []

    def __call__(self, n, dtype, device):
        self.calls.append((n, dtype))
        return 2 * n**3 / self.rate


def test_measured_peak_is_the_best_rate_and_stays_short():
    timer = FakeTimer(1e12)  # 1 TFLOP/s: products of every size are quick
    assert mfu.measure_peak_flops("fp32", timer=timer) == pytest.approx(1e12)
    assert [n for n, _ in timer.calls] == list(mfu.SIZES[:len(timer.calls)])
    spent = sum((mfu.TIMED + 1) * 2 * n**3 / 1e12 for n, _ in timer.calls)
    assert spent < 1.0  # well under a second of products
    slow = FakeTimer(1e9)  # a 256 product takes 34 ms: the next size would take too long
    assert mfu.measure_peak_flops("bf16", timer=slow) == pytest.approx(1e9)
    assert slow.calls == [(256, "bf16")]
    with pytest.raises(ValueError, match="dtype='fp16' is not allowed; choose one of fp32, bf16"):
        mfu.measure_peak_flops("fp16", timer=slow)


def test_peak_is_cached_per_machine_key(tmp_path):
    path = tmp_path / "cache" / "peak_flops.json"
    timer = FakeTimer(5e10)
    first = mfu.peak_flops("fp32", path=path, timer=timer)
    assert first.measured and first.flops_per_s == pytest.approx(5e10) and timer.calls
    n_calls = len(timer.calls)
    second = mfu.peak_flops("fp32", path=path, timer=timer)
    assert len(timer.calls) == n_calls  # not timed again
    assert not second.measured and second.flops_per_s == first.flops_per_s and second.key == first.key
    bf16 = mfu.peak_flops("bf16", path=path, timer=FakeTimer(2e11))  # another dtype: another key
    assert bf16.measured and bf16.flops_per_s == pytest.approx(2e11)
    saved = json.loads(path.read_text())
    assert saved["schema"] == mfu.SCHEMA and set(saved["peaks"]) == {first.key, bf16.key}
    key = mfu.machine_key("fp32")
    assert key == first.key and f"threads {torch.get_num_threads()}" in key and torch.__version__ in key
    assert key.endswith("|fp32") and key != mfu.machine_key("bf16")


def test_retiming_can_only_raise_the_cached_peak(tmp_path):
    """A peak first timed on a busy machine is too low (every MFU too high); ``retime``
    (what bench does) keeps the higher of the cached and the new timing."""
    path = tmp_path / "peak_flops.json"
    busy = mfu.peak_flops("fp32", path=path, timer=FakeTimer(2e10))
    idle = mfu.peak_flops("fp32", path=path, timer=FakeTimer(5e10), retime=True)
    assert idle.measured and idle.flops_per_s == pytest.approx(5e10) and busy.flops_per_s == pytest.approx(2e10)
    again = mfu.peak_flops("fp32", path=path, timer=FakeTimer(3e10), retime=True)  # busy again
    assert not again.measured and again.flops_per_s == pytest.approx(5e10)
    assert mfu.peak_flops("fp32", path=path, timer=FakeTimer(1e12)).flops_per_s == pytest.approx(5e10)  # cached


@pytest.mark.parametrize("content", ["{not json", '{"schema": "gatedattn-peak-flops/1", "peaks": []}',
                                     '{"schema": "other", "peaks": {}}', "[1, 2]", ""])
def test_a_corrupt_cache_is_ignored_and_rewritten(tmp_path, content):
    path = tmp_path / "peak_flops.json"
    path.write_text(content)
    timer = FakeTimer(3e10)
    peak = mfu.peak_flops("fp32", path=path, timer=timer)
    assert peak.measured and timer.calls
    assert json.loads(path.read_text())["peaks"][peak.key]["flops_per_s"] == pytest.approx(3e10)


def test_a_bad_entry_is_measured_again_and_other_entries_kept(tmp_path):
    path = tmp_path / "peak_flops.json"
    key = mfu.machine_key("fp32")
    path.write_text(json.dumps({"schema": mfu.SCHEMA, "peaks": {key: {"flops_per_s": -1},
                                                                 "other|machine": {"flops_per_s": 7.0}}}))
    peak = mfu.peak_flops("fp32", path=path, timer=FakeTimer(3e10))
    assert peak.measured and peak.flops_per_s == pytest.approx(3e10)
    assert json.loads(path.read_text())["peaks"]["other|machine"] == {"flops_per_s": 7.0}


def test_an_unwritable_cache_still_gives_a_peak(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    peak = mfu.peak_flops("fp32", path=blocker / "peak_flops.json", timer=FakeTimer(4e10))
    assert peak.measured and peak.flops_per_s == pytest.approx(4e10)


def test_cache_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "c"))
    monkeypatch.delenv("GATEDATTN_PEAK_CACHE", raising=False)
    assert mfu.cache_path() == tmp_path / "c" / "peak_flops.json"
    monkeypatch.setenv("GATEDATTN_PEAK_CACHE", str(tmp_path / "peaks.json"))  # a file of its own wins
    assert mfu.cache_path() == tmp_path / "peaks.json"


# ----------------------------------------------------------------------------- in the trainer
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from gatedattn.data import prepare

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = "the cat sat on a mat while dogs ran over hills and birds sang in tall trees".split()
    texts = root / "texts"
    texts.mkdir()
    for i in range(30):
        (texts / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(200)) + "\n")
    prepare([str(texts)], root / "data", vocab_size=300, val_fraction=0.1, progress=False)
    return root / "data"


def test_train_records_carry_model_flops_and_mfu(data_dir, tmp_path, monkeypatch):
    from gatedattn.data import TokenData
    from gatedattn.train import TrainConfig, train

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))

    monkeypatch.delenv("GATEDATTN_PEAK_CACHE", raising=False)
    monkeypatch.setattr(mfu, "_time_matmul", FakeTimer(1e11))
    cfg = TrainConfig(data_dir=str(data_dir), out_dir=str(tmp_path / "run"), preset="micro", variant="sink",
                      seq_len=32, micro_batch=2, steps=3, warmup_steps=1, eval_batches=1, eval_every=0,
                      ckpt_every=0, log_every=1, progress=False, tensorboard=False, dtype="fp32")
    train(cfg)
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    data = TokenData(str(data_dir))
    per_token = mfu.train_flops_per_token(cfg.model_config(data.vocab_size, data.bos_id, data.eos_id), 32)
    for r in steps:
        assert r["peak_flops_per_s"] == pytest.approx(1e11)
        assert r["model_flops_per_s"] == pytest.approx(per_token * r["tokens_per_s"])
        assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / 1e11)
    assert (tmp_path / "cache" / "peak_flops.json").is_file()
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("step,tokens,loss,lr,grad_norm,tokens_per_s,model_flops_per_s,mfu,")


def test_speed_meter_leaves_mfu_empty_when_no_peak_can_be_timed(monkeypatch, tmp_path):
    from gatedattn.train.metrics import SpeedMeter

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))

    monkeypatch.delenv("GATEDATTN_PEAK_CACHE", raising=False)

    def broken(n, dtype, device):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(mfu, "_time_matmul", broken)
    said = []
    meter = SpeedMeter.measure(tiny_model(), 4, "fp32", "cpu", warn=said.append)
    assert meter.peak is None and "no kernel" in said[0]
    assert meter.fields(10.0) == {"model_flops_per_s": pytest.approx(10.0 * 3 * 13048 / 4), "mfu": None,
                                  "peak_flops_per_s": None}
    assert meter.postfix(10.0) == "?"
    meter = SpeedMeter(100.0, mfu.Peak(1e4, "fp32", "k", False))
    assert meter.postfix(25.0) == "25.0%"


def test_reproduction_step_time_carries_mfu():
    from gatedattn.reproduce.report import _mfu_note

    assert _mfu_note({"mfu": 0.1234, "model_flops_per_s": 1.0}) == " (MFU 12.3 %)"
    assert _mfu_note(None) == "" and _mfu_note({"mfu": None}) == ""
