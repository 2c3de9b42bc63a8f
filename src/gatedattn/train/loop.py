"""``train(cfg)``: one training run, single process or under ``torchrun``.

Order of one step ``s`` (0-based; the record says ``step = s + 1``, the number of
updates done): set the learning rate ``lr_at(s)``; for each of ``grad_accum``
micro-steps read this rank's rows of the global batch of data step ``s`` (a function of
``(seed, s)`` only), forward, backward ``loss / grad_accum`` (gradients all-reduced on
the last micro-step); all-reduce the loss; clip; update (or skip a non-finite step);
track spikes and divergence; log; evaluate; checkpoint. Evaluation also runs at step 0
and at the last step.

The global batch of a step has ``micro_batch * grad_accum * world_size`` rows; micro-step
``a`` of rank ``r`` reads rows ``[(a * world_size + r) * micro_batch, ... + micro_batch)``,
so one process with ``grad_accum = k`` and ``k`` processes with ``grad_accum = 1`` see
the same rows.

Nothing is written before every input has been checked, so a bad input leaves no files.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gatedattn.data import TokenData
from gatedattn.errors import GatedAttnError
from gatedattn.io import atomic_write_json, replace_dir, temp_dir_beside
from gatedattn.model import GatedLM, ModelConfig, check_state_dict
from gatedattn.precision import resolve_dtype
from gatedattn.train import checkpoint as ckpt_mod
from gatedattn.train import distributed as D
from gatedattn.train import rundir
from gatedattn.train.config import TrainConfig
from gatedattn.train.metrics import MetricsLog, SpikeTracker
from gatedattn.train.optim import build_optimizer, lr_at

EvalHook = Callable[[torch.nn.Module, int, int], dict[str, float]]
MAX_CONSECUTIVE_SKIPS = 10  # this many non-finite steps in a row (skip_nonfinite) = diverged
_RESERVED = frozenset({"kind", "step", "tokens", "val_loss", "val_ppl", "elapsed_s"})


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

    def to_dict(self, with_losses: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_losses:
            d.pop("losses")
        return d


# ---------------------------------------------------------------------------- helpers
def _lm_loss(logits: torch.Tensor, batch: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of logits (B, T, V) for a (B, T+1) batch (as GatedLM.loss)."""
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction=reduction)


def _autocast(cfg: TrainConfig, device: torch.device):
    return resolve_dtype(cfg.dtype, device).autocast(device)


def _ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def _check_data(data: TokenData, cfg: TrainConfig) -> None:
    if data.train_tokens < cfg.seq_len:
        raise GatedAttnError(f"{cfg.data_dir}: the train split has {data.train_tokens} tokens, fewer than seq_len={cfg.seq_len}")
    if data.num_val_windows(cfg.seq_len) == 0:
        raise GatedAttnError(
            f"{cfg.data_dir}: the val split has {data.val_tokens} tokens, too few for one window of "
            f"seq_len={cfg.seq_len}; use a shorter seq_len or prepare with a larger --val-fraction"
        )


def _fresh_state() -> dict[str, Any]:
    return {"step": 0, "tokens": 0, "losses": [], "spike_steps": [], "skipped_steps": 0,
            "consecutive_skipped": 0, "elapsed_s": 0.0, "train_time_s": 0.0,
            "last_eval_step": None, "last_val_loss": None, "initial_loss": None, "diverged_reason": None}


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
    with torch.device("meta"):
        expected = GatedLM(model_cfg).state_dict()
    if model_cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    check_state_dict(model_state, expected, ckpt / "model.safetensors")
    if trainer_state.get("step") != info.get("step"):
        raise GatedAttnError(f"{ckpt}: trainer state is at step {trainer_state.get('step')}, checkpoint.json says {info.get('step')}")
    total = cfg.total_steps(world_size)
    if trainer_state["step"] > total:
        raise GatedAttnError(f"cannot resume {out}: its checkpoint is at step {trainer_state['step']}, beyond the "
                             f"{total} steps this config trains; raise steps (or max_tokens)")
    return {"identity": identity, "ckpt": str(ckpt), "model_state": model_state, "trainer_state": trainer_state}


