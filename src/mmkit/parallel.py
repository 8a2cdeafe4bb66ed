"""Several ranks under torchrun: the process group, each rank's share of the global batch, the wrapped model.

The training loop asks a Ranks object what to do and never branches on the world size itself. At world
size 1 nothing here touches torch.distributed: no process group, no wrapper, no launcher.

The data design: batch_size is the GLOBAL batch. Every rank draws the same global batch from the run's one
generator and trains on its own contiguous slices of it, so the data position is one generator state,
the same on every rank and independent of how many ranks there are. The global batch is cut into
batch_slices micro-batches (one per rank by default); a rank accumulates its slices, each loss scaled so
that the update is the mean over all slices. Keeping batch_slices fixed while the world size changes
keeps every sum in the same order: that is what makes resharding 2 <-> 1 ranks bit-exact.
"""

import contextlib
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from .errors import UserError

# a rank that dies mid-step leaves the others waiting in a collective: they give up after this long
# (torchrun usually tears the group down much sooner, when it sees the dead rank's exit)
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
# ... except while rank 0 hashes and fsyncs a whole checkpoint, which takes as long as the state is big
SAVE_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True)
class ParallelConfig:
    world_size: int = 1
    strategy: str = "ddp"  # ddp | fsdp2
    backend: str = "auto"  # auto | gloo | nccl
    batch_slices: int | None = None  # None: one per rank

    @property
    def slices(self) -> int:
        return self.batch_slices or self.world_size


@dataclass
class Ranks:
    """This process's place among the ranks of one training job."""

    world_size: int
    rank: int
    strategy: str  # "single" at world size 1
    slices: int  # micro-batches per global batch, across all ranks
    rank_generators: bool = False  # the ablation: each rank draws its own batches, seeded seed + rank
    _save_group: object = field(default=None, repr=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp2"

    @property
    def slices_per_rank(self) -> int:
        return self.slices // self.world_size

    @property
    def loss_scale(self) -> float:
        # DDP and FSDP divide the summed gradient by world_size; this makes the update the mean over slices
        return self.world_size / self.slices

    def micro_batches(self, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's contiguous micro-batches of a batch (the global one, or its own with rank_generators)."""
        n = self.slices_per_rank if self.rank_generators else self.slices
        first = 0 if self.rank_generators else self.rank * self.slices_per_rank
        xs, ys = x.chunk(n), y.chunk(n)
        return [(xs[i], ys[i]) for i in range(first, first + self.slices_per_rank)]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world_size == 1:
            return model
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:  # one all-gather per block, as torchtitan shards a LLaMA
                fully_shard(layer)
            return fully_shard(model)
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def grad_sync(self, model, last: bool):
        """Reduce gradients across ranks only after a rank's last micro-batch (accumulate until then)."""
        if self.world_size == 1:
            return contextlib.nullcontext()
        if self.sharded:
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else model.no_sync()

    def sum(self, value: float) -> float:
        """The sum over ranks of a number (in float64: the logged loss is summed like this at any world size)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return t.item()

    def any(self, flag: bool) -> bool:
        """Whether FLAG is true on any rank."""
        if self.world_size == 1:
            return flag
        t = torch.tensor([int(flag)])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def share(self, obj):
        """Rank 0's OBJ, on every rank: what all ranks must decide alike (which checkpoint to continue)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self.save_group())
        return box[0]

    def save_group(self):
        """A gloo group for saves: on the default group DCP's background collectives would meet the training's
        own (DDP's all-reduce, FSDP's reduce-scatter) in another order and deadlock; and its collectives wait
        SAVE_TIMEOUT, as long as a commit on rank 0 may take, where the training's give up after a minute."""
        if self._save_group is None:
            self._save_group = torch.distributed.new_group(backend="gloo", timeout=SAVE_TIMEOUT)
        return self._save_group

    def barrier(self, after_save: bool = False) -> None:
        """Every rank here; AFTER_SAVE: waiting for rank 0 to commit a checkpoint (SAVE_TIMEOUT)."""
        if self.world_size > 1:
            torch.distributed.barrier(group=self.save_group() if after_save else None)

    def close(self) -> None:
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def backend_for(cfg: ParallelConfig, device: str) -> str:
    """The process group's backend: auto is nccl on CUDA, gloo on the CPU."""
    return cfg.backend if cfg.backend != "auto" else ("nccl" if device == "cuda" else "gloo")


def start(cfg: ParallelConfig, device: str, rank_generators: bool = False) -> Ranks:
    """Join the job's process group (torchrun sets WORLD_SIZE and RANK); at world size 1 join nothing."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != cfg.world_size:
        raise UserError(f"config key 'parallel.world_size' is {cfg.world_size} but this job was launched with "
                        f"{launched} ranks (torchrun --nproc-per-node {cfg.world_size})")
    if cfg.world_size == 1:
        return Ranks(1, 0, "single", cfg.slices, rank_generators)
    backend = backend_for(cfg, device)
    if backend == "nccl" and device != "cuda":
        raise UserError("config key 'parallel.backend': nccl needs a CUDA device, and this job runs on cpu")
    rank = int(os.environ["RANK"])
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.distributed.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return Ranks(cfg.world_size, rank, cfg.strategy, cfg.slices, rank_generators)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards the model in place and has no wrapper)."""
    return getattr(model, "module", model)


def model_state(model, ranks: Ranks) -> dict:
    """The model's state as a resume holds it: whole tensors, or this rank's shards (FSDP2)."""
    if ranks.sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model)
    return unwrap(model).state_dict()


def optimizer_state(model, optimizer, ranks: Ranks) -> dict:
    """AdamW's state as a resume holds it: per parameter index, or keyed by name with this rank's shards."""
    if ranks.sharded:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer)
    return optimizer.state_dict()


def weights(model, ranks: Ranks) -> dict:
    """The whole model's state_dict, as a weights file holds it (under FSDP2 gathered on rank 0)."""
    if ranks.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap(model).state_dict()
