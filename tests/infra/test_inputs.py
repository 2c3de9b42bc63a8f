"""Every command-line option that names an input refuses a FIFO, a device and a loop of
symbolic links before anything opens it (one line naming the option), and an input that
changed while the command read it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from gatedattn import cli
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.inputs import check_arguments, check_input, input_options

# option -> the command line naming X as its value (the other paths need not exist: the
# input check comes before anything else)
OPTIONS = {
    "data prepare --input": ["data", "prepare", "-q", "--input", "X", "--out", "OUT"],
    "data prepare --tokenizer": ["data", "prepare", "-q", "--input", "T", "--tokenizer", "X", "--out", "OUT"],
    "data info DIR": ["data", "info", "X"],
    "train --data": ["train", "--data", "X", "--out", "OUT"],
    "train --init-from": ["train", "--init-from", "X", "--data", "D", "--out", "OUT"],
    "train --resume": ["train", "--resume", "X"],
    "sweep --data": ["sweep", "--variants", "baseline", "--lr", "1e-3", "--data", "X", "--out", "OUT"],
    "analyze --model": ["analyze", "--model", "X", "--data", "D"],
    "analyze --data": ["analyze", "--model", "M", "--data", "X"],
    "analyze --text": ["analyze", "--model", "M", "--text", "T", "X"],
    "extrapolate --model": ["extrapolate", "--model", "X", "--data", "D"],
    "extrapolate --data": ["extrapolate", "--model", "M", "--data", "X"],
    "generate --model": ["generate", "--model", "X", "--prompt", "hi"],
    "generate --tokenizer": ["generate", "--model", "M", "--tokenizer", "X", "--prompt", "hi"],
    "convert --from": ["convert", "--from", "X", "--to", "OUT"],
    "bench --real-model": ["bench", "--quick", "--real-model", "X"],
    "bench --decode": ["bench", "--quick", "--decode", "X"],
    "reproduce --data": ["reproduce", "--data", "X", "--out", "OUT"],
    "reproduce --model": ["reproduce", "--model", "X", "--out", "OUT"],
    "reproduce --fold": ["reproduce", "--fold", "X", "--out", "OUT"],
}
KINDS = {"fifo": "is a FIFO", "loop": "is a loop of symbolic links", "device": "is a device"}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    os.mkfifo(root / "fifo")  # no writer: opening it would block
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    model = root / "model_with_fifo"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x")
    os.mkfifo(model / "config.json")
    step = root / "run" / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "trainer_state.pt").symlink_to("/dev/zero")
    return {"fifo": root / "fifo", "loop": root / "loop_a", "device": Path("/dev/zero"), "root": root,
            "model_with_fifo": model, "run": root / "run"}


@contextlib.contextmanager
def deadline(seconds: int):
    """A safety net: a command that opened a FIFO would block; the alarm ends the test instead."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: the input was opened")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with deadline(30):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", OPTIONS)
def test_every_input_option_refuses_special_files_before_reading(option, kind, paths, capsys, monkeypatch):
    monkeypatch.chdir(paths["root"])
    target = str(paths[kind])
    argv = [target if a == "X" else a for a in OPTIONS[option]]
    before = sorted(p.name for p in paths["root"].iterdir())
    code, err = run(argv, capsys)
    flag = option.split()[-1]
    assert code == 2 and len(err) == 1, err
    assert f"{flag} {target} {KINDS[kind]}" in err[0], err
    assert sorted(p.name for p in paths["root"].iterdir()) == before  # nothing written


def test_a_directory_input_holding_a_fifo_or_a_device_is_refused(paths, capsys):
    code, err = run(["analyze", "--model", paths["model_with_fifo"], "--data", "D"], capsys)
    assert code == 2 and err == [f"gatedattn analyze: error: --model {paths['model_with_fifo']} holds config.json, "
                                 f"which is a FIFO, not a regular file or directory; give a file or directory "
                                 f"(copy a stream to a file first)"], err
    code, err = run(["train", "--resume", paths["run"]], capsys)
    assert code == 2 and len(err) == 1, err
    assert f"--resume {paths['run']} holds checkpoints/step_2/trainer_state.pt, which is a device" in err[0], err


def test_a_missing_or_ordinary_input_passes_to_its_command(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f.txt")
    stamps = check_input(tmp_path, "--data", stamps=None)
    assert stamps is None  # nothing recorded without stamps; nothing refused
    for path in (tmp_path / "missing", tmp_path / "link", tmp_path / "f.txt", None, ""):
        check_input(path, "--data")


def test_an_input_that_changes_while_the_command_reads_it_is_refused(tmp_path, capsys, monkeypatch):
    from gatedattn.data import cli as data_cli

    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")

    def rewritten_while_read(args):
        with open(data / "manifest.json", "a") as f:
            f.write(" ")
        return 0

    monkeypatch.setattr(data_cli, "_info", rewritten_while_read)
    code, err = run(["data", "info", data], capsys)
    assert code == 2 and len(err) == 1, err
    assert f"DIR {data / 'manifest.json'} changed (size 2 -> 3 bytes" in err[0], err

    def untouched(args):
        return 0

    monkeypatch.setattr(data_cli, "_info", untouched)
    assert run(["data", "info", data], capsys) == (0, [])


def test_the_files_of_a_written_input_are_not_stamped(tmp_path):
    import argparse

    (tmp_path / "config.json").write_text("{}")
    args = argparse.Namespace(resume=str(tmp_path), data=str(tmp_path / "config.json"),
                              **input_options(("--resume", "resume"), ("--data", "data"), written=("--resume",)))
    stamps = check_arguments(args)
    assert list(stamps.files) == [str(tmp_path / "config.json")]  # seen through --data only
    (tmp_path / "checkpoints").mkdir()  # what train --resume writes is no change of an input
    stamps.check_unchanged()
    (tmp_path / "config.json").unlink()
    with pytest.raises(GatedAttnError, match=r"^--data .*config.json was removed while the command read it"):
        stamps.check_unchanged()


def test_the_data_a_resumed_run_recorded_is_checked_like_data(tmp_path, capsys):
    import json

    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "train.bin")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"train": {"data_dir": str(data), "out_dir": str(run_dir)}}))
    code, err = run(["train", "--resume", run_dir], capsys)
    assert code == 2 and err == [f"gatedattn train: error: the run's data_dir {data} holds train.bin, which is a "
                                 f"FIFO, not a regular file or directory; give a file or directory (copy a stream "
                                 f"to a file first)"], err