def _validate_hook_metrics(metrics: Any) -> dict[str, float]:
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
    env = D.setup(cfg.device)
    try:
        return _train(cfg, eval_hook, resume, env)
    finally:
        D.teardown(env)


def _train(cfg: TrainConfig, eval_hook: EvalHook | None, resume: bool, env: D.DistEnv) -> TrainResult:
    world, device = env.world_size, env.device
    data = TokenData(cfg.data_dir)
    _check_data(data, cfg)
    model_cfg = cfg.model_config(data.vocab_size, data.bos_id, data.eos_id)
    if cfg.fsdp and not env.distributed:
        raise GatedAttnError("TrainConfig.fsdp=True needs a distributed launch (torchrun with WORLD_SIZE > 1)")
    total = cfg.total_steps(world)
    end = min(total, cfg.stop_at_step) if cfg.stop_at_step is not None else total
    global_batch = cfg.global_batch(world)
    tokens_per_step = cfg.tokens_per_step(world)
    out = Path(cfg.out_dir)

    plan = D.run_on_main(lambda: plan_run(cfg, resume, world, data, model_cfg), env)
    resumed = plan["trainer_state"] is not None
    # ---- every input is good: from here on the run writes files
    log: MetricsLog | None = None
    if env.is_main:
        if resumed or (resume and out.is_dir()):
            ckpt_mod.cleanup_temporaries(out)
        rundir.write_run_files(out, plan["identity"], device, world, resolve_dtype(cfg.dtype, device).as_dict())
        log = MetricsLog(out, keep_until=plan["trainer_state"]["step"] if resumed else None, tensorboard=cfg.tensorboard)
    try:
        return _run(cfg, eval_hook, env, data, model_cfg, plan, log, total, end, global_batch, tokens_per_step)
    finally:
        if log is not None:
            log.close()


