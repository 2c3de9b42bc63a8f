"""A new study is one module and one registry entry: a throwaway study written to a
temporary module gets its flags on the command line (type and help from its own
declaration), runs, writes its report, takes ``--report-only`` and offers its section to
the main report, without any other file changed."""

import json
import sys
import textwrap

import pytest

from gatedattn import cli
from gatedattn.infra.errors import GatedAttnError
from gatedattn.reproduce import studies
from gatedattn.reproduce.registry import Flag, Study

TOY = textwrap.dedent('''
    from dataclasses import asdict, dataclass
    from pathlib import Path

    from gatedattn.infra.io import atomic_write_json, atomic_write_text
    from gatedattn.infra.settings import build, check_options, option
    from gatedattn.reproduce.registry import Flag, out_flag, quiet_flag

    KEY = "toy_squares"


    @dataclass(frozen=True)
    class ToyConfig:
        size: int = option(3, gt=0, help="how many squares the toy study computes")
        out_dir: str = option("runs/toy", help="output directory")
        progress: bool = option(True, help="progress messages")

        def __post_init__(self):
            check_options(self)

        @classmethod
        def quick(cls):
            return cls(size=1)

        def to_dict(self):
            return asdict(self)

        @classmethod
        def from_dict(cls, data):
            return build(cls, data)


    FLAGS = {"--toy-size": Flag("size", "", type=int), "--out": out_flag(), "--quiet": quiet_flag()}


    def section(results, out):
        return ["## Squares", "", ", ".join(map(str, results[KEY]["squares"]))]


    def write_report(results, out):
        path = Path(out) / "report.md"
        atomic_write_text(path, "\\n".join(["# Toy", "", *section(results, out)]) + "\\n")
        return path


    def run(cfg, command):
        out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        results = {"study": "toy", "command": command, KEY: {"squares": [i * i for i in range(cfg.size)]}}
        atomic_write_json(out / "results.json", results)
        return write_report(results, out)
''')


def status(argv):
    """The command's exit status, whether it returns or argparse exits."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_study.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_study

    entry = Study("toy", "a throwaway study", toy_study.ToyConfig, toy_study.FLAGS, toy_study.run,
                  report=toy_study.write_report, key=toy_study.KEY, section=toy_study.section)
    monkeypatch.setitem(studies.STUDIES, "toy", entry)
    yield toy_study
    sys.modules.pop("toy_study", None)


def test_a_study_registered_with_one_entry_runs_reports_and_folds(toy, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["reproduce", "--study", "toy", "--toy-size", "4", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())[toy.KEY]["squares"] == [0, 1, 4, 9]
    assert (out / "report.md").read_text() == "# Toy\n\n## Squares\n\n0, 1, 4, 9\n"
    (out / "report.md").unlink()
    assert cli.main(["reproduce", "--study", "toy", "--out", str(out), "--report-only"]) == 0
    assert (out / "report.md").read_text() == "# Toy\n\n## Squares\n\n0, 1, 4, 9\n"
    assert studies._fold_sections()[toy.KEY] is toy.section  # the main report can fold it in
    # --set reaches its config too, and its own flag's help comes from the config field
    assert cli.main(["reproduce", "--study", "toy", "--set", "size=2", "--out", str(tmp_path / "o2")]) == 0
    assert json.loads((tmp_path / "o2" / "results.json").read_text())[toy.KEY]["squares"] == [0, 1]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["reproduce", "--help"])
    assert "how many squares the toy study computes" in " ".join(capsys.readouterr().out.split())


def test_its_flags_are_checked_like_every_other(toy, tmp_path, capsys):
    assert status(["reproduce", "--study", "toy", "--toy-size", "x", "--out", str(tmp_path / "o")]) == 2
    assert "--toy-size" in capsys.readouterr().err
    assert status(["reproduce", "--study", "toy", "--toy-size", "0", "--out", str(tmp_path / "o")]) == 2
    assert "size" in capsys.readouterr().err
    # another study refuses the toy's flag, naming what it takes
    assert status(["reproduce", "--study", "mechanism", "--toy-size", "2"]) == 2
    assert "--toy-size do not apply to --study mechanism" in capsys.readouterr().err


def test_two_studies_declaring_one_flag_differently_are_refused(monkeypatch):
    bad = Study("bad", "declares --steps as text", object, {"--steps": Flag("steps", "steps as text")},
                lambda cfg, command: None)
    monkeypatch.setitem(studies.STUDIES, "bad", bad)
    from gatedattn.reproduce.cli import study_arguments

    with pytest.raises(GatedAttnError, match="declare --steps differently"):
        study_arguments()
