"""Self-contained checkpoints load in transformers where gatedattn cannot be imported, and
the model loaded there (remote code) saves directories that load again.

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
from gatedattn.hf import save_self_contained
from gatedattn.models import code as bundle
from gatedattn.models.lm import GatedLM, ModelConfig

V = 61

# the start of the child: a fresh interpreter in which every gatedattn module is refused
NO_GATEDATTN = r"""
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
"""

# the architectures beyond "gated" (which every kind of save holds), saved self-contained
# with save_self_contained; loaded by the same fresh interpreter as every kind of save
MODELS = {
    "hyga-sink": dict(variant="hyga-sink"),
    "mla": dict(variant="gated", attention_fields={"kv": "mla"}),
}
# the kind the child, having loaded it as remote code, saves again (its own save_pretrained and
# transformers' Trainer.save_model), and loads again
RESAVED = "self-contained hyga-sink"
ENV = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _random_micro(**fields) -> GatedLM:
    """A micro model of ``fields`` (seeded), every weight moved off its initial value."""
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", vocab_size=V, **fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _self_contained(root, name: str) -> tuple:
    """``MODELS[name]`` with random weights, saved by ``save_self_contained``: (directory, model)."""
    model = _random_micro(**MODELS[name])
    save_self_contained(model, root / f"self-contained-{name}")
    return root / f"self-contained-{name}", model


EVERY_KIND = NO_GATEDATTN + r"""
import json
directories, reference, resaved, resaved_kind = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ids = torch.load(reference)["ids"]
got, models = {}, {}
for kind, directory in directories.items():
    try:
        model = models[kind] = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
    except Exception as e:  # a directory without the code: transformers does not know model_type gatedattn
        got[kind] = f"{type(e).__name__}: {e}"
        continue
    with torch.no_grad():
        got[kind] = {"logits": model(ids).logits,
                     "generated": model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False),
                     "module": type(model).__module__}

# the remote-code model saves directories that load again: its own save_pretrained, Trainer.save_model
from transformers import Trainer, TrainingArguments

model = models[resaved_kind]
model.save_pretrained(resaved + "/resaved")
Trainer(model=model, args=TrainingArguments(resaved + "/run", report_to=[], use_cpu=True)).save_model(resaved + "/trainer")
got["saved again"] = {}
for name in ("resaved", "trainer"):
    again = AutoModelForCausalLM.from_pretrained(resaved + "/" + name, trust_remote_code=True)
    with torch.no_grad():
        got["saved again"][name] = {"logits": again(ids).logits, "module": type(again).__module__}