def _run(cfg, eval_hook, env, data, model_cfg, plan, log, total, end, global_batch, tokens_per_step) -> TrainResult:
    device, world, rank = env.device, env.world_size, env.rank
    out = Path(cfg.out_dir)
    resumed = plan["trainer_state"] is not None
    state = _fresh_state()

    torch.manual_seed(cfg.seed)
    model = GatedLM(model_cfg)
    if resumed:
        state.update({k: v for k, v in plan["trainer_state"].items() if k in state})
        model.load_state_dict(plan["model_state"], strict=False)  # tied lm_head shares embed
    model.to(device)
    if cfg.compile:
        model.compile()
    wrapped = D.wrap(model, env, cfg.fsdp)
    opt = build_optimizer(D.unwrap(wrapped), cfg)
    params = [p for p in wrapped.parameters() if p.requires_grad]  # (FSDP: the sharded ones)
    if resumed:
        D.load_optimizer_state(wrapped, opt, plan["trainer_state"]["optimizer"], cfg.fsdp)
        ckpt_mod.set_rng_state(plan["trainer_state"]["rng"])
        if env.is_main:
            ckpt_dir = Path(plan["ckpt"])
            for stale in ckpt_mod.list_checkpoints(out):  # left by the abandoned part of the run
                if int(stale.name.split("_")[1]) > state["step"]:
                    shutil.rmtree(stale, ignore_errors=True)
            log.log({"kind": "resume", "step": state["step"], "checkpoint": ckpt_dir.name})
    del plan
    spikes = SpikeTracker(cfg.spike_window, cfg.spike_margin, state["losses"][-cfg.spike_window:])
    bar = tqdm(total=total, initial=state["step"], desc=f"train {cfg.variant}/{cfg.preset}", unit="step",
               file=sys.stderr, dynamic_ncols=True, disable=not (cfg.progress and env.is_main))
    t_start = time.perf_counter()
    elapsed_before = state["elapsed_s"]

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - t_start

    def say(msg: str) -> None:
        if env.is_main:
            tqdm.write(msg, file=sys.stderr) if cfg.progress else print(msg, file=sys.stderr)

    def evaluate(step: int) -> None:
        model.eval()
        total_loss = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        with torch.no_grad():
            for batch in data.val_batches(seq_len=cfg.seq_len, batch_size=cfg.micro_batch, max_batches=cfg.eval_batches):
                batch = batch.to(device)
                with _autocast(cfg, device):
                    logits = model(batch[:, :-1])
                total_loss += _lm_loss(logits, batch, reduction="sum").double()
                count += batch[:, 1:].numel()
            val_loss = float(total_loss) / count
            rec = {"kind": "eval", "step": step, "tokens": state["tokens"], "val_loss": val_loss,
                   "val_ppl": _ppl(val_loss), "elapsed_s": elapsed()}
            if eval_hook is not None:
                rec.update(_validate_hook_metrics(eval_hook(model, step, state["tokens"])))
        model.train()
        if hasattr(model, "reshard"):  # FSDP2 keeps the root unsharded after a forward
            model.reshard()
        state["last_eval_step"], state["last_val_loss"] = step, val_loss
        if log is not None:
            log.log(rec)

    def save(step: int) -> None:
        mstate = D.full_model_state(wrapped, env, cfg.fsdp)
        ostate = D.full_optimizer_state(wrapped, opt, env, cfg.fsdp)
        if env.is_main:
            trainer_state = {**state, "optimizer": ostate, "rng": ckpt_mod.rng_state(), "elapsed_s": elapsed()}
            info = {"tokens": state["tokens"], "run": rundir.run_identity(cfg, model_cfg, world, data)}
            ckpt_mod.save_checkpoint(out, step, mstate, model_cfg, trainer_state, info, keep=cfg.keep_checkpoints)
            log.write_csv()

    if state["step"] == 0 and state["last_eval_step"] is None:
        evaluate(0)

    diverged_reason: str | None = state["diverged_reason"]  # a resumed run that had diverged stays over
    window_tokens, window_time = 0, 0.0
    for s in range(state["step"], end if diverged_reason is None else 0):
        t0 = time.perf_counter()
        lr = lr_at(s, lr=cfg.lr, total_steps=total, warmup_steps=cfg.warmup_steps,
                   min_lr_ratio=cfg.min_lr_ratio, schedule=cfg.schedule)
        opt.set_lr_factor(lr / cfg.lr)
        data_step = s % cfg.overfit_batches if cfg.overfit_batches else s
        loss_sum = torch.zeros((), device=device)
        for a in range(cfg.grad_accum):
            first = (a * world + rank) * cfg.micro_batch
            batch = data.train_batch(data_step, range(first, first + cfg.micro_batch), global_batch=global_batch,
                                     seq_len=cfg.seq_len, seed=cfg.seed).to(device)
            with D.grad_sync(wrapped, a == cfg.grad_accum - 1):
                with _autocast(cfg, device):
                    logits = wrapped(batch[:, :-1])
                loss = _lm_loss(logits, batch)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        loss_t = D.all_reduce_mean(loss_sum / cfg.grad_accum, env)
        if cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        loss_f, norm_f = float(loss_t), float(grad_norm)
        finite = math.isfinite(loss_f) and math.isfinite(norm_f)
        done = s + 1
        if finite:
            opt.step()
            state["consecutive_skipped"] = 0
        elif cfg.skip_nonfinite:
            state["skipped_steps"] += 1
            state["consecutive_skipped"] += 1
            say(f"warning: step {done}: non-finite loss {loss_f} / grad norm {norm_f}; update skipped "
                f"({state['skipped_steps']} skipped so far)")
            if log is not None:
                log.log({"kind": "skipped", "step": done, "loss": loss_f, "grad_norm": norm_f})
            if state["consecutive_skipped"] >= MAX_CONSECUTIVE_SKIPS:
                diverged_reason = f"{MAX_CONSECUTIVE_SKIPS} consecutive non-finite steps"
        else:
            diverged_reason = f"non-finite loss {loss_f} / grad norm {norm_f}"
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0

        state["step"] = done
        state["tokens"] += tokens_per_step
        state["train_time_s"] += dt
        state["losses"].append(loss_f)
        if spikes.update(loss_f):
            state["spike_steps"].append(done)
        if state["initial_loss"] is None and finite:
            state["initial_loss"] = loss_f
        if (diverged_reason is None and finite and state["initial_loss"] is not None
                and loss_f > cfg.diverge_factor * state["initial_loss"]):
            diverged_reason = (f"loss {loss_f:.4g} > diverge_factor {cfg.diverge_factor:g} x first loss "
                               f"{state['initial_loss']:.4g}")
        window_tokens += tokens_per_step
        window_time += dt
        tps = window_tokens / window_time if window_time > 0 else 0.0
        if done % cfg.log_every == 0 or done == 1 or done == end or diverged_reason:
            if log is not None:
                log.log({"kind": "train", "step": done, "tokens": state["tokens"], "loss": loss_f, "lr": lr,
                         "grad_norm": norm_f, "tokens_per_s": tps, "elapsed_s": elapsed(),
                         "spikes": len(state["spike_steps"]), "skipped_steps": state["skipped_steps"]})
            window_tokens, window_time = 0, 0.0
        bar.set_postfix(loss=f"{loss_f:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
        bar.update(1)
        if diverged_reason:
            say(f"step {done}: diverged ({diverged_reason}); stopping")
            state["diverged_reason"] = diverged_reason
            if log is not None:
                log.log({"kind": "diverged", "step": done, "loss": loss_f, "reason": diverged_reason})
            save(done)  # so that resuming a diverged run reports it instead of training it again
            break
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == total:
            evaluate(done)
        if (cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == end:
            save(done)
    bar.close()

    diverged = diverged_reason is not None
    complete = state["step"] == total and not diverged
    final_dir = None
    if complete:
        if state["last_eval_step"] != total:  # resumed from a checkpoint written before it
            evaluate(total)
        mstate = D.full_model_state(wrapped, env, cfg.fsdp)  # (collective under FSDP)
        if env.is_main:
            _write_final(out, mstate, model_cfg, data)
            log.write_csv()
        final_dir = str(out / rundir.FINAL)
    elif env.is_main:
        log.write_csv()
    total_time = state["train_time_s"]
    result = TrainResult(
        out_dir=str(out), steps=state["step"], total_steps=total, tokens=state["tokens"], complete=complete,
        final_loss=state["losses"][-1] if state["losses"] else None,
        val_loss=state["last_val_loss"],
        val_ppl=_ppl(state["last_val_loss"]) if state["last_val_loss"] is not None else None,
        diverged=diverged, diverged_step=state["step"] if diverged else None, diverged_reason=diverged_reason,
        spikes=len(state["spike_steps"]), spike_steps=list(state["spike_steps"]),
        skipped_steps=state["skipped_steps"], elapsed_s=elapsed(),
        tokens_per_s=state["step"] * tokens_per_step / total_time if total_time > 0 else 0.0,
        final_dir=final_dir, losses=list(state["losses"]),
    )
    if env.is_main:
        atomic_write_json(out / rundir.SUMMARY, _json_safe(result.to_dict()))
    return result


def _write_final(out: Path, mstate: dict[str, torch.Tensor], model_cfg: ModelConfig, data: TokenData) -> Path:
    """``final/``: GatedLM.save_pretrained format plus the data's tokenizer.json, atomically."""
    target = out / rundir.FINAL
    tmp = temp_dir_beside(target)
    try:
        ckpt_mod.write_model_dir(tmp, mstate, model_cfg)
        shutil.copyfile(data.data_dir / data.manifest.tokenizer_file, tmp / "tokenizer.json")
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj
