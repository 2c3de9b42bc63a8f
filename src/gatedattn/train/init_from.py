"""``TrainConfig.init_from``: continued pretraining from an existing model.

A run with ``init_from`` starts from the config and weights of a model that
:func:`gatedattn.hf.load_model` reads (a gatedattn directory, a HF Llama / Qwen2 / Qwen3
directory, ...) instead of building a preset; ``model.variant`` other than ``baseline``
retrofits that variant's gate (or sink) with ``add_gates(model, variant,
init="identity")``, which keeps the model's outputs. The resulting ``ModelConfig`` is the
run's, recorded in ``config.json`` and every checkpoint like any run's.

The data must be in the model's vocabulary: a model directory with a ``tokenizer.json``
must hold the data's tokenizer (compared by what it tokenizes,
``integrity.tokenizer_fingerprint``); without one, the data's token ids must fit the
model's ``vocab_size``.

A resumed run reads the init model no more: its model config comes from the checkpoint
(:func:`recorded_model_config`), its weights from the checkpoint's.
"""

from __future__ import annotations

from pathlib import Path

from gatedattn.data import TokenData
from gatedattn.hf import add_gates, load_model
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import tokenizer_fingerprint
from gatedattn.models.lm import GatedLM, ModelConfig, load_model_config
from gatedattn.train import checkpoint as ckpt_mod

TOKENIZER = "tokenizer.json"


def load_init_model(cfg, data: TokenData) -> GatedLM:
    """The model ``cfg.init_from`` names (float32, CPU, in training mode), retrofitted with
    ``cfg.model.variant``'s gate when that is not baseline, checked against the data and
    ``seq_len``; every refusal is one ``GatedAttnError`` line naming ``--init-from``."""
    where = f"--init-from {cfg.init_from}"
    check_tokenizer(Path(cfg.init_from), data)  # before the weights are read
    try:
        model = load_model(cfg.init_from)
    except (GatedAttnError, OSError, ValueError) as e:
        raise GatedAttnError(f"{where} is not a model gatedattn can load: {e}") from None
    variant = cfg.model.variant
    if variant != "baseline":
        try:
            add_gates(model, variant, init="identity")
        except GatedAttnError as e:
            raise GatedAttnError(f"{where}: cannot retrofit --variant {variant}: {e}") from None
    check_model(model.cfg, data, cfg.seq_len, where)
    return model.train()


def check_tokenizer(path: Path, data: TokenData) -> None:
    """A model directory's ``tokenizer.json``, if it has one, must tokenize as the data's."""
    theirs = path / TOKENIZER
    if not path.is_dir() or not theirs.is_file():
        return
    ours = data.data_dir / data.manifest.tokenizer_file
    try:
        same = tokenizer_fingerprint(theirs) == tokenizer_fingerprint(ours)
    except GatedAttnError as e:
        raise GatedAttnError(f"--init-from {path}: cannot compare its tokenizer with the data's: {e}") from None
    if not same:
        raise GatedAttnError(f"--init-from {path}: its {TOKENIZER} differs from the data's ({ours}): the token ids "
                             f"would mean other tokens; prepare the data with `gatedattn data prepare --tokenizer "
                             f"{theirs}`")


def check_model(model_cfg: ModelConfig, data: TokenData, seq_len: int, where: str) -> None:
    """The data's token ids fit the model's vocabulary; ``seq_len`` its context."""
    if data.vocab_size > model_cfg.vocab_size:
        raise GatedAttnError(f"{where}: the data's vocabulary has {data.vocab_size} tokens ({data.data_dir}), the "
                             f"model's vocab_size is {model_cfg.vocab_size}: token ids up to {data.vocab_size - 1} "
                             f"would be out of range; prepare the data with the model's tokenizer")
    if seq_len > model_cfg.max_seq_len:
        raise GatedAttnError(f"{where}: seq_len={seq_len} is longer than the model's context (max_seq_len="
                             f"{model_cfg.max_seq_len}); train with seq_len <= {model_cfg.max_seq_len}")


def recorded_model_config(out: Path) -> ModelConfig | None:
    """The ``ModelConfig`` of the latest checkpoint in the run directory ``out`` (what a
    resumed ``init_from`` run builds instead of reading the init model), or None when it
    has no checkpoint (the run starts afresh from the init model)."""
    ckpt = ckpt_mod.latest_checkpoint(out) if out.is_dir() else None
    return None if ckpt is None else load_model_config(ckpt)
