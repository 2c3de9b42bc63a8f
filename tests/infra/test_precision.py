"""dtype='auto': bf16 autocast only where the device computes bf16 natively."""

import json

import pytest
import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.precision import EMULATED_RATIO, Precision, cpu_native_bf16, resolve_dtype

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}


@pytest.mark.parametrize("flags, native", [
    (AVX2, False),
    (AVX512, False),                      # AVX-512 without the bf16 extension still emulates bf16
    (AVX512 | {"avx512_bf16"}, True),
    (AVX2 | {"amx_bf16", "amx_tile"}, True),
    (frozenset(), False),                 # unknown flags: fp32 is the safe choice
])
def test_cpu_native_bf16_reads_the_flags(flags, native):
    got, reason = cpu_native_bf16(flags, timing=(1.0, 0.3))
    assert got is native
    assert reason


def test_bf16_flags_but_emulated_kernels_mean_fp32():
    """ATEN_CPU_CAPABILITY=avx2 on an AVX512-BF16 CPU: the timing shows bf16 is emulated."""
    got, reason = cpu_native_bf16(AVX512 | {"avx512_bf16"}, timing=(0.001, 0.04))
    assert not got and "emulated" in reason


def test_a_busy_machines_timing_does_not_flip_native_bf16_to_fp32():
    """Native bf16 is about 4x faster than fp32; a timing disturbed by other work (bf16 2x
    slower by chance) still reads native, and only an emulated path's tens-of-times gap
    reads emulated."""
    flags = AVX512 | {"amx_bf16"}
    assert cpu_native_bf16(flags, timing=(0.0004, 0.0008))[0]
    assert cpu_native_bf16(flags, timing=(0.0004, 0.0004 * EMULATED_RATIO))[0]
    assert not cpu_native_bf16(flags, timing=(0.0004, 0.0004 * EMULATED_RATIO * 1.01))[0]


def test_the_matmul_timing_runs_on_one_thread_and_gives_the_threads_back(monkeypatch):
    """With several threads, a core another process holds stalls every product at the
    threads' barrier and can time fp32 as slowly as emulated bf16: the timing runs on one."""
    import time

    from gatedattn.infra import precision

    seen = []
    clock = time.perf_counter
    monkeypatch.setattr(precision.time, "perf_counter", lambda: seen.append(torch.get_num_threads()) or clock())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fp32_s, bf16_s = precision.matmul_timing.__wrapped__(repeats=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    assert fp32_s > 0 and bf16_s > 0


def test_emulated_avx2_machine_resolves_to_fp32():
    """A real AVX2-only run (forced through the environment) picks fp32 by measurement."""
    import subprocess
    import sys

    code = "from gatedattn.infra.precision import resolve_dtype; p = resolve_dtype('auto', 'cpu'); print(p.dtype)"
    env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "fp32", out.stderr


def test_requested_dtypes_are_kept():
    assert resolve_dtype("fp32", "cpu") == Precision("fp32", "requested")
    assert resolve_dtype("bf16", "cpu") == Precision("bf16", "requested")


def test_auto_on_this_cpu_follows_its_flags():
    native, _ = cpu_native_bf16()
    p = resolve_dtype("auto", "cpu")
    assert p.dtype == ("bf16" if native else "fp32")
    assert p.reason and json.loads(json.dumps(p.as_dict())) == {"dtype": p.dtype, "reason": p.reason}


def test_bad_dtype_names_the_field_and_choices():
    with pytest.raises(GatedAttnError, match=r"dtype: 'fp16' is not one of auto, fp32, bf16"):
        resolve_dtype("fp16")


def test_autocast_context():
    x = torch.randn(4, 4)
    with resolve_dtype("bf16").autocast("cpu"):
        assert (x @ x).dtype == torch.bfloat16
    with resolve_dtype("fp32").autocast("cpu"):
        assert (x @ x).dtype == torch.float32


def test_train_records_the_resolved_precision(tmp_path):
    from gatedattn.train.rundir import ENV, write_run_files

    write_run_files(tmp_path, {"x": 1}, torch.device("cpu"), 1, resolve_dtype("auto", "cpu").as_dict())
    env = json.loads((tmp_path / ENV).read_text())
    assert env["precision"]["dtype"] in ("fp32", "bf16")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
