"""What a study declares to be registered: its flags (:class:`Flag`) and itself (:class:`Study`).

Every study module owns its config dataclass, its ``FLAGS`` (flag name -> :class:`Flag`), its
claims, its report section and its run; :mod:`gatedattn.reproduce.studies` lists the studies,
and ``gatedattn reproduce`` builds its command line from that list alone (each flag's type,
help and the key of the config it sets come from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gatedattn.infra.settings import parse_list

# a study's section in a report: (results, output directory) -> markdown lines; it may write plots there
Section = Callable[[dict, Path], list[str]]


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a study: it sets ``key`` (dotted, in the study's config) to
    its value parsed by ``type`` (None: the text as given), or to ``value`` for a ``switch``
    (a callable ``value`` is called with whether the run is ``--quick``: a part's config,
    switched on); ``clears`` keys are set to None with it (a field it replaces); an
    ``only_flag`` key may not be given by ``--set`` either; a ``repeat`` flag may be given
    several times (its values collect in order). Flags of the same name in several studies
    must agree on ``type``, ``switch``, ``repeat`` and ``choices``; their helps are shown
    side by side. A flag whose key lies under a part of the study (``Study.parts``) applies
    only where that part runs."""

    key: str
    help: str
    type: Callable[[str], Any] | None = None
    value: Any = None
    clears: tuple[str, ...] = ()
    only_flag: bool = False
    switch: bool = False
    repeat: bool = False
    choices: tuple[str, ...] | None = None
    metavar: str | None = None


@dataclass(frozen=True)
class Study:
    name: str
    help: str
    config: type
    flags: Mapping[str, Flag]
    run: Callable[[Any, str | None], Path]  # trains, writes results.json and report.md; the report's path
    report: Callable[[dict[str, Any], Path], Path] | None = None  # report.md again from results.json
    key: str | None = None  # where its results sit in results.json, for folding into the main job
    section: Section | None = None  # its lines in a report it is folded into
    claims: tuple[str, ...] = ()  # the claims (keys of CLAIMS) its results settle
    parts: tuple[str, ...] = ()  # the studies it composes (fields of its config, each None where left out), in order
    takes_sets: bool = True  # --set KEY=VALUE changes its config

    def flag_names(self) -> tuple[str, ...]:
        """Every flag the study takes (besides the ones every study takes, ``ALWAYS``)."""
        return (*(f for f in self.flags if f not in ALWAYS), *(("--set",) if self.takes_sets else ()),
                *(("--report-only",) if self.report else ()))


OUT_FLAG, QUIET_FLAG = "--out", "--quiet"
ALWAYS = ("--study", OUT_FLAG, "--quick", QUIET_FLAG)  # every study takes these


def out_flag(key: str = "out_dir") -> Flag:
    return Flag(key, "output directory (default runs/reproduce, runs/reproduce-<study> for the other studies; "
                     "-quick appended with --quick)", only_flag=True)


def quiet_flag(key: str = "progress") -> Flag:
    return Flag(key, "no progress bars", value=False, switch=True)


def list_of(kind: type, flag: str) -> Callable[[str], tuple]:
    """A parser of a comma-separated list of ``kind`` for ``flag`` (its name in errors)."""
    def parse(text: str) -> tuple:
        return tuple(parse_list(text, kind, flag))

    parse.kind = ("list", kind)  # flags of the same name in two studies compare by this
    return parse
