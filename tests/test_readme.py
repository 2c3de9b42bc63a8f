"""Every ```python block of the README runs as written.

Each block runs in a fresh namespace, in a temporary working directory that holds what
the README tells the reader to fetch first: ``./Qwen3-0.6B`` is a tiny random Qwen3
directory here (no downloads).
"""

import re
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=48)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "Qwen3-0.6B")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(workdir, index):
    code = compile(BLOCKS[index], f"README.md python block {index + 1}", "exec")
    exec(code, {"__name__": f"readme_block_{index + 1}"})


def test_the_readme_variant_table_matches_gatedattn_variants(capsys):
    """Each row of the README's preset table: gate parameters and gate FLOP share as
    `gatedattn variants --d-model 1024 --n-heads 16 --n-kv-heads 4` computes them, and
    every preset listed once."""
    import json

    from gatedattn import paper
    from gatedattn.cli import main

    assert main(["variants", "--d-model", "1024", "--n-heads", "16", "--n-kv-heads", "4", "--json"]) == 0
    computed = {v["name"]: v for v in json.loads(capsys.readouterr().out)}
    text = README.read_text(encoding="utf-8")
    start = text.index("| preset | what | paper")
    table = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        share = cells[4].removesuffix(" %")
        table[cells[0].strip("`")] = (int(cells[3].replace(",", "")), float(share))
        if cells[0].strip("`") in paper.PPL:  # the paper's figures come from gatedattn.paper
            assert float(cells[2]) == paper.PPL[cells[0].strip("`")], cells[0]
    assert f"baseline {paper.PPL['baseline']}" in text[start:start + 100]
    assert set(table) == set(computed)
    for name, (params, share) in table.items():
        v = computed[name]
        assert params == v["gate_params"], name
        digits = len(str(share).split(".")[1]) if "." in str(share) else 0
        assert round(100 * v["gate_flops"] / v["flops"], max(digits, 1)) == pytest.approx(share, abs=10 ** -digits), name
