"""``Trainer``: the model, optimiser, data and state of one run, and its training step.

Order of one step ``s`` (0-based; the record says ``step = s + 1``, the number of
updates done): set the learning rate ``lr_at(s)``; for each of ``grad_accum``
micro-steps read this rank's rows of the global batch of data step ``s`` (a function of
``(seed, s)`` only), forward, backward ``loss / grad_accum`` (gradients all-reduced on
the last micro-step); all-reduce the loss; clip; update (or skip a non-finite step);
track spikes and divergence (:mod:`gatedattn.train.divergence`).

The global batch of a step has ``micro_batch * grad_accum * world_size`` rows; micro-step
``a`` of rank ``r`` reads rows ``[(a * world_size + r) * micro_batch, ... + micro_batch)``,
so one process with ``grad_accum = k`` and ``k`` processes with ``grad_accum = 1`` see
the same rows.

A ``Trainer`` built without a metrics log or run directory (``Trainer(cfg, data)``)
trains in memory: ``reproduce`` times its ``train_step`` this way. :func:`gatedattn.train.train`
adds the run directory: logging, evaluation and checkpoint schedule, resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from gatedattn.data import TokenData
from gatedattn.infra.errors import GatedAttnError
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.infra.precision import resolve_dtype
from gatedattn.train import checkpoint as ckpt_mod
from gatedattn.train import distributed as D
from gatedattn.train import rundir
from gatedattn.train.config import TrainConfig
from gatedattn.train.divergence import step_reason
from gatedattn.train.metrics import MetricsLog, SpikeTracker, ppl
from gatedattn.train.init_from import load_init_model
from gatedattn.train.optim import build_optimizer, freeze, lr_at

EvalHook = Callable[[torch.nn.Module, int, int], dict[str, float]]
_RESERVED = frozenset({"kind", "step", "tokens", "val_loss", "val_ppl", "elapsed_s"})


@dataclass
class TrainState:
    """What a run has done so far; saved in every checkpoint (``trainer_state.pt``).

    ``losses[i]`` is the training loss of step ``i + 1``; ``initial_loss`` the first finite
    one (the divergence rule's reference); ``elapsed_s`` the wall time of the finished
    invocations, ``train_time_s`` the time spent in training steps only."""

    step: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    spike_steps: list[int] = field(default_factory=list)
    skipped_steps: int = 0
    consecutive_skipped: int = 0
    elapsed_s: float = 0.0
    train_time_s: float = 0.0
    last_eval_step: int | None = None
    last_val_loss: float | None = None
    initial_loss: float | None = None
    diverged_reason: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read the fields of ``state`` (extra keys, such as the optimizer's, are ignored)."""
        for f in dataclasses.fields(self):
            if f.name in state:
                setattr(self, f.name, _copy(state[f.name]))


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class StepStats:
    """One training step: ``step`` updates done after it; ``skipped`` when its update was
    skipped as non-finite; ``diverged`` the divergence rule's reason, or None."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float
    spike: bool
    skipped: bool
    diverged: str | None


def lm_loss(logits: torch.Tensor, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of logits (B, T, V) for a (B, T+1) batch (as GatedLM.loss)."""
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction=reduction)


def train_loss(model: torch.nn.Module, batch: torch.Tensor, fused: bool) -> torch.Tensor:
    """A training micro-batch's mean next-token loss. ``fused`` (a ``GatedLM``, possibly
    wrapped): its forward with ``targets``, which fuses the LM head with the loss;
    otherwise the logits of any ids -> logits model, then the loss."""
    if fused:
        return model(batch[:, :-1], targets=batch[:, 1:])
    return lm_loss(model(batch[:, :-1]), batch)


def local_env(device: str = "auto") -> D.DistEnv:
    """One process, no collectives, on the device ``device`` names."""
    return D.DistEnv(0, 1, 0, D.pick_device(device), owns_group=False)


