"""The real-model bench's Markdown is what docs/benchmarks/real-model.md shows for each
committed JSON: the table rows, the compiled training row's compiles and break-even, and
the bf16 MFU goal."""

import json
from pathlib import Path

import pytest

from gatedattn.bench.real_model import format_real_model

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


@pytest.mark.parametrize("name", ["real-model-bf16.json", "real-model-fp32-avx2.json",
                                  "real-model-bf16-avx512.json", "real-model-fp32-avx512.json",
                                  "real-model-bf16-avx512-heap-kept.json", "real-model-fp32-avx512-heap-kept.json"])
def test_each_committed_result_renders_to_the_lines_the_doc_shows(name):
    res = json.loads((DOCS / name).read_text())
    doc = (DOCS / "real-model.md").read_text()
    text = format_real_model(res)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| workload")]
    assert len(rows) == len(res["rows"])
    for line in rows:
        assert line in doc, line
    compiled = [line for line in text.splitlines() if line.startswith(("Compiled training", "bf16 training MFU"))]
    if any(r["kind"] == "train-compiled" for r in res["rows"]):
        assert len(compiled) == (2 if res["precision"]["dtype"] == "bf16" else 1)
        for line in compiled:
            assert line in doc, line
    else:  # written before the compiled row was measured
        assert compiled == []


def test_the_compiled_rows_sentence_reads_its_figures():
    res = json.loads((DOCS / "real-model-fp32-avx512.json").read_text())
    row = next(r for r in res["rows"] if r["kind"] == "train-compiled")
    row.update(ours_compile_s=12.34, ours_over_eager=0.95, ours_break_even_steps=None)
    line = next(x for x in format_real_model(res).splitlines() if x.startswith("Compiled training"))
    assert line.startswith("Compiled training (inductor): ours compiled in 12.3 s, its step 0.95x its eager one, "
                           "never pays (no faster than eager); transformers compiled in ")
