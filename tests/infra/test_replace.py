"""Replacing a directory without a window: the one-step swap, the two-step fallback and the
recovery of what a killed replace left, the temporaries' names (nested, long)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from gatedattn.infra import io
from gatedattn.infra.errors import GatedAttnError


def _dir(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "f").write_text(text)
    return path


def _replace(target: Path, text: str) -> None:
    tmp = io.temp_dir_beside(target)
    (tmp / "f").write_text(text)
    io.replace_dir(tmp, target)


def test_the_swap_is_one_step_where_linux_has_renameat2(tmp_path, monkeypatch):
    if io._RENAMEAT2 is None:
        pytest.skip("no renameat2 here")
    target = _dir(tmp_path / "out", "old")
    points = []
    monkeypatch.setattr(io, "FAULT_HOOK", lambda point, path: points.append(point))
    _replace(target, "new")
    assert points == ["replace:ready", "replace:swapped"]  # never a moment without an output
    assert (target / "f").read_text() == "new" and os.listdir(tmp_path) == ["out"]


def test_exchange_swaps_two_entries(tmp_path):
    if io._RENAMEAT2 is None:
        pytest.skip("no renameat2 here")
    a, b = _dir(tmp_path / "a", "A"), _dir(tmp_path / "b", "B")
    assert io.exchange(a, b)
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"


def test_two_step_replace_puts_the_old_back_when_the_rename_fails(tmp_path, monkeypatch):
    target = _dir(tmp_path / "out", "old")
    monkeypatch.setattr(io, "exchange", lambda a, b: False)

    def fail(point, path):
        if point == "replace:aside":
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(io, "FAULT_HOOK", fail)
    tmp = io.temp_dir_beside(target)
    with pytest.raises(OSError):
        io.replace_dir(tmp, target)
    io.discard_dir(tmp)
    assert (target / "f").read_text() == "old" and os.listdir(tmp_path) == ["out"]


def test_a_killed_two_step_replace_is_undone_or_finished(tmp_path):
    # killed after the rename aside: the target is missing, the old copy waits in .out.X.old/dir
    target = tmp_path / "out"
    aside = tmp_path / ".out.k1ll3d00.old"
    aside.mkdir()
    _dir(aside / "dir", "old")
    io.check_writable(target, "--out", kind="dir")  # any command on the path recovers it first
    assert (target / "f").read_text() == "old" and not aside.exists()
    # killed after the rename in: the target is whole, the old copy is dropped
    aside.mkdir()
    _dir(aside / "dir", "older")
    assert not io.recover_replaced(target)
    assert (target / "f").read_text() == "old" and not aside.exists()


def test_a_live_replaces_old_copy_is_left_alone(tmp_path):
    target = tmp_path / "out"
    aside = tmp_path / ".out.l1ve0000.old"
    aside.mkdir()
    _dir(aside / "dir", "old")
    fd = os.open(aside, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        pid = os.fork()
        if pid == 0:  # another process: the flock is not its own
            os._exit(0 if not io.recover_replaced(target) and (aside / "dir").is_dir() else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        os.close(fd)
    assert not target.exists()


def test_nested_temporaries_of_a_killed_writer_are_removed(tmp_path):
    target = _dir(tmp_path / "model", "old")
    nested = tmp_path / "..model.abc123de.tmp.fgh456ij.tmp"  # a temporary's own temporary
    nested.mkdir()
    (nested / "model.safetensors").write_bytes(b"partial")
    file_tmp = tmp_path / ".model.zz9xy8ww.tmp"
    file_tmp.write_bytes(b"partial")
    foreign = tmp_path / ".model.notours"
    foreign.mkdir()
    _replace(target, "new")
    assert sorted(os.listdir(tmp_path)) == [".model.notours", "model"]


@pytest.mark.parametrize("length", [200, 240, 255])
def test_long_names_get_temporaries_within_the_name_limit(tmp_path, length):
    name = "n" * length
    io.atomic_write_text(tmp_path / name, "x")
    target = tmp_path / f"{name[:-1]}d"
    _dir(target, "old")
    _replace(target, "new")
    assert (target / "f").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == sorted([name, target.name])
    stale = tmp_path / f"{io.temp_prefix(target.name)}abcdefgh.tmp"
    stale.mkdir()
    assert io.temporaries_of(target) == [stale]
    assert io.temporaries_of(tmp_path / name) == []  # a sibling with the same start is not confused with it


def test_a_study_output_is_taken_only_by_the_study_that_wrote_it(tmp_path):
    from gatedattn.infra.outputs import STUDY_MARKER, check_study_output, mark_study_output

    out = tmp_path / "study"
    out.mkdir()
    mark_study_output(out, "reproduce", "mechanism")
    (out / "report.md").write_text("the mechanism study's report")
    check_study_output(out, "reproduce", "mechanism")  # its own study goes on
    with pytest.raises(GatedAttnError, match=rf"--out {out} holds the output of --study mechanism, not --study "
                                             r"pretrained; .* or give --study mechanism"):
        check_study_output(out, "reproduce", "pretrained")
    (out / STUDY_MARKER).write_text('{"command": "reproduce"}\n')  # a marker that names no study ...
    (out / "results.json").write_text('{"study": "mechanism"}')  # ... falls back on its results
    with pytest.raises(GatedAttnError, match="holds the output of --study mechanism"):
        check_study_output(out, "reproduce", "pretrained")
    (out / "results.json").unlink()
    check_study_output(out, "reproduce", "pretrained")  # nothing says which: accepted as before
