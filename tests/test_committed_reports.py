"""Every report committed under ``docs/`` is what ``--report-only`` writes from its
``results.json`` with the current code and rules: a change to a report writer or a verdict
rule that would change a committed report fails here until the report is regenerated
(and the change to its figures is seen in review)."""

import shutil
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[1] / "docs"

# each committed report directory and the study that writes it
REPORTS = {
    "reproduction": "main",
    "real-model-extended": "pretrained",
    "real-model-continued": "pretrained",
    "real-model-w64": "pretrained",
    "reproduction-extended": "text",
    "sink-calibration": "calibrate",
    "mechanism-hyga-gates": "mechanism",
    "mechanism-init-scale": "mechanism",
    "mechanism-random": "mechanism",
    "mechanism-relu-mlp": "mechanism",
    "mechanism-residual-peak": "mechanism",
}


def test_every_committed_report_with_results_is_listed():
    with_results = {p.parent.name for p in DOCS.glob("*/results.json")}
    rewritable = with_results - {"mechanism-calibration"}  # its study writes no report again (no --report-only)
    assert rewritable == set(REPORTS)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_committed_report_regenerates_byte_for_byte(name, tmp_path, monkeypatch):
    import matplotlib.figure

    from gatedattn.cli import main

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)  # the plots are tested elsewhere
    out = tmp_path / name
    shutil.copytree(DOCS / name, out)
    assert main(["reproduce", "--study", REPORTS[name], "--out", str(out), "--report-only"]) == 0
    assert (out / "report.md").read_bytes() == (DOCS / name / "report.md").read_bytes()


def test_the_reports_a_committed_report_points_to_are_committed():
    import re

    root = DOCS.parent
    for report in DOCS.glob("*/report.md"):
        for path in re.findall(r"`(docs/[^`\s]+\.md)`", report.read_text()):
            assert (root / path).is_file(), f"{report.relative_to(root)} points to {path}, which is not committed"


def test_the_readme_headline_figures_are_the_committed_reports():
    import re

    readme = (DOCS.parent / "README.md").read_text()
    table = readme.split("**Headline figures**", 1)[1].split("\n## ", 1)[0]
    report = (DOCS / "reproduction" / "report.md").read_text()
    rows = [line.split("|")[2] for line in table.splitlines() if line.startswith("| ") and "measured" not in line]
    figures = [f.replace(",", "") for row in rows for f in re.findall(r"[+-]?\d[\d,]*\.\d+(?: ± \d+\.\d+)?|\d{1,3}(?:,\d{3})+", row)]
    assert len(figures) >= 8
    missing = [f for f in figures if f not in report]
    assert not missing, f"README headline figures not in docs/reproduction/report.md: {missing}"
