"""`import gatedattn` alone makes AutoModelForCausalLM read gatedattn directories,
whichever package the program imports first."""

import subprocess
import sys

import pytest

SCRIPT = """
import sys, torch
{first}
from gatedattn import GatedLM, ModelConfig
model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=50))
model.save_pretrained(sys.argv[1])
from transformers import AutoModelForCausalLM
hf = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = torch.randint(0, 50, (1, 5))
assert torch.allclose(hf(ids).logits, model(ids), atol=1e-6)
out = hf.generate(ids, max_new_tokens=4, do_sample=False)
assert torch.equal(out, model.generate(ids, 4, temperature=0))
print("ok")
"""


@pytest.mark.slow  # a fresh interpreter each
# (importing gatedattn.hf.auto first goes the configuration's way: auto imports the configuration)
@pytest.mark.parametrize("first", ["import gatedattn", "import transformers; import gatedattn",
                                   "import gatedattn.hf.configuration", "from gatedattn.hf import register_auto"])
def test_auto_classes_after_plain_import(tmp_path, first):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(first=first), str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
