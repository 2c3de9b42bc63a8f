"""The real-model study's config: one frozen dataclass, every field documented in place."""

from __future__ import annotations

import dataclasses
from typing import Any

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.settings import build, check_options, option
from gatedattn.reproduce.registry import Flag, out_flag, quiet_flag

ARMS = ("sink", "sink-zero", "sink-bias", "gate-headwise", "gate", "control")
DEFAULT_ARMS = ("sink", "gate-headwise", "control")
EXTENDED_ARMS = ("sink", "sink-zero", "sink-bias", "gate-headwise", "gate", "control")


@dataclasses.dataclass(frozen=True)
class PretrainedConfig:
    """The real-model study. Text comes from the bundled corpus's documents (its train /
    validation split by document), tokenized with the model's own tokenizer; every window
    is one document stretch after the chosen first token, with no separator inside."""

    model: str | None = option(None, help="the model: a .gguf file, a directory load_model reads (default: the "
                                          "bundled SmolLM2-135M-Instruct GGUF)")
    first_token: str = option("auto", help="the first position: auto (what the model's tokenizer puts before text: "
                                           "its BOS where it adds one, else none), bos (the model's own BOS token), "
                                           "none (an ordinary text token), or a token id")
    seq_len: int = option(256, ge=8, le=32_768, help="tokens per window, the first token included")
    analysis_windows: int = option(16, gt=0, le=4096, help="held-out windows of the sink measurement")
    eval_windows: int = option(32, gt=1, le=4096, help="held-out windows every loss is measured on")
    windows: tuple[int, ...] = option((32, 64, 128), gt=0, le=32_768, help="attention windows W of the no-op curve "
                                                                    "(full causal attention is always measured)")
    window: int = option(0, ge=0, le=32_768, help="the arms' window W (0: chosen from the curve: the largest W whose loss "
                                       "gap is at least min_gap)")
    min_gap: float = option(0.25, gt=0, help="nats: the loss gap a window needs to be chosen for the arms")
    arms: tuple[str, ...] = option(DEFAULT_ARMS, choices=ARMS,
                                   help="what is trained in place of the first token: " + ", ".join(ARMS) +
                                        " (--set arms=" + ",".join(EXTENDED_ARMS) + ": the extended setting)")
    seeds: int = option(3, gt=0, le=100, help="data orders of every arm")
    steps: int = option(40, gt=0, le=100_000, help="the most optimizer steps of every arm (the stopping rule ends it earlier)")
    batch: int = option(4, gt=0, le=1024, help="windows per step")
    dev_windows: int = option(4, gt=0, le=1024, help="training-split windows outside the pool the stopping rule reads")
    stop_every: int = option(4, gt=0, le=100_000, help="the stopping rule looks at the paired loss (dropped minus kept) on the "
                                           "dev_windows before the first step and every stop_every steps")
    stop_patience: int = option(2, gt=0, le=1000, help="the stopping rule: an arm stops at the first look that makes "
                                              "stop_patience in a row none of which beats the best look before "
                                              "them by more than stop_tol")
    stop_tol: float = option(0.005, ge=0, help="nats: the least improvement of the paired loss that keeps training")
    kept_tol: float = option(0.02, ge=0, help="nats: an arm whose held-out kept-mode loss rose by more is credited "
                                              "with no recovery")
    sink_lr: float = option(1.0, gt=0, help="Adam learning rate of the learnable sink (logits start at each head's "
                                            "measured first-token logit; at 0 in the sink-zero arm)")
    gate_lr: float = option(1e-2, gt=0, help="Adam learning rate of the gates (identity init: score 0.5, o_proj x2)")
    control_lr: float = option(3e-2, gt=0, help="Adam learning rate of the control (a bias on each layer's "
                                                "attention output, starting at 0)")
    dtype: str = option("auto", choices=("auto", "fp32", "bf16"), help="precision of the arms' training steps and "
                                                                         "of the stopping rule's looks: auto is bf16 "
                                                                         "autocast where bf16 is native, fp32 elsewhere "
                                                                         "(every held-out loss is evaluated in fp32)")
    sink_layers_eps: float = option(0.2, gt=0, lt=1, help="arms train in the layers from the first whose F-Attn "
                                                          "exceeds this (the layers below run frozen and are cached)")
    streaming_len: int = option(4096, ge=16, le=131_072, help="tokens of the streaming curve (one held-out document)")
    continued_steps: int = option(0, ge=0, le=1_000_000, help="Qiu et al. App. A.7: steps of continued pretraining of the whole "
                                                "model, with and without a retrofitted G1 gate, on the same windows "
                                                "(0: off; minutes per step on a CPU)")
    continued_lr: float = option(1e-4, gt=0, help="AdamW learning rate of the continued pretraining")
    truncate_layers: int = option(0, ge=0, le=10_000, help="keep only the model's first N layers (0: all; --quick uses it)")
    threads: int = option(0, ge=0, le=1024, help="torch threads (0: as many as the machine has cores)")
    out_dir: str = option("runs/reproduce-pretrained", help="output directory")
    progress: bool = option(True, help="progress messages")

    def __post_init__(self) -> None:
        for name in ("windows", "arms"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_options(self)
        first_token_id(self.first_token)  # refuses a bad value in one line
        if not self.windows:
            raise ConfigError("PretrainedConfig.windows must not be empty")
        if any(w >= self.seq_len for w in self.windows) or self.window >= self.seq_len:
            raise ConfigError(f"PretrainedConfig.windows={self.windows} and window={self.window} must be below "
                              f"seq_len={self.seq_len} (a window that reaches the first token changes nothing)")
        if self.stop_every * self.stop_patience > self.steps:
            raise ConfigError(f"PretrainedConfig.stop_patience={self.stop_patience} looks every stop_every="
                              f"{self.stop_every} steps can never stop an arm within steps={self.steps} (needs steps "
                              f">= {self.stop_every * self.stop_patience})")
        if self.streaming_len <= max(self.windows):
            raise ConfigError(f"PretrainedConfig.streaming_len={self.streaming_len} must exceed the largest window "
                              f"{max(self.windows)}")

    @classmethod
    def quick(cls, **changes: Any) -> "PretrainedConfig":
        """The whole pipeline in well under a minute: the model cut to its first 4 layers,
        short windows, one data order, a few steps."""
        base = dict(truncate_layers=4, seq_len=64, analysis_windows=2, eval_windows=2, windows=(8, 16),
                    arms=DEFAULT_ARMS, seeds=1, steps=2, dev_windows=1, stop_every=1, stop_patience=1,
                    batch=1, streaming_len=96,
                    window=8, out_dir="runs/reproduce-pretrained-quick")
        return cls(**{**base, **changes})

    def replace(self, **changes: Any) -> "PretrainedConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PretrainedConfig":
        return build(cls, data)

    @property
    def quick_run(self) -> bool:
        return self.truncate_layers > 0


def first_token_id(first_token: str) -> int | None:
    """``first_token`` as a token id, ``None`` for ``auto`` and ``bos`` (resolved once the
    model and its tokenizer are read) and ``-1`` for ``none``; anything else is refused
    naming the field."""
    if first_token in ("auto", "bos"):
        return None
    if first_token == "none":
        return -1
    try:
        value = int(first_token)
    except (TypeError, ValueError):
        value = -1
    if value < 0 or str(value) != str(first_token).strip():
        raise ConfigError(f"PretrainedConfig.first_token={first_token!r} is not allowed; choose auto, bos, none, "
                          f"or a token id (an int >= 0)")
    return value


FLAGS: dict[str, Flag] = {
    "--model": Flag("model", "the model: a .gguf file or a model directory (default: the bundled "
                             "SmolLM2-135M-Instruct)"),
    "--steps": Flag("steps", "", type=int), "--seeds": Flag("seeds", "", type=int),
    "--seq-len": Flag("seq_len", "", type=int),
    "--first-token": Flag("first_token", "the first position: auto (what the model's tokenizer puts before text, "
                                         "default), bos (the model's BOS), none (an ordinary text token) or a token "
                                         "id"),
    "--out": out_flag(), "--quiet": quiet_flag(),
}
