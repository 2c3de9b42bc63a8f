"""The command line answers --help, --version and a wrong command without importing PyTorch,
imports a command's module with the cyclic garbage collector paused where the process is its
own, and lists exactly the commands its modules register."""

import argparse
import gc
import importlib
import subprocess
import sys

import pytest

from gatedattn import __version__, cli

_PROBE = """
import sys
from gatedattn.cli import main
try:
    code = main({argv!r})
except SystemExit as e:
    code = e.code
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code, file=sys.stderr)
"""


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--version"], 0), (["nope"], 2), ([], 2)])
def test_light_answers_do_not_import_torch(argv, code):
    r = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == f"NO-TORCH {code}", r.stderr


def test_the_command_lines_process_imports_with_the_collector_paused_then_frozen(monkeypatch, capsys):
    paused, frozen = [], []
    real_import = importlib.import_module

    def watched(name):
        paused.append(not gc.isenabled())
        return real_import(name)

    monkeypatch.setattr(cli.importlib, "import_module", watched)
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(sys, "argv", ["gatedattn", "variants", "--help"])
    with pytest.raises(SystemExit):
        cli.main()  # the process is the command line's
    assert paused == [True] and frozen == [True] and gc.isenabled()
    with pytest.raises(SystemExit):
        cli.main(["variants", "--help"])  # called from Python code: its collector is left alone
    assert paused == [True, False] and frozen == [True]
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: 1 / 0)  # a module that fails to import
    monkeypatch.setattr(sys, "argv", ["gatedattn", "train", "--help"])
    with pytest.raises(ZeroDivisionError):
        cli.main()
    assert gc.isenabled() and frozen == [True, True]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gatedattn {__version__}"


def test_the_version_is_the_one_pyproject_installs():
    import tomllib
    from pathlib import Path

    from gatedattn.infra.provenance import code_version

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"] == code_version()["gatedattn_version"]


def _registered(module: str) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)
    return {a.dest: a.help for a in sub._choices_actions}


def test_registry_matches_what_the_modules_register():
    registered = {}
    for module in cli.SUBCOMMAND_MODULES:
        for name, help_text in _registered(module).items():
            registered[name] = (module, help_text)
    assert registered == cli.COMMANDS


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_command_parses_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0 and f"gatedattn {command}" in capsys.readouterr().out


# the commands whose help needs no PyTorch (the packages of the others import it when imported)
@pytest.mark.parametrize("command", ["bench", "variants"])
def test_light_command_help_does_not_import_torch(command):
    r = subprocess.run([sys.executable, "-c", _PROBE.format(argv=[command, "--help"])], capture_output=True, text=True,
                       timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "NO-TORCH 0", r.stderr
