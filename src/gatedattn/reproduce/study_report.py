"""The report of a study run on its own (the lr and rank studies): provenance, its
section and its claims' verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gatedattn.infra.io import atomic_write_text
from gatedattn.reproduce.registry import Section
from gatedattn.reproduce.verdicts import Claim


def provenance_table(meta: dict) -> list[str]:
    """A report's provenance as a markdown table: command, machine, software, date and
    minutes (from ``run_meta``), then a blank line."""
    return ["| | |", "|---|---|", f"| command | `{meta['command']}` |", f"| machine | {meta['machine']} |",
            f"| software | python {meta['python']}, torch {meta['torch']}, gatedattn {meta['gatedattn']} "
            f"({meta['code_version']}) |", f"| date | {meta['started']} · {meta['duration_min']:.1f} min |", ""]


def write_study_report(results: dict, out: str | Path, *, title: str, key: str, section: Section,
                       claims: Sequence[Claim]) -> Path:
    """``report.md`` of a study run on its own (the lr and rank studies): its provenance,
    its ``section`` and the verdicts of its ``claims``; ``key``: where its results sit in
    ``results``."""
    out = Path(out)
    meta = results["meta"]
    cfg = results.get("config") or {}
    lines = [f"# gatedattn {title}", "", f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}  ",
             f"Model: {meta['model']}, T {cfg.get('seq_len')}  ", f"Steps per run: {results[key]['steps']}", ""]
    lines += section(results, out)
    for claim in claims:
        verdict = claim.judge(results)
        lines += [f"**{claim.statement}** (paper: {claim.paper}): {verdict.status} — {verdict.measured}", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))
