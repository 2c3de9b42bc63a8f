"""Self-contained checkpoints load in transformers where gatedattn cannot be imported.

The loading runs in a fresh interpreter whose import system refuses every ``gatedattn``
module (the package is installed in this environment, so it is blocked, not absent),
started from an empty working directory.
"""

import json
import re
import subprocess
import sys

import pytest
import torch

from gatedattn import GatedAttnError
from gatedattn.hf import bundle, save_self_contained
from gatedattn.models.lm import GatedLM, ModelConfig

V = 61

CHILD = r"""
import sys

class _NoGatedattn:
    def find_spec(self, name, path=None, target=None):
        if name == "gatedattn" or name.startswith("gatedattn."):
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, _NoGatedattn())
try:
    import gatedattn
except ImportError:
    pass
else:
    raise SystemExit("gatedattn is importable; the test would prove nothing")

import torch
from transformers import AutoModelForCausalLM

directory, reference = sys.argv[1], sys.argv[2]
ref = torch.load(reference)
model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
with torch.no_grad():
    logits = model(ref["ids"]).logits
out = model.generate(ref["ids"][:1, :4], max_new_tokens=5, do_sample=False)
assert not [m for m in sys.modules if m.split(".")[0] == "gatedattn"]
torch.save({"logits": logits, "generated": out, "module": type(model).__module__}, reference + ".out")
"""

MODELS = {
    "gated": dict(variant="gated"),
    "hyga-sink": dict(variant="hyga-sink"),
    "mla": dict(variant="gated", attention_fields={"kv": "mla"}),
}
# each case starts an interpreter that imports torch and transformers (seconds)
CASES = [pytest.param(name, marks=() if name == "gated" else pytest.mark.slow) for name in MODELS]


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize("name", CASES)
def test_self_contained_checkpoint_loads_without_gatedattn(tmp_path, name):
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", vocab_size=V, **MODELS[name])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_self_contained(model, tmp_path / "model")
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        want = model(ids)
    torch.save({"ids": ids}, tmp_path / "ref.pt")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "model"), str(tmp_path / "ref.pt")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "ref.pt.out")
    assert got["module"].startswith("transformers_modules.") and got["module"].endswith(".modeling_gatedattn")
    torch.testing.assert_close(got["logits"], want, atol=1e-6, rtol=0)
    assert torch.equal(got["generated"], model.generate(ids[:1, :4], 5, temperature=0))


def test_bundle_is_generated_from_the_package_source(tmp_path):
    sources = bundle.bundle_sources()
    assert {"modeling_gatedattn.py", "configuration_gatedattn.py", "models_lm.py", "layers_attention.py"} <= set(sources)
    for name, text in sources.items():
        assert not re.search(r"^\s*(from|import)\s+gatedattn\b", text, flags=re.M), name
    body = sources["layers_attention.py"].split("\n", 1)[1]  # after the generated-file header
    here = (bundle._package_root() / "layers" / "attention.py").read_text()
    rewritten = re.sub(r"from (gatedattn\.[\w.]+) import", lambda m: f"from .{bundle.flat_name(m[1])} import", here)
    assert body == rewritten
    GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V)).save_pretrained(tmp_path / "plain")
    assert "auto_map" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [".gatedattn-output", "checksums.json", "config.json",
                                                                      "generation_config.json", "model.safetensors"]


def test_bundle_refuses_imports_it_cannot_rewrite(tmp_path):
    import ast

    path = tmp_path / "m.py"
    for line, message in (("import gatedattn.models.lm", "cannot be bundled"), ("from gatedattn import GatedLM", "defining"),
                          ("from .model import GatedLM", "relative")):
        with pytest.raises(GatedAttnError, match=message):
            bundle._package_imports(ast.parse(line), path)
