"""``train(cfg)``: one training run in a run directory, single process or under ``torchrun``.

The step itself is :meth:`gatedattn.train.trainer.Trainer.train_step`; this module adds
the run around it: check the inputs and the run directory (nothing is written before
every input has been checked, so a bad input leaves no files), resume from the latest
checkpoint, log every ``log_every`` steps, evaluate every ``eval_every`` steps (and at
step 0 and the last step), checkpoint every ``ckpt_every`` steps, and write the final
model and ``summary.json``.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gatedattn.data import TokenData
from gatedattn.infra.errors import GatedAttnError, Interrupted
from gatedattn.infra.integrity import record as record_checksum
from gatedattn.infra.io import atomic_dir, atomic_write_json, check_writable, interruptible, json_safe
from gatedattn.infra.sizes import check_training_size
from gatedattn.models.lm import GatedLM, ModelConfig, check_state_dict
from gatedattn.infra.precision import resolve_dtype
from gatedattn.train import checkpoint as ckpt_mod
from gatedattn.train import distributed as D
from gatedattn.train import rundir
from gatedattn.train.compile_auto import CompileProbe
from gatedattn.train.config import TrainConfig
from gatedattn.train.init_from import load_init_model, recorded_model_config
from gatedattn.train.metrics import MetricsLog, SpeedMeter, ppl
from gatedattn.train.optim import trainable_names
from gatedattn.train.trainer import EvalHook, StepStats, Trainer


@dataclass
class TrainResult:
    """What a run ended with. ``steps`` updates were done out of ``total_steps``;
    ``complete`` when they are equal (not diverged, not stopped by ``stop_at_step``).
    ``losses[i]`` is the training loss of step ``i + 1`` (the whole run, resumed parts
    included)."""

    out_dir: str
    steps: int
    total_steps: int
    tokens: int
    complete: bool
    final_loss: float | None
    val_loss: float | None
    val_ppl: float | None
    diverged: bool
    diverged_step: int | None
    diverged_reason: str | None
    spikes: int
    spike_steps: list[int]
    skipped_steps: int
    elapsed_s: float
    tokens_per_s: float
    final_dir: str | None
    losses: list[float] = field(default_factory=list, repr=False)
    interrupted: str | None = None  # "SIGINT"/"SIGTERM" when a signal stopped the run (with a checkpoint)
    interrupted_signal: int = 0

    def to_dict(self, with_losses: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_losses:
            d.pop("losses")
        return d


# ---------------------------------------------------------------------------- helpers
def _check_data(data: TokenData, cfg: TrainConfig) -> None:
    if data.train_tokens < cfg.seq_len:
        raise GatedAttnError(f"{cfg.data_dir}: the train split has {data.train_tokens} tokens, fewer than seq_len={cfg.seq_len}")
    if data.num_val_windows(cfg.seq_len) == 0:
        raise GatedAttnError(
            f"{cfg.data_dir}: the val split has {data.val_tokens} tokens, too few for one window of "
            f"seq_len={cfg.seq_len}; use a shorter seq_len or prepare with a larger --val-fraction"
        )


def run_model(cfg: TrainConfig, resume: bool, data: TokenData,
              env: D.DistEnv) -> tuple[ModelConfig, GatedLM | None]:
    """The run's ``ModelConfig``, and for an ``init_from`` run that starts (not resumes)
    the model it starts from. A resumed ``init_from`` run takes the config its latest
    checkpoint records and does not read the init model (the checkpoint has the weights)."""
    if cfg.init_from is None:
        return cfg.model_config(data.vocab_size, data.bos_id, data.eos_id), None
    recorded = D.run_on_main(lambda: recorded_model_config(Path(cfg.out_dir)) if resume else None, env)
    if recorded is not None:
        return recorded, None
    model = load_init_model(cfg, data)
    return model.cfg, model


def check_trainable(model_cfg: ModelConfig, selectors: tuple[str, ...]) -> None:
    """Every ``TrainConfig.trainable`` entry names a parameter of the model (built on the
    meta device: no memory, no weights)."""
    if selectors:
        with torch.device("meta"):
            names = [n for n, _ in GatedLM(model_cfg).named_parameters(remove_duplicate=False)]
        trainable_names(names, selectors)


def plan_run(cfg: TrainConfig, resume: bool, world_size: int, data: TokenData,
             model_cfg: ModelConfig) -> dict[str, Any]:
    """Check the run directory (rank 0); on resume load the checkpoint. Reads only."""
    out = Path(cfg.out_dir)
    identity = rundir.run_identity(cfg, model_cfg, world_size, data)
    if not resume:
        rundir.check_new_run(out, identity)
        return {"identity": identity, "ckpt": None, "model_state": None, "trainer_state": None}
    ckpt = ckpt_mod.latest_checkpoint(out) if out.is_dir() else None
    info = ckpt_mod.read_info(ckpt) if ckpt is not None else None
    rundir.check_resume(out, identity, info)
    if ckpt is None:
        return {"identity": identity, "ckpt": None, "model_state": None, "trainer_state": None}
    model_state, trainer_state = ckpt_mod.load_checkpoint(ckpt)
    check_state_dict(model_state, GatedLM.expected_state(model_cfg), ckpt / "model.safetensors")
    if trainer_state.get("step") != info.get("step"):
        raise GatedAttnError(f"{ckpt}: trainer state is at step {trainer_state.get('step')}, checkpoint.json says {info.get('step')}")
    total = cfg.total_steps(world_size)
    if trainer_state["step"] > total:
        raise GatedAttnError(f"cannot resume {out}: its checkpoint is at step {trainer_state['step']}, beyond the "
                             f"{total} steps this config trains; raise steps (or max_tokens)")
    return {"identity": identity, "ckpt": str(ckpt), "model_state": model_state, "trainer_state": trainer_state}


# ---------------------------------------------------------------------------- train
def train(cfg: TrainConfig, eval_hook: EvalHook | None = None, *, resume: bool = False) -> TrainResult:
    """Train the model ``cfg`` describes; return how the run ended.

    ``resume=True`` continues from the latest checkpoint in ``cfg.out_dir`` (or starts
    afresh if there is none); without it ``cfg.out_dir`` must not hold a run already.
    ``eval_hook(model, step, tokens_seen) -> dict[str, float]`` runs after the validation
    loss at every evaluation (on every rank, the model in eval mode under ``no_grad``);
    its metrics join that eval's record. Divergence ends the run early with
    ``diverged=True``; it is not an exception.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train() needs a TrainConfig, got {type(cfg).__name__}")
    for name in ("data_dir", "out_dir"):
        if getattr(cfg, name) is None:
            raise GatedAttnError(f"train() needs TrainConfig.{name}; it is None")
    check_writable(cfg.out_dir, "--out", kind="dir")
    env = D.setup(cfg.device)
    try:
        return _train(cfg, eval_hook, resume, env)
    finally:
        D.teardown(env)


