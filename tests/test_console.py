"""The console script: a Ctrl-C while the command line and its command's module import is
one line and status 130, never a traceback, and importing gatedattn leaves SIGINT alone."""

import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# a finder that raises KeyboardInterrupt when MODULE is imported, as a Ctrl-C would land there
_INTERRUPTED_IMPORT = """
import sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["gatedattn", *{argv!r}]
from gatedattn_console import main
sys.exit(main())
"""


@pytest.mark.parametrize("module, argv", [("gatedattn", ["variants"]),  # the package itself, before all
                                          ("gatedattn.infra.lazy", ["variants"]),
                                          ("gatedattn.cli", ["variants"]),
                                          ("gatedattn.analysis.cli", ["analyze", "--help"])])
def test_an_interrupt_while_the_command_line_imports_is_one_line_and_130(module, argv):
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT.format(module=module, argv=argv)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, r.stderr
    assert r.stderr.splitlines() == ["gatedattn: interrupted"], r.stderr
    assert r.stdout == ""


def test_the_console_script_is_the_guarded_entry_and_importing_leaves_sigint_alone():
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["gatedattn"] == "gatedattn_console:main"
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="console_scripts", name="gatedattn")] == ["gatedattn_console:main"]
    before = signal.getsignal(signal.SIGINT)
    import gatedattn.console  # noqa: F401
    import gatedattn_console  # noqa: F401

    assert signal.getsignal(signal.SIGINT) is before
