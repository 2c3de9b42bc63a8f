"""Data parallelism: process group, device, DDP / FSDP2 wrapping, collectives.

Under ``torchrun`` (``WORLD_SIZE`` > 1) :func:`setup` joins the process group (NCCL on
GPU, gloo on CPU) and picks ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU.
Without it everything degrades to one process and no collectives.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from gatedattn.infra.device import resolve_device
from gatedattn.infra.errors import ConfigError, GatedAttnError


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool  # True when setup() created the process group (teardown destroys it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(pref: str, local_rank: int = 0) -> torch.device:
    """``TrainConfig.device`` on this rank (:func:`gatedattn.infra.device.resolve_device`)."""
    if pref == "cuda" and not torch.cuda.is_available():
        raise ConfigError("TrainConfig.device='cuda' but CUDA is not available; use 'auto' or 'cpu'")
    return resolve_device(pref, local_rank)


def setup(device_pref: str = "auto") -> DistEnv:
    """Join the process group ``torchrun`` describes (if any) and choose the device."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = pick_device(device_pref, local)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return DistEnv(rank, world, local, device, owns_group=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_pref, local)
    if world <= 1:
        return DistEnv(0, 1, local, device, owns_group=False)
    if not dist.is_available():
        raise GatedAttnError("WORLD_SIZE > 1 but this torch has no torch.distributed")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), local, device, owns_group=True)


def teardown(env: DistEnv) -> None:
    """Destroy the process group once every rank is here (a rank that destroys its group
    while another still talks to it can abort the process at exit)."""
    if env.owns_group and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def wrap(model: nn.Module, env: DistEnv, fsdp: bool) -> nn.Module:
    """DDP (default) or FSDP2 ``fully_shard`` (each block, then the root) across ranks."""
    if fsdp:
        if not env.distributed:
            raise ConfigError("TrainConfig.fsdp=True needs a distributed launch (torchrun with WORLD_SIZE > 1)")
        from torch.distributed.fsdp import fully_shard  # lazy: heavy (torch.distributed.fsdp)

        mesh = init_device_mesh(env.device.type, (env.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if not env.distributed:
        return model
    return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)


def unwrap(module: nn.Module) -> nn.Module:
    """The GatedLM inside a DDP wrapper (FSDP2 shards in place: the module itself)."""
    return getattr(module, "module", module)


def grad_sync(module: nn.Module, sync: bool):
    """Context for one accumulation micro-step: gradient all-reduce only when ``sync``."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(module, "no_sync"):  # DDP
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        @contextlib.contextmanager
        def off():
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)
        return off()
    return contextlib.nullcontext()


def all_reduce_mean(x: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= env.world_size
    return x


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; for small control messages and states)."""
    if not env.distributed:
        return obj
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0, device=env.device if env.device.type == "cuda" else None)
    return box[0]


def run_on_main(fn, env: DistEnv) -> Any:
    """Run ``fn()`` on rank 0 and give every rank its result; a GatedAttnError on rank 0
    is raised on every rank with the same message."""
    result, error = None, None
    if env.is_main:
        try:
            result = fn()
        except GatedAttnError as e:
            error = e
    if not env.distributed:
        if error is not None:
            raise error
        return result
    payload = broadcast_object((result, None if error is None else (type(error), str(error))), env)
    if env.is_main and error is not None:
        raise error
    if payload[1] is not None:
        cls, msg = payload[1]
        raise cls(msg)
    return payload[0]


def full_model_state(model: nn.Module, env: DistEnv, fsdp: bool) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict on rank 0, on the CPU; other ranks get {}."""
    if fsdp:
        # lazy: heavy (torch.distributed.checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap(model).state_dict() if env.is_main else {}


def full_optimizer_state(model: nn.Module, opt, env: DistEnv, fsdp: bool) -> dict[str, Any]:
    if fsdp:
        # lazy: heavy (torch.distributed.checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"optimizers": [get_optimizer_state_dict(model, o, options=opts) for o in opt.optimizers]}
    return opt.state_dict() if env.is_main else {}


def load_optimizer_state(model: nn.Module, opt, state: dict[str, Any], fsdp: bool) -> None:
    if fsdp:
        # lazy: heavy (torch.distributed.checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True)
        for o, s in zip(opt.optimizers, state["optimizers"]):
            set_optimizer_state_dict(model, o, s, options=opts)
    else:
        opt.load_state_dict(state)