def _train(cfg: TrainConfig, eval_hook: EvalHook | None, resume: bool, env: D.DistEnv) -> TrainResult:
    world, device = env.world_size, env.device
    data = TokenData(cfg.data_dir, verify=True)  # checksums and token ids, one read of each stream
    data.check_tokenizer()
    _check_data(data, cfg)
    model_cfg, init_model = run_model(cfg, resume, data, env)
    check_trainable(model_cfg, cfg.trainable)
    if cfg.fsdp and not env.distributed:
        raise GatedAttnError("TrainConfig.fsdp=True needs a distributed launch (torchrun with WORLD_SIZE > 1)")
    check_training_size(cfg, model_cfg, device, world)  # before the model or a batch is allocated
    out = Path(cfg.out_dir)

    plan = D.run_on_main(lambda: plan_run(cfg, resume, world, data, model_cfg), env)
    resumed = plan["trainer_state"] is not None
    lock = rundir.lock_run(out).acquire() if env.is_main else None  # one writer per run directory
    try:
        with interruptible(lambda sig: f"stopped outside a training step; the run's files and checkpoints are "
                                       f"kept; continue with: gatedattn train --resume {out}"
                           if (out / rundir.CONFIG).is_file() else
                           "stopped before the run wrote anything; run the same command again"):
            trainer = Trainer(cfg, data, env=env, eval_hook=eval_hook, out=out,
                              resume=(plan["model_state"], plan["trainer_state"]) if resumed else None,
                              model=None if resumed else init_model, model_cfg=model_cfg)
            del init_model  # (the trainer holds it)
            # ---- every input is good and the model is built: from here on the run writes files
            log: MetricsLog | None = None
            if env.is_main:
                problem = cfg.warmup_problem(world)
                if problem is not None:
                    print(f"warning: {problem}", file=sys.stderr, flush=True)
                if resumed or (resume and out.is_dir()):
                    ckpt_mod.cleanup_temporaries(out)
                rundir.write_run_files(out, plan["identity"], device, world, resolve_dtype(cfg.dtype, device).as_dict())
                log = trainer.log = MetricsLog(out, keep_until=plan["trainer_state"]["step"] if resumed else None,
                                               tensorboard=cfg.tensorboard)
            try:
                return _run(trainer, env, data, plan)
            except Exception as e:
                if log is not None and not resumed and not isinstance(e, Interrupted):
                    # a new run that failed (not stopped): the corrected rerun starts afresh in the same --out
                    log.close()
                    log = None
                    rundir.remove_new_run_files(out)
                raise
            finally:
                if log is not None:
                    log.close()
    finally:
        if lock is not None:
            lock.release(remove_empty_dir=True)


