"""scripts/navigation.py on a planted package whose walk is counted by hand."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "navigation.py"

PLANTED = {
    "__init__.py": "",
    "conf.py": '''
from dataclasses import dataclass


@dataclass(frozen=True)
class TinyConfig:
    size: int = 1

    def check(self):
        return self.size


@dataclass(frozen=True)
class Entry:
    run: object


def tidy(config):
    return config
''',
    "cli.py": '''
from planted_nav import a, b
from planted_nav.conf import TinyConfig
from planted_nav.registry import TABLE


def _run(args):
    cfg = TinyConfig()
    a.first(cfg)
    b.second(cfg.size)
    b.ignored(args)
    entry = TABLE[args]
    entry.run(cfg)
''',
    "a.py": '''
from planted_nav import b
from planted_nav.conf import TinyConfig


def first(cfg):
    b.back(cfg)
    local(cfg)


def local(config):
    return config


def again(cfg: TinyConfig):
    return cfg.check()


def never(cfg):
    return cfg
''',
    "b.py": '''
from planted_nav import a, conf


def back(cfg):
    a.again(cfg)


def second(config):
    a.again(config)
    conf.tidy(config)


def ignored(args):
    a.never(args)


def last(cfg):
    return cfg
''',
    "registry.py": '''
from planted_nav import b
from planted_nav.conf import Entry

TABLE = {"main": Entry(b.last), "other": Entry(b.ignored)}
''',
}


@pytest.fixture
def navigation(tmp_path, monkeypatch):
    root = tmp_path / "planted_nav"
    root.mkdir()
    for name, text in PLANTED.items():
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("navigation_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "navigation_script", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module, root
    for name in [m for m in sys.modules if m.startswith("planted_nav")]:
        del sys.modules[name]


def test_the_walk_and_its_count_on_a_planted_package(navigation, capsys):
    nav, root = navigation
    pkg = nav.Package(root)
    w = nav.walk(pkg, pkg.function("planted_nav.cli:_run"))
    assert [f.qual.split(":")[1] for f in w.visited] == [
        "_run", "first", "back", "again", "TinyConfig.check", "local", "second", "tidy", "last"]
    # b -> a (again), cli -> b (second), b -> conf (tidy), cli -> b (the table's entry): ignored() takes no
    # config and is not followed; again() is visited once
    assert w.count == 4
    assert dict(w.reentries) == {"planted_nav/a.py": 1, "planted_nav/b.py": 2, "planted_nav/conf.py": 1}
    assert nav.main(["--root", str(root), "--entry", "planted_nav.cli:_run", "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "navigation count: 4 re-entries into a file already left (9 functions visited in 4 files, " \
                     "from planted_nav.cli:_run)"
    assert out[1:] == ["    2  planted_nav/b.py"]


def test_the_table_entry_follows_the_study_given(navigation):
    nav, root = navigation
    pkg = nav.Package(root)
    w = nav.walk(pkg, pkg.function("planted_nav.cli:_run"), study="other")
    names = [f.qual.split(":")[1] for f in w.visited]
    assert names[-1] == "ignored" and "last" not in names  # the other entry's function
    assert "never" not in names and w.count == 4  # ignored() passes no config on


GOAL = 30  # the main job's walk comes back to a file already left at most this often


def test_the_main_jobs_walk_stays_within_the_goal():
    spec = importlib.util.spec_from_file_location("navigation_script_real", SCRIPT)
    nav = importlib.util.module_from_spec(spec)
    sys.modules["navigation_script_real"] = nav
    try:
        spec.loader.exec_module(nav)
        root = SCRIPT.parent.parent / "src" / "gatedattn"
        pkg = nav.Package(root)
        w = nav.walk(pkg, pkg.function("gatedattn.reproduce.cli:_run"))
    finally:
        del sys.modules["navigation_script_real"]
    assert len(w.visited) > 100  # the walk reached the studies, the trainer and the layers
    visited = {f.qual for f in w.visited}
    assert {"gatedattn.reproduce.mechanism:run_part", "gatedattn.reproduce.pretrained.study:run_part",
            "gatedattn.reproduce.text.run:text_part", "gatedattn.train.loop:train"} <= visited
    assert w.count <= GOAL, f"{w.count} re-entries: {w.reentries.most_common(5)}"
