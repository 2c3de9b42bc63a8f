"""Register the Auto classes as soon as transformers is imported, not before.

Importing transformers' model classes costs seconds, so ``import gatedattn`` does not do
it. Instead it installs this finder: when (and if) the program imports ``transformers``,
the finder lets the normal import run, then calls ``register_auto()``, so
``AutoModelForCausalLM.from_pretrained`` reads ``model_type: gatedattn`` directories
whichever of the two packages was imported first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


# modules whose import imports transformers; while one of them is being imported, the Auto
# classes are not complete yet
_HF_MODULES = frozenset({"gatedattn.hf.auto", "gatedattn.hf.configuration"})


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            if _HF_MODULES & sys.modules.keys():
                return  # transformers was imported by one of them: gatedattn.hf.auto registers at its end
            from gatedattn.hf.auto import register_auto

            register_auto()

        spec.loader.exec_module = exec_module
        return spec


def register_when_imported() -> None:
    """Register now if transformers is already imported, else on its import."""
    if "transformers" in sys.modules:
        from gatedattn.hf.auto import register_auto

        register_auto()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