def _run(trainer: Trainer, env: D.DistEnv, data: TokenData, plan: dict[str, Any]) -> TrainResult:
    out = trainer.out
    resume = plan["trainer_state"] is not None
    if resume and env.is_main:
        _drop_abandoned_checkpoints(out, trainer.state.step)
        trainer.log.log({"kind": "resume", "step": trainer.state.step, "checkpoint": Path(plan["ckpt"]).name})
    del plan
    if trainer.state.step == 0 and trainer.state.last_eval_step is None:
        trainer.evaluate()
    stop = None
    if trainer.state.diverged_reason is None:  # a resumed run that had diverged stays over
        stop = _fit(trainer)
    return _finish(trainer, data, stop)


def _drop_abandoned_checkpoints(out: Path, step: int) -> None:
    """Remove checkpoints after ``step``, left by the abandoned part of a resumed run."""
    for stale in ckpt_mod.list_checkpoints(out):
        if int(stale.name.split("_")[1]) > step:
            shutil.rmtree(stale, ignore_errors=True)


class _Throughput:
    """Tokens per second over the steps since the last training record."""

    def __init__(self) -> None:
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float) -> float:
        self.tokens += tokens
        self.seconds += seconds
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def reset(self) -> None:
        self.tokens, self.seconds = 0, 0.0


def _fit(trainer: Trainer) -> "_StopSignals":
    """Train to ``trainer.end``: step, log, evaluate and checkpoint on schedule; stop on divergence."""
    cfg, st = trainer.cfg, trainer.state
    what = f"{cfg.model.variant}/{cfg.model.size}" if cfg.init_from is None else \
        f"{trainer.model_cfg.variant} from {Path(cfg.init_from).name}"
    bar = tqdm(total=trainer.total, initial=st.step, desc=f"train {what}", unit="step",
               file=sys.stderr, dynamic_ncols=True, disable=not (cfg.progress and trainer.env.is_main))
    window = _Throughput()
    speed = None
    if trainer.env.is_main:  # model FLOP/s and MFU beside tokens/s
        speed = SpeedMeter.measure(trainer.model_cfg, cfg.seq_len, trainer.precision.dtype, trainer.env.device,
                                   trainer.env.world_size, warn=trainer.say)
    probe = _start_compile(trainer)
    with _StopSignals() as stop:
        _fit_steps(trainer, bar, window, stop, speed, probe)
    bar.close()
    return stop


def _start_compile(trainer: Trainer) -> CompileProbe | None:
    """``compile`` on or off as asked, or auto's probe (train/compile_auto.py); the mode
    goes to env.json and metrics.jsonl."""
    mode, step = trainer.cfg.compile, trainer.state.step
    if mode != "auto":
        _record_compile(trainer, {"mode": mode, "compile": mode == "on", "step": step})
        return None
    probe = CompileProbe(trainer)
    _record_compile(trainer, probe.decision or {"mode": "auto", "compile": None, "step": step,
                                                "reason": "to be decided on the run's first steps"})
    return probe


def _record_compile(trainer: Trainer, decision: dict[str, Any]) -> None:
    """The run's compile mode (as asked, or auto's decision) into env.json and, once
    settled, metrics.jsonl."""
    if trainer.env.is_main and trainer.out is not None:
        rundir.record_env(trainer.out, "compile", decision)
    if decision["compile"] is not None:
        trainer._log({"kind": "compile", **decision})


