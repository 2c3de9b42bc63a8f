"""`import gatedattn` alone makes AutoModelForCausalLM read gatedattn directories,
whichever package the program imports first.

Each import order runs in an interpreter of its own, in which neither gatedattn nor
transformers has been imported. The interpreters are forked from one that imported torch
and the other packages transformers imports (torch's compiler and DTensor, sympy, scipy,
kernels) once: the program of every order begins with ``import torch``, and gatedattn's
registration watches only ``transformers`` and ``gatedattn`` imports, so sharing those
imports changes nothing of what is tested."""

import json
import subprocess
import sys

import pytest
import torch

from gatedattn import GatedLM, ModelConfig

V = 50

# (importing gatedattn.hf.auto first goes the configuration's way: auto imports the configuration)
FIRSTS = ["import gatedattn", "import transformers; import gatedattn",
          "import gatedattn.hf.configuration", "from gatedattn.hf import register_auto"]

# one import order: {first}, then what a program does with the directory (importing the
# model classes of gatedattn, as a program that saved it would, before transformers' own)
PROGRAM = """
{first}
from gatedattn import GatedLM, ModelConfig
from transformers import AutoModelForCausalLM
hf = AutoModelForCausalLM.from_pretrained(directory)
assert type(hf).__module__ == "gatedattn.hf.auto", type(hf).__module__  # registered, not remote code
ids = torch.load(reference)["ids"]
with torch.no_grad():
    torch.save({{"logits": hf(ids).logits, "generated": hf.generate(ids, max_new_tokens=4, do_sample=False)}}, out)
"""

# imports torch, then forks one interpreter per import order and runs its program there
FORKS = r"""
import json, os, sys, traceback
import importlib, torch, torch._dynamo, torch.distributed.tensor
for name in ("sympy", "scipy.optimize", "kernels"):  # what transformers imports, where installed
    try:
        importlib.import_module(name)
    except ImportError:
        pass

directory, reference, firsts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
imported = [m for m in sys.modules if m.split(".")[0] in ("gatedattn", "transformers")]
assert not imported, imported
codes = []
for i, program in enumerate(firsts):
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            exec(compile(program, f"<order {i}>", "exec"),
                 {"__name__": "__main__", "torch": torch, "directory": directory, "reference": reference,
                  "out": f"{reference}.{i}"})
            code = 0
        except BaseException:
            print(f"--- order {i}:", file=sys.stderr)
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
with open(reference + ".codes", "w") as f:  # (stdout also holds what transformers prints)
    json.dump(codes, f)
"""


@pytest.mark.slow  # an interpreter of its own for each import order
def test_auto_classes_after_plain_import_whichever_package_comes_first(tmp_path):
    model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=V)).eval()
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(0, V, (1, 5))
    torch.save({"ids": ids}, tmp_path / "ref.pt")
    with torch.no_grad():
        logits, generated = model(ids), model.generate(ids, 4, temperature=0)
    programs = [PROGRAM.format(first=first) for first in FIRSTS]
    proc = subprocess.run([sys.executable, "-c", FORKS, str(tmp_path / "m"), str(tmp_path / "ref.pt"),
                           json.dumps(programs)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads((tmp_path / "ref.pt.codes").read_text())
    assert dict(zip(FIRSTS, codes)) == dict.fromkeys(FIRSTS, 0), proc.stderr[-3000:]
    for i, first in enumerate(FIRSTS):
        got = torch.load(tmp_path / f"ref.pt.{i}")
        torch.testing.assert_close(got["logits"], logits, atol=1e-6, rtol=0, msg=first)
        assert torch.equal(got["generated"], generated), first