assert not [m for m in sys.modules if m.split(".")[0] == "gatedattn"]
torch.save(got, reference + ".out")
"""


def _every_kind_of_save(root) -> dict[str, GatedLM]:
    """A directory of each kind of save -> the model it holds: save_pretrained, convert, the
    transformers wrapper, transformers' Trainer.save_model, a training run's final/, and
    convert --no-code (which must not load without gatedattn)."""
    import random

    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    import gatedattn.hf.register  # noqa: F401
    from gatedattn.cli import main
    from gatedattn.data import prepare
    from gatedattn.train import TrainConfig, train

    model = _random_micro(variant="gated")
    dirs = {"save_pretrained": root / "saved", "convert": root / "converted", "wrapper": root / "wrapper",
            "trainer": root / "trainer", "final": root / "run" / "final", "convert --no-code": root / "no-code"}
    model.save_pretrained(dirs["save_pretrained"])
    model.save_pretrained(root / "plain", save_code=False)
    assert main(["convert", "--from", str(root / "plain"), "--to", str(dirs["convert"])]) == 0
    assert main(["convert", "--no-code", "--from", str(root / "plain"), "--to", str(dirs["convert --no-code"])]) == 0
    wrapper = AutoModelForCausalLM.from_pretrained(root / "plain")
    wrapper.save_pretrained(dirs["wrapper"])
    args = TrainingArguments(output_dir=str(root / "trainer-out"), report_to=[], use_cpu=True)
    Trainer(model=wrapper, args=args).save_model(str(dirs["trainer"]))
    texts = root / "texts"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(8):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice("ab cd ef gh ij kl".split()) for _ in range(200)))
    prepare([str(texts)], root / "data", vocab_size=300, val_fraction=0.2, progress=False)
    train(TrainConfig(data_dir=str(root / "data"), out_dir=str(root / "run"), preset="micro", variant="gated",
                      seq_len=16, micro_batch=2, steps=2, warmup_steps=1, eval_batches=1, eval_every=0, ckpt_every=0,
                      progress=False, tensorboard=False, dtype="fp32"))
    held = {kind: model for kind in dirs}
    held["final"] = GatedLM.from_pretrained(dirs["final"]).eval()
    return {kind: (path, held[kind]) for kind, path in dirs.items()}


@pytest.mark.slow  # one fresh interpreter for every kind (it imports torch and transformers: seconds)
def test_every_kind_of_save_loads_and_saves_again_where_gatedattn_cannot_be_imported(tmp_path):
    from transformers import GenerationConfig

    saves = _every_kind_of_save(tmp_path)
    saves.update({f"self-contained {name}": _self_contained(tmp_path, name) for name in MODELS})
    for kind, (path, model) in saves.items():  # generation_config.json from every save too
        assert GenerationConfig.from_pretrained(path).eos_token_id == model.cfg.eos_token_id, kind
    assert GenerationConfig.from_pretrained(saves["final"][0]).eos_token_id is not None  # the data's EOS
    ids = torch.randint(0, V, (2, 9))
    torch.save({"ids": ids}, tmp_path / "ref.pt")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**ENV, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-c", EVERY_KIND, json.dumps({k: str(p) for k, (p, _) in saves.items()}),
                           str(tmp_path / "ref.pt"), str(tmp_path / "again"), RESAVED], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "ref.pt.out")
    assert "gatedattn" in got.pop("convert --no-code")  # no code, no model: the rule holds both ways
    again = got.pop("saved again")
    assert set(got) == {"save_pretrained", "convert", "wrapper", "trainer", "final", *(f"self-contained {n}" for n in MODELS)}
    for kind, out in got.items():
        assert isinstance(out, dict), f"{kind}: {out}"
        model = saves[kind][1]
        assert out["module"].startswith("transformers_modules.") and out["module"].endswith(".modeling_gatedattn"), kind
        with torch.no_grad():
            torch.testing.assert_close(out["logits"], model(ids), atol=1e-6, rtol=0, msg=kind)
        want, n = model.generate(ids[:1, :4], 5, temperature=0), out["generated"].shape[1]
        # transformers stops at the EOS its generation_config.json names (a run's final/ has one)
        assert torch.equal(out["generated"], want[:, :n]), kind
        assert n == want.shape[1] or out["generated"][0, -1] == model.cfg.eos_token_id, kind
    # what the remote-code model saved: its code and auto_map again, the same model
    assert set(again) == {"resaved", "trainer"}
    for name, out in again.items():
        assert out["module"].endswith(".modeling_gatedattn"), (name, out["module"])
        assert torch.equal(out["logits"], got[RESAVED]["logits"]), name
        config = json.loads((tmp_path / "again" / name / "config.json").read_text())
        assert "auto_map" in config and (tmp_path / "again" / name / "models_lm.py").is_file(), name


def test_bundle_is_generated_from_the_package_source(tmp_path):
    sources = bundle.bundle_sources()
    assert {"modeling_gatedattn.py", "configuration_gatedattn.py", "models_lm.py", "layers_attention.py"} <= set(sources)
    for name, text in sources.items():
        assert not re.search(r"^\s*(from|import)\s+gatedattn\b", text, flags=re.M), name
    body = sources["layers_attention.py"].split("\n", 1)[1]  # after the generated-file header
    here = (bundle._package_root() / "layers" / "attention.py").read_text()
    rewritten = re.sub(r"from (gatedattn\.[\w.]+) import", lambda m: f"from .{bundle.flat_name(m[1])} import", here)
    assert body == rewritten
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V))
    model.save_pretrained(tmp_path / "plain", save_code=False)
    assert "auto_map" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [".gatedattn-output", "checksums.json", "config.json",
                                                                      "generation_config.json", "model.safetensors"]
    # by default the code is written, every file listed in checksums.json (so --force may replace the directory)
    model.save_pretrained(tmp_path / "default")
    listed = json.loads((tmp_path / "default" / "checksums.json").read_text())
    assert json.loads((tmp_path / "default" / "config.json").read_text())["auto_map"] == bundle.AUTO_MAP
    assert set(sources) <= set(listed) and (tmp_path / "default" / "models_lm.py").read_text() == sources["models_lm.py"]


def test_the_old_self_contained_keyword_still_works_with_a_deprecation_warning(tmp_path):
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V))
    with pytest.warns(DeprecationWarning, match="save_code"):
        model.save_pretrained(tmp_path / "m", self_contained=False)
    assert "auto_map" not in json.loads((tmp_path / "m" / "config.json").read_text())
    with pytest.raises(GatedAttnError, match="save_code must be True or False"):
        model.save_pretrained(tmp_path / "n", save_code="yes")


def test_bundle_refuses_imports_it_cannot_rewrite(tmp_path):
    import ast

    path = tmp_path / "m.py"
    for line, message in (("import gatedattn.models.lm", "cannot be bundled"), ("from gatedattn import GatedLM", "defining"),
                          ("from .model import GatedLM", "relative")):
        with pytest.raises(GatedAttnError, match=message):
            bundle._package_imports(ast.parse(line), path)