class _StopSignals:
    """While training: SIGINT and SIGTERM ask the loop to stop after the current step (a
    second one stops at once). Installed only in the main thread (signals reach no other)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    @property
    def name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name


def _fit_steps(trainer: Trainer, bar, window: "_Throughput", stop: _StopSignals,
               speed: SpeedMeter | None = None, probe: CompileProbe | None = None) -> None:
    cfg, st = trainer.cfg, trainer.state
    while st.step < trainer.end:
        stats = trainer.train_step()
        if probe is not None and (decision := probe.after_step(stats.seconds)) is not None:
            _record_compile(trainer, decision)
        tps = window.add(trainer.tokens_per_step, stats.seconds)
        if _due(stats.step, cfg.log_every, trainer.end) or stats.step == 1 or stats.diverged:
            _log_step(trainer, stats, tps, speed)
            window.reset()
        bar.set_postfix(loss=f"{stats.loss:.4f}", tok_s=f"{tps:,.0f}",
                        **({} if speed is None else {"mfu": speed.postfix(tps)}), refresh=False)
        bar.update(1)
        if stats.diverged:
            trainer.say(f"step {stats.step}: diverged ({stats.diverged}); stopping")
            trainer._log({"kind": "diverged", "step": stats.step, "loss": stats.loss, "reason": stats.diverged})
            trainer.save()  # so that resuming a diverged run reports it instead of training it again
            break
        if _due(stats.step, cfg.eval_every, trainer.total):
            trainer.evaluate()
        if _due(stats.step, cfg.ckpt_every, trainer.end) or stop.received is not None:
            trainer.save()
        if stop.received is not None and st.step < trainer.end:
            trainer.say(f"{stop.name}: stopped after step {st.step} with a checkpoint")
            trainer._log({"kind": "interrupted", "step": st.step, "signal": stop.name})
            break


def _due(step: int, every: int, last: int) -> bool:
    """Every ``every`` steps (0: never) and at step ``last``."""
    return bool(every and step % every == 0) or step == last


def _log_step(trainer: Trainer, stats: StepStats, tokens_per_s: float, speed: SpeedMeter | None = None) -> None:
    st = trainer.state
    trainer._log({"kind": "train", "step": stats.step, "tokens": st.tokens, "loss": stats.loss, "lr": stats.lr,
                  "grad_norm": stats.grad_norm, "tokens_per_s": tokens_per_s,
                  **({} if speed is None else speed.fields(tokens_per_s)), "elapsed_s": trainer.elapsed(),
                  "spikes": len(st.spike_steps), "skipped_steps": st.skipped_steps})


def _finish(trainer: Trainer, data: TokenData, stop: "_StopSignals | None" = None) -> TrainResult:
    """The final model (a complete run), metrics.csv, summary.json; the result."""
    cfg, env, st, out = trainer.cfg, trainer.env, trainer.state, trainer.out
    diverged = st.diverged_reason is not None
    complete = st.step == trainer.total and not diverged
    final_dir = None
    if complete:
        if st.last_eval_step != trainer.total:  # resumed from a checkpoint written before it
            trainer.evaluate()
        mstate = D.full_model_state(trainer.wrapped, env, cfg.fsdp)  # (collective under FSDP)
        if env.is_main:
            _write_final(out, mstate, trainer.model_cfg, data, cfg.save_code)
        final_dir = str(out / rundir.FINAL)
    if env.is_main:
        trainer.log.write_csv()
    result = _result(trainer, complete, final_dir, stop)
    if env.is_main:
        atomic_write_json(out / rundir.SUMMARY, json_safe(result.to_dict()))
    return result


def _result(trainer: Trainer, complete: bool, final_dir: str | None,
            stop: "_StopSignals | None" = None) -> TrainResult:
    st = trainer.state
    diverged = st.diverged_reason is not None
    return TrainResult(
        out_dir=str(trainer.out), steps=st.step, total_steps=trainer.total, tokens=st.tokens, complete=complete,
        final_loss=st.losses[-1] if st.losses else None, val_loss=st.last_val_loss,
        val_ppl=ppl(st.last_val_loss) if st.last_val_loss is not None else None,
        diverged=diverged, diverged_step=st.step if diverged else None, diverged_reason=st.diverged_reason,
        spikes=len(st.spike_steps), spike_steps=list(st.spike_steps), skipped_steps=st.skipped_steps,
        elapsed_s=trainer.elapsed(),
        tokens_per_s=st.step * trainer.tokens_per_step / st.train_time_s if st.train_time_s > 0 else 0.0,
        final_dir=final_dir, losses=list(st.losses),
        interrupted=None if complete or stop is None else stop.name,
        interrupted_signal=0 if complete or stop is None or stop.received is None else stop.received,
    )


def _write_final(out: Path, mstate: dict[str, torch.Tensor], model_cfg: ModelConfig, data: TokenData,
                 save_code: bool) -> Path:
    """``final/``: GatedLM.save_pretrained format (the modelling code with ``save_code``) plus
    the data's tokenizer.json, atomically."""
    target = out / rundir.FINAL
    with atomic_dir(target) as tmp:
        ckpt_mod.write_model_dir(tmp, mstate, model_cfg, save_code=save_code)
        shutil.copyfile(data.data_dir / data.manifest.tokenizer_file, tmp / "tokenizer.json")
        record_checksum(tmp / "tokenizer.json")
    return target


