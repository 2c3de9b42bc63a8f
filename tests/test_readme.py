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