class Trainer:
    """Builds the model (seeded by ``cfg.seed``) and optimiser for ``cfg`` on ``data``.

    ``resume=(model_state, trainer_state)`` continues from a checkpoint's contents.
    ``log`` (rank 0 of a run) receives the records; ``out`` is the run directory that
    :meth:`save` writes checkpoints into.

    With ``cfg.init_from`` the model is that model (loaded here unless ``model`` is
    given: :func:`gatedattn.train.init_from.load_init_model`); a resumed one is built from
    ``model_cfg``, the ModelConfig its checkpoint records. ``cfg.trainable`` freezes the
    parameters it does not name (:func:`gatedattn.train.optim.freeze`).
    """

    def __init__(self, cfg: TrainConfig, data: TokenData, *, env: D.DistEnv | None = None,
                 eval_hook: EvalHook | None = None, log: MetricsLog | None = None, out: Path | None = None,
                 resume: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
                 model: torch.nn.Module | None = None, model_cfg: ModelConfig | None = None):
        self.cfg, self.data, self.eval_hook, self.log, self.out = cfg, data, eval_hook, log, out
        self.env = env if env is not None else local_env(cfg.device)
        world = self.env.world_size
        model, self.model_cfg = self._model_and_config(model, model_cfg, resumed=resume is not None)
        self.total = cfg.total_steps(world)
        self.end = min(self.total, cfg.stop_at_step) if cfg.stop_at_step is not None else self.total
        self.global_batch = cfg.global_batch(world)
        self.tokens_per_step = cfg.tokens_per_step(world)
        self.state = TrainState()
        self.precision = resolve_dtype(cfg.dtype, self.env.device)
        self.autocast = self.precision.autocast
        torch.manual_seed(cfg.seed)
        # ``model``: train this module instead of a GatedLM built from the recipe (any module
        # mapping ids (B, T) to logits (B, T, V); ``gatedattn bench`` times other models' steps so)
        self.model = model if model is not None else GatedLM(self.model_cfg)
        if resume is not None:
            self.state.load_state_dict(resume[1])
            self.model.load_state_dict(resume[0], strict=False)  # tied lm_head shares embed
        self.trainable = freeze(self.model, cfg.trainable)  # (names) the rest get no gradient, no update
        self.model.to(self.env.device)
        self._checkpoint_activations(cfg.activation_checkpointing)
        self.compiled = False
        if cfg.compile == "on":  # "auto" is decided by the training loop (train/compile_auto.py)
            self.set_compiled(True)
        self.wrapped = D.wrap(self.model, self.env, cfg.fsdp)
        self.fused_loss = isinstance(self.model, GatedLM)  # its forward takes targets (the head and loss fused)
        self.opt = build_optimizer(D.unwrap(self.wrapped), cfg)
        self.params = [p for p in self.wrapped.parameters() if p.requires_grad]  # (FSDP: the sharded ones)
        if resume is not None:
            D.load_optimizer_state(self.wrapped, self.opt, resume[1]["optimizer"], cfg.fsdp)
            ckpt_mod.set_rng_state(resume[1]["rng"])
        self.spikes = SpikeTracker(cfg.spike_window, cfg.spike_margin, self.state.losses[-cfg.spike_window:])
        self._elapsed_before, self._t_start = self.state.elapsed_s, time.perf_counter()

    def _model_and_config(self, model: torch.nn.Module | None, model_cfg: ModelConfig | None,
                          resumed: bool) -> tuple[torch.nn.Module | None, ModelConfig]:
        """The model given (None: build one) and the run's ModelConfig: ``model_cfg`` when
        given, else the recipe's, or with ``init_from`` the init model's (loaded here
        unless given; a resumed run needs ``model_cfg``, what its checkpoint records)."""
        cfg, data = self.cfg, self.data
        if model_cfg is not None:
            return model, model_cfg
        if cfg.init_from is None:
            return model, cfg.model_config(data.vocab_size, data.bos_id, data.eos_id)
        if model is None and resumed:
            raise GatedAttnError("Trainer: resuming an init_from run needs model_cfg (the ModelConfig its "
                                 "checkpoint records)")
        if model is None:
            model = load_init_model(cfg, data)
        return model, model.cfg

    def set_compiled(self, on: bool) -> None:
        """torch.compile the model in place (``nn.Module.compile``: the wrapper, the state
        dict and the parameters stay the same objects), or go back to running it eagerly."""
        if on and not self.compiled:
            self.model.compile()
        elif not on and self.compiled:
            self.model._compiled_call_impl = None  # what nn.Module.compile set; eager __call__ again
        self.compiled = on

    @contextlib.contextmanager
    def eager(self) -> Iterator[nn.Module]:
        """The model run eagerly for the ``with`` body, its compiled call back after (the same
        compiled function, so nothing compiles again). The eval hook runs this way: an
        analysis watches the model through forward hooks and per-call Python (``argmax``,
        ``int``), which a compiled call traces into its graph or breaks it on."""
        saved = getattr(self.model, "_compiled_call_impl", None)
        self.model._compiled_call_impl = None
        try:
            yield self.model
        finally:
            self.model._compiled_call_impl = saved

    def _checkpoint_activations(self, every: int) -> None:
        """``TrainConfig.activation_checkpointing``: blocks 0, every, 2*every, ... recompute
        their activations in backward (0: none)."""
        if not every:
            return
        if not hasattr(self.model, "set_activation_checkpointing"):
            raise GatedAttnError(f"TrainConfig.activation_checkpointing={every} needs a GatedLM; "
                                 f"{type(self.model).__name__} has no set_activation_checkpointing")
        self.model.set_activation_checkpointing(every)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepStats:
        """One optimizer step (or a skipped one); updates :attr:`state`."""
        t0 = time.perf_counter()
        s, cfg = self.state.step, self.cfg
        lr = lr_at(s, lr=cfg.lr, total_steps=self.total, warmup_steps=cfg.warmup_steps,
                   min_lr_ratio=cfg.min_lr_ratio, schedule=cfg.schedule)
        self.opt.set_lr_factor(lr / cfg.lr)
        loss = float(self._forward_backward(s % cfg.overfit_batches if cfg.overfit_batches else s))
        norm = self._grad_norm()
        skipped = self._update(loss, norm)
        self.opt.zero_grad(set_to_none=True)
        return self._record(loss, norm, lr, skipped, time.perf_counter() - t0)

    def _forward_backward(self, data_step: int) -> torch.Tensor:
        """Sum the micro-batches' gradients; the loss averaged over micro-steps and ranks."""
        cfg, env = self.cfg, self.env
        loss_sum = torch.zeros((), device=env.device)
        for a in range(cfg.grad_accum):
            first = (a * env.world_size + env.rank) * cfg.micro_batch
            batch = self.data.train_batch(data_step, range(first, first + cfg.micro_batch),
                                          global_batch=self.global_batch, seq_len=cfg.seq_len,
                                          seed=cfg.seed).to(env.device)
            with D.grad_sync(self.wrapped, a == cfg.grad_accum - 1):
                with self.autocast(env.device):
                    loss = train_loss(self.wrapped, batch, self.fused_loss)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        return D.all_reduce_mean(loss_sum / cfg.grad_accum, env)

    def _grad_norm(self) -> float:
        """Clip (``grad_clip`` > 0) and return the total gradient norm before clipping."""
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP
            norm = norm.full_tensor()
        return float(norm)

    def _update(self, loss: float, norm: float) -> bool:
        """Apply the update unless the step is non-finite; True when it was skipped."""
        if math.isfinite(loss) and math.isfinite(norm):
            self.opt.step()
            self.state.consecutive_skipped = 0
            return False
        if self.cfg.skip_nonfinite:
            self.state.skipped_steps += 1
            self.state.consecutive_skipped += 1
            self.say(f"warning: step {self.state.step + 1}: non-finite loss {loss} / grad norm {norm}; update "
                     f"skipped ({self.state.skipped_steps} skipped so far)")
            self._log({"kind": "skipped", "step": self.state.step + 1, "loss": loss, "grad_norm": norm})
        return True

    def _record(self, loss: float, norm: float, lr: float, skipped: bool, seconds: float) -> StepStats:
        st = self.state
        st.step += 1
        st.tokens += self.tokens_per_step
        st.train_time_s += seconds
        st.losses.append(loss)
        spike = self.spikes.update(loss)
        if spike:
            st.spike_steps.append(st.step)
        if st.initial_loss is None and math.isfinite(loss) and math.isfinite(norm):
            st.initial_loss = loss
        reason = self.stop_reason(loss, norm)
        if reason is not None:
            st.diverged_reason = reason
        return StepStats(st.step, loss, norm, lr, seconds, spike, skipped, reason)

    def stop_reason(self, loss: float, grad_norm: float) -> str | None:
        """Whether the step just recorded diverges the run (the one rule, see
        :mod:`gatedattn.train.divergence`)."""
        return step_reason(loss, grad_norm, first_loss=self.state.initial_loss,
                           diverge_factor=self.cfg.diverge_factor, skip_nonfinite=self.cfg.skip_nonfinite,
                           consecutive_skipped=self.state.consecutive_skipped)

    # ------------------------------------------------------------------ evaluation, checkpoints
    def evaluate(self) -> dict[str, Any]:
        """Validation loss (and the eval hook's metrics) at the current step; logged."""
        model, st = self.model, self.state
        model.eval()
        with torch.no_grad():
            val_loss = self._val_loss()
            rec = {"kind": "eval", "step": st.step, "tokens": st.tokens, "val_loss": val_loss,
                   "val_ppl": ppl(val_loss), "elapsed_s": self.elapsed()}
            if self.eval_hook is not None:
                with self.eager() as eager_model:
                    rec.update(validate_hook_metrics(self.eval_hook(eager_model, st.step, st.tokens)))
        model.train()
        if hasattr(model, "reshard"):  # FSDP2 keeps the root unsharded after a forward
            model.reshard()
        st.last_eval_step, st.last_val_loss = st.step, val_loss
        self._log(rec)
        return rec

    def _val_loss(self) -> float:
        cfg, device = self.cfg, self.env.device
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        for batch in self.data.val_batches(seq_len=cfg.seq_len, batch_size=cfg.micro_batch,
                                           max_batches=cfg.eval_batches):
            batch = batch.to(device)
            with self.autocast(device):
                logits = self.model(batch[:, :-1])
            total += lm_loss(logits, batch, reduction="sum").double()
            count += batch[:, 1:].numel()
        return float(total) / count

    def save(self) -> None:
        """A checkpoint of the current step in the run directory (collective under FSDP)."""
        env, cfg = self.env, self.cfg
        mstate = D.full_model_state(self.wrapped, env, cfg.fsdp)
        ostate = D.full_optimizer_state(self.wrapped, self.opt, env, cfg.fsdp)
        if env.is_main:
            trainer_state = {**self.state.state_dict(), "optimizer": ostate, "rng": ckpt_mod.rng_state(),
                             "elapsed_s": self.elapsed()}
            info = {"tokens": self.state.tokens,
                    "run": rundir.run_identity(cfg, self.model_cfg, env.world_size, self.data)}
            ckpt_mod.save_checkpoint(self.out, self.state.step, mstate, self.model_cfg, trainer_state, info,
                                     keep=cfg.keep_checkpoints)
            self.log.write_csv()

    # ------------------------------------------------------------------ helpers
    def elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._t_start

    def say(self, msg: str) -> None:
        if self.env.is_main:
            tqdm.write(msg, file=sys.stderr) if self.cfg.progress else print(msg, file=sys.stderr)

    def _log(self, rec: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.log(rec)


def validate_hook_metrics(metrics: Any) -> dict[str, float]:
    """An eval hook's result as ``{name: float}``; anything else is a GatedAttnError."""
    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise GatedAttnError(f"eval_hook must return a dict of str -> float, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str) or k in _RESERVED:
            raise GatedAttnError(f"eval_hook returned the key {k!r}; keys must be strings other than {sorted(_RESERVED)}")
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            raise GatedAttnError(f"eval_hook returned {k}={v!r}, which is not a number") from None
    return out
