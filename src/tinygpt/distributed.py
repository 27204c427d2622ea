"""Data-parallel training on several processes: torchrun's environment, the process group and the
few collectives the training loop needs.

Chapter 10 builds it; ``tinygpt.train`` calls it.

It handles:

* ``DistContext``: who this process is -- ``rank``, ``world_size``, ``local_rank``, ``is_main``
  -- and the device it computes on;
* ``distributed(device)``: a context manager. Launched by ``torchrun`` with more than one process
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in the environment), it joins the process group --
  ``gloo`` on the CPU, ``nccl`` on CUDA with device ``cuda:LOCAL_RANK`` -- and always leaves it
  again (``destroy_process_group`` in a ``finally``, on error too). Otherwise it initialises
  nothing and yields a one-process context, so an ordinary run is untouched;
* ``own_share``: every rank draws all ranks' micro-batches from one shared seeded stream and keeps
  its own, so ``N`` processes see exactly the windows one process with ``N`` times the
  accumulation would see;
* ``wrap_model`` (``DistributedDataParallel`` when there are several ranks), ``all_reduce_mean``
  (weighted mean of losses over ranks) and ``broadcast_flag`` (rank 0's decision for all).

Errors and hangs: a rank that raises leaves the group and exits non-zero; ``torchrun`` sees the
failed worker and stops the others (SIGTERM), so the run ends with the first error's traceback.
When no agent watches (processes started by hand), every collective and the start-up rendezvous
give up after ``timeout_s`` (default 300 s): gloo raises a ``RuntimeError`` on the waiting ranks,
NCCL's watchdog aborts them.

It does not launch processes (``torchrun`` does, also across machines with its rendezvous
options), shard the model (FSDP) or split the batch inside one process; each rank's RNG state in
a checkpoint is ``tinygpt.checkpoint.run_state``'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
DEFAULT_TIMEOUT_S = 300.0
Item = TypeVar("Item")


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run: ``rank`` of ``world_size``, its GPU ``local_rank`` on its
    machine, and its ``device``. The default is the single process of an ordinary run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """More than one process takes part."""
        return self.world_size > 1


def launched_by_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are all set (as torchrun does)."""
    env = os.environ if env is None else env
    return all(name in env for name in ENV_VARS)


def is_main_process(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process should print and save: rank 0 of torchrun, or a single process."""
    env = os.environ if env is None else env
    return env.get("RANK", "0").strip() in ("", "0")


def context_from_env(device: torch.device, env: Mapping[str, str] | None = None) -> DistContext:
    """The ``DistContext`` torchrun's variables describe; CUDA becomes ``cuda:LOCAL_RANK``."""
    env = os.environ if env is None else env
    values = {}
    for name in ENV_VARS:
        raw = env.get(name, "")
        if not raw.strip().isdigit():
            raise ValueError(f"environment variable {name} must be an integer >= 0, got {raw!r}")
        values[name] = int(raw)
    rank, world, local = values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]
    if world < 1 or rank >= world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} need 0 <= RANK < WORLD_SIZE")
    if world > 1 and device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={local}, but this machine has "
                             f"{torch.cuda.device_count()} CUDA devices; start at most that many "
                             "processes per node (torchrun --nproc_per_node)")
        device = torch.device("cuda", local)
    elif world > 1 and device.type != "cpu":
        raise ValueError(f"data-parallel training runs on 'cpu' (gloo) or 'cuda' (nccl), not on "
                         f"{device.type!r}")
    return DistContext(rank=rank, world_size=world, local_rank=local, device=device)


@contextmanager
def distributed(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S
                ) -> Iterator[DistContext]:
    """Yield this process's ``DistContext``, inside a process group when torchrun started several.

    Without torchrun's variables, or with ``WORLD_SIZE=1``, nothing is initialised. A process
    group that already exists (made by the caller) is used and left alone; one made here is
    destroyed on the way out, whether the body returned or raised.
    """
    if not launched_by_torchrun():
        yield DistContext(device=device)
        return
    ctx = context_from_env(device)
    if not ctx.is_distributed:
        yield ctx
        return
    import torch.distributed as dist

    made_here = not dist.is_initialized()
    if made_here:
        _init_group(ctx, timeout_s)  # gloo on CPUs, nccl on GPUs
    try:
        _check_group(ctx)
        yield ctx
    finally:
        if made_here and dist.is_initialized():
            dist.destroy_process_group()


