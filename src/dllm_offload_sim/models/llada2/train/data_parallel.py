"""Data-parallel training: one process per GPU of a host (``dllm-train --gpus N``) or per ``torchrun`` process on a
cluster. Every process holds a replica of the model and trains its shard of each step's global batch
(:class:`~dllm_offload_sim.models.llada2.train.shard.Shard`); PyTorch's DistributedDataParallel averages the
gradients during the backward pass, and the router's expert loads are summed over the processes before the
aux-loss-free bias update, so every replica moves its expert biases the same way and the replicas stay identical.
GPUs talk through NCCL, CPU processes (tests, trial runs) through gloo."""

from __future__ import annotations

import inspect
import os
import socket
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dllm_offload_sim.models.llada2.train.shard import Shard


class MaskedForward(torch.nn.Module):
    """The model's ``forward_masked`` as a module's ``forward``: the call DistributedDataParallel wraps."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, positions, attn_mask, rows=None):
        return self.model.forward_masked(ids, positions, attn_mask, rows=rows)


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel run (its shard and its device) and the collectives the training loop
    needs; for a single process (``world`` 1) every collective returns its input."""

    shard: Shard = field(default_factory=Shard)
    device: str = "cpu"

    @property
    def distributed(self) -> bool:
        return self.shard.world > 1

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the processes, in place."""
        if self.distributed:
            dist.all_reduce(t)
        return t

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the processes, in place."""
        return self.sum_(t).div_(self.shard.world) if self.distributed else t

    def agree(self, value: float, op: str) -> float:
        """The ``op`` ("max" or "min") of a number over the processes: a decision every process must make alike."""
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
        return float(t.item())

    def training_forward(self, model: torch.nn.Module):
        """The training forward (``forward_masked``'s signature): the model's own for one process, else through
        DistributedDataParallel. The expert biases are buffers that the summed loads keep equal, so DDP does not
        broadcast them."""
        if not self.distributed:
            return model.forward_masked
        ids = [torch.device(self.device).index] if self.device.startswith("cuda") else None
        ddp = torch.nn.parallel.DistributedDataParallel
        no_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(ddp).parameters
            else {"broadcast_buffers": False}
        )  # the keyword's name in newer PyTorch versions
        return ddp(MaskedForward(model), device_ids=ids, **no_sync)

    def replicas_agree(self, model: torch.nn.Module) -> bool:
        """Whether every process holds the same parameters and buffers: a per-tensor checksum (float64 sum and sum
        of squares) compared by its maximum and minimum over the processes."""
        if not self.distributed:
            return True
        with torch.no_grad():
            ts = [t.detach().double() for t in (*model.parameters(), *model.buffers())]
            v = torch.stack([torch.stack([t.sum(), (t * t).sum()]) for t in ts]).flatten()
        lo, hi = v.clone(), v.clone()
        dist.all_reduce(lo, dist.ReduceOp.MIN)
        dist.all_reduce(hi, dist.ReduceOp.MAX)
        return bool(torch.equal(lo, hi))


def join(rank: int, world: int, local_rank: int, device_type: str, init_method: str) -> DataParallel:
    """Join the process group as ``rank`` of ``world`` (NCCL on ``cuda``, gloo on ``cpu``); the GPU is
    ``local_rank``, and CPU processes split this host's cores between them."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    return DataParallel(Shard(rank, world), device)


def from_env(device_type: str) -> DataParallel | None:
    """The process group ``torchrun`` (or any launcher setting ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT``) describes; ``None`` when this process was not launched as one of several."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return join(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")), device_type, "env://")


def leave(dp: DataParallel, done: bool = True) -> None:
    """Leave the process group: after every process is ``done`` (a barrier: none tears the group down while another
    still talks to it, which aborts gloo), or at once after a failure."""
    if dp.distributed:
        if done:
            dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, device_type: str, init_method: str, fn, args: tuple) -> None:
    dp = join(rank, world, rank, device_type, init_method)
    done = False
    try:
        fn(dp, *args)
        done = True
    finally:
        leave(dp, done)
    # a process that finished and left the group exits at once: the interpreter's shutdown would destroy the
    # collective library's objects in no set order, and a transport thread still joinable then aborts the process
    # (std::terminate), which would turn a finished run into a failed one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(world: int, device_type: str, fn, *args) -> None:
    """Run ``fn(dp, *args)`` in ``world`` new processes of this host, each with its :class:`DataParallel`
    (process ``r`` on GPU ``r``); returns when all have finished, and raises if one failed. ``fn`` must be a
    module-level function (the processes are started fresh, not forked)."""
    if device_type == "cuda" and world > torch.cuda.device_count():
        raise ValueError(
            f"{world} training processes need {world} GPUs; this host has {torch.cuda.device_count()}"
        )
    init = f"tcp://127.0.0.1:{_free_port()}"
    torch.multiprocessing.spawn(
        _rank_main, args=(world, device_type, init, fn, args), nprocs=world, join=True
    )
