"""Several processes, one model: torchrun launching, DDP and FSDP wrapping, full state dicts for rank 0.

`pipe train RECIPE --nproc N` launches `torchrun` on this machine (127.0.0.1, a free port); the
same training code also runs under a user's own `torchrun` across machines, because everything
here reads the standard torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...).
Only rank 0 writes files. gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipelineError


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def under_torchrun() -> bool:
    """True in a process started by torchrun (pipe's own launch or the user's)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_world(device_type: str) -> World:
    """Join the process group torchrun set up; a single process needs none."""
    if not under_torchrun():
        return World()
    import torch.distributed as dist

    world = World(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    if world.distributed and not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return world


def barrier(world: World) -> None:
    """Wait for every rank; a no-op with one process."""
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def close_world(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def broadcast(world: World, value: Any) -> Any:
    """Rank 0's `value` on every rank (a path, a decision); identity with one process."""
    if not world.distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wrap(
    model: nn.Module, world: World, strategy: str, device: torch.device, say: Callable[[str], None] | None = None
) -> nn.Module:
    """DDP replicates the model and all-reduces gradients; FSDP shards parameters and optimizer state.

    FSDP2 (`fully_shard`) shards each transformer block separately (`shard_units`), then the rest of
    the model, so only one block's full parameters exist at a time (ZeRO-3). `say` gets one line
    saying how the model was sharded.
    """
    if not world.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        units, names = shard_units(model)
        for module in units:
            fully_shard(module)
        fully_shard(model)
        if say is not None:
            say(
                f"fsdp: {len(units)} {'/'.join(names)} block(s) sharded one by one, then the rest at the root"
                if units
                else "fsdp: the model names no transformer block class (_no_split_modules): sharded at the root "
                "as one unit, so every rank gathers all its parameters at once"
            )
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def shard_units(model: nn.Module) -> tuple[list[nn.Module], list[str]]:
    """The modules FSDP shards one by one, outermost first, and their class names.

    The zoo's `Block`s; in a transformers model (under PEFT too) the classes it names in
    `_no_split_modules` (LlamaDecoderLayer, GPT2Block, BertLayer...). A module holding a parameter
    that is also used outside it (an embedding tied to the LM head) stays with the root: FSDP2 puts
    each parameter in exactly one unit.
    """
    from pipeline.train.zoo import Block

    wanted: set[str] = set()
    for module in model.modules():
        wanted.update(getattr(module, "_no_split_modules", None) or ())
    owners: dict[int, set[str]] = {}  # parameter id -> every name it goes by (a tied weight has two)
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), set()).add(name)
    units: list[nn.Module] = []
    taken: list[str] = []  # the prefixes of the units chosen ("net.model.layers.0.")
    for prefix, module in model.named_modules():  # outer modules come before the modules inside them
        if not (isinstance(module, Block) or type(module).__name__ in wanted):
            continue
        inner = f"{prefix}."
        if any(inner.startswith(outer) for outer in taken):
            continue  # inside a unit already
        if any(not n.startswith(inner) for p in module.parameters() for n in owners[id(p)]):
            continue  # tied to a weight outside this module: the root holds it
        units.append(module)
        taken.append(inner)
    return units, sorted({type(m).__name__ for m in units})


def unwrap(model: nn.Module) -> nn.Module:
    """The module as built by the zoo (DDP keeps it as `.module`; FSDP2 shards it in place)."""
    return getattr(model, "module", model)


def full_weights(model: nn.Module, strategy: str, world: World) -> dict:
    """The unsharded model state dict (on CPU under FSDP). Every rank must call it (FSDP gathers)."""
    if world.distributed and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap(model).state_dict()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, strategy: str, world: World) -> tuple[dict, dict]:
    """Unsharded model and optimizer state dicts, on CPU. Every rank must call it (FSDP gathers)."""
    weights = full_weights(model, strategy, world)
    if world.distributed and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return weights, get_optimizer_state_dict(model, optimizer, options=options)
    return weights, optimizer.state_dict()


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optim_state: dict, strategy: str, world: World
) -> None:
    """Put full (unsharded) state back; under FSDP every rank reads it and keeps its own shard."""
    if world.distributed and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, weights, options=options)
        set_optimizer_state_dict(model, optimizer, optim_state, options=options)
        return
    unwrap(model).load_state_dict(weights)
    optimizer.load_state_dict(optim_state)


def launch(nproc: int, worker_args: list[str], threads_per_process: int) -> None:
    """Run `python -m pipeline.train.worker ARGS` in `nproc` processes under torchrun, on 127.0.0.1."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",  # port 0: the store binds a free one itself
        "-m", "pipeline.train.worker", *worker_args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_process))
    if "lo" in {name for _, name in socket.if_nameindex()}:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo talks over the loopback interface only
    die_with_parent = _die_with_parent() if sys.platform == "linux" else None
    proc = subprocess.run(cmd, env=env, check=False, preexec_fn=die_with_parent)
    if proc.returncode != 0:
        raise PipelineError(
            f"training with --nproc {nproc} failed: torchrun exited with {proc.returncode} (the workers' "
            "error is printed above); fix it and run again, or add --resume to continue from the last checkpoint"
        )


def _die_with_parent() -> Callable[[], None]:
    """A hook for torchrun's process, run between fork and exec: SIGTERM it when pipe dies, however.

    A `pipe train --nproc N` killed by SIGKILL or an unhandled SIGTERM (a CI timeout) otherwise
    leaves torchrun and its workers training on; torchrun stops its workers when it gets SIGTERM.
    prctl is looked up here, in the parent: the child only calls it.
    """
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)