def _init_group(ctx: DistContext, timeout_s: float) -> None:
    """Join torchrun's rendezvous and create the default process group for ``ctx``."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torchrun started several processes, but this torch build has no "
                           "torch.distributed support")
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    # torchrun's store outlives a process group: a group made again in the same process
    # (a second train() call) gets a fresh key prefix, or it would meet the old one's keys
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    n = store.add(f"tinygpt/rank{ctx.rank}/groups", 1)  # the same count on every rank
    dist.init_process_group("nccl" if ctx.device.type == "cuda" else "gloo",
                            store=dist.PrefixStore(f"tinygpt/group{n}", store),
                            rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=timeout_s))


def _check_group(ctx: DistContext) -> None:
    """A clear error if the process group disagrees with torchrun's environment."""
    import torch.distributed as dist

    if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
        raise RuntimeError(f"the process group has rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, the environment says {ctx.rank} of "
                           f"{ctx.world_size}")


def own_share(draw: Callable[[], Item], ctx: DistContext) -> Item:
    """Call ``draw()`` once per rank, in rank order, and return this rank's result.

    Every rank holds the same seeded generator, so all of them draw the same global micro-batches
    and micro-batch ``rank`` is this rank's share: the global batch is exactly what one process
    drawing ``world_size`` micro-batches in a row would get.
    """
    for _ in range(ctx.rank):  # the shares of the ranks before this one
        draw()
    mine = draw()
    for _ in range(ctx.rank + 1, ctx.world_size):  # and after it
        draw()
    return mine


def wrap_model(model: nn.Module, ctx: DistContext) -> nn.Module:
    """``DistributedDataParallel(model)`` with several ranks (it averages the gradients during
    ``backward``), the model itself otherwise. The wrapper shares the model's parameters."""
    if not ctx.is_distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


class DDPHandle:
    """Forwards calls and ``no_sync()`` to a DDP wrapper until ``data_parallel`` lets go of it
    (sets ``ddp`` to None)."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.ddp: DistributedDataParallel | None = ddp

    def _wrapper(self) -> DistributedDataParallel:
        if self.ddp is None:
            raise RuntimeError("this DDP handle was used after its `with data_parallel(...)`")
        return self.ddp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper()(*args, **kwargs)

    def no_sync(self) -> AbstractContextManager[object]:
        return self._wrapper().no_sync()


def no_sync(net: nn.Module | DDPHandle) -> AbstractContextManager[object]:
    """``net.no_sync()`` on several ranks (this backward keeps its gradients local, to be
    all-reduced with a later one's); nothing to do for the plain model of one process."""
    return net.no_sync() if isinstance(net, DDPHandle) else nullcontext()


@contextmanager
def data_parallel(model: nn.Module, ctx: DistContext) -> Iterator[nn.Module | DDPHandle]:
    """``wrap_model(model, ctx)`` for the length of a ``with``: on several ranks, a handle on the
    DDP wrapper that lets go of it on the way out. DDP holds the process group; freed after the
    group is destroyed (an error's traceback keeps the caller's locals alive), gloo can hang."""
    if not ctx.is_distributed:
        yield model
        return
    wrapped = cast("DistributedDataParallel", wrap_model(model, ctx))  # distributed: it wraps
    handle = DDPHandle(wrapped)
    del wrapped
    try:
        yield handle
    finally:
        handle.ddp = None


def all_reduce_mean(values: Mapping[str, float], ctx: DistContext, weight: float = 1.0
                    ) -> dict[str, float]:
    """The mean of each value over ranks, weighting this rank's by ``weight`` (e.g. the number of
    batches it evaluated; a rank with weight 0 adds nothing). One process: ``values`` unchanged."""
    if not ctx.is_distributed:
        return dict(values)
    import torch.distributed as dist

    names = sorted(values)
    sums = [values[n] * weight if weight else 0.0 for n in names] + [float(weight)]
    t = torch.tensor(sums, dtype=torch.float64, device=ctx.device)  # (len(names) + 1,)
    dist.all_reduce(t)  # sum over ranks
    if t[-1].item() <= 0:
        raise ValueError("all_reduce_mean: the weights of all ranks sum to 0")
    return {n: (t[i] / t[-1]).item() for i, n in enumerate(names)}


def broadcast_flag(flag: bool, ctx: DistContext) -> bool:
    """Rank 0's ``flag`` on every rank (so that all ranks take the same branch)."""
    if not ctx.is_distributed:
        return flag
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=ctx.device)
    dist.broadcast(t, src=0)
    return bool(t.item())
