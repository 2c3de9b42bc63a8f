"""Register the Auto classes as soon as transformers is imported, not before.

Importing transformers' model classes costs seconds, so ``import gatedattn`` does not do
it. Instead it installs this finder, which watches the imports of ``transformers`` and of
gatedattn's own modules. When the outermost of these imports ends with transformers
imported, the finder removes itself and calls ``gatedattn.hf.register.register_auto()``
(which imports the config and model classes), so ``AutoModelForCausalLM.from_pretrained``
reads ``model_type: gatedattn`` directories whichever was imported first: transformers,
or any gatedattn module that imports it (``gatedattn.hf.configuration`` alone, ...). No
module that registration imports is then still half-imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def _watched(name: str) -> bool:
    return name == "transformers" or name.startswith("gatedattn.")


def _register() -> None:
    from gatedattn.hf.register import register_auto  # lazy: heavy (transformers)

    register_auto()


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.running = 0  # watched imports under way (nested ones included)
        self.finding = False  # this finder is asking the others for a spec

    def find_spec(self, name, path=None, target=None):
        if not _watched(name) or self.finding:
            return None
        self.finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding = False
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            self.running += 1
            try:
                run_module(module)
            finally:
                self.running -= 1
            if self.running == 0 and "transformers" in sys.modules and self in sys.meta_path:
                sys.meta_path.remove(self)  # one shot: register_auto's own imports are not watched
                _register()

        spec.loader.exec_module = exec_module
        return spec


def register_when_imported() -> None:
    """Register now if transformers is already imported, else once it is."""
    if "transformers" in sys.modules:
        _register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
