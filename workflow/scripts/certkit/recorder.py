"""The recorder: a row per optimizer step of an unmodified training process, and the kill of a stopped run.

Loaded by certkit/site/sitecustomize.py once the process imports torch, it registers torch's global hooks
and nothing else; they observe and never change what the process computes:
  - a forward pre-hook and forward hook on every module: what the outermost module with trainable
    parameters received, under grad mode, since the last step (several forwards under accumulation);
  - an optimizer step pre-hook: the RNG states, the gradients, each group's LR; at CERTIFY_KILL_AT, the kill;
  - an optimizer step post-hook: the parameters and the optimizer state after the update, the GradScaler's
    scale; then the row is written (CERTIFY_RECORD/rank<R>.jsonl, a line per step, flushed).

Samples are what the model received, not what a DataLoader yielded: Accelerate and Lightning read a batch
ahead, and Accelerate's resume reads the batches it skips, so a loader's yield moves in time between a
straight and a resumed run while the model's inputs do not. A DataLoader worker's random draws reach the
model inside the batch, so they show as samples.

  CERTIFY_RECORD       the folder of this run's certificates (unset: the recorder stays out of the way)
  CERTIFY_STEP_OFFSET  the step the process starts after (a resumed run: K)
  CERTIFY_KILL_AT      SIGKILL the process group at this step's pre-hook, before its update
"""

import json
import os
import signal
import threading
import weakref
from pathlib import Path

from . import digest

PIECES = ("samples", "rng_torch", "rng_numpy", "rng_python", "rng_cuda", "gradients", "scale", "lr", "optimizer",
          "params")


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


class Recorder:
    def __init__(self, folder: str, offset: int = 0, kill_at: int | None = None):
        self.folder, self.step, self.kill_at = Path(folder), offset, kill_at
        self.inputs, self.row, self.file = [], None, None
        self.local = threading.local()  # forward nesting depth, per thread
        self.trainable = weakref.WeakKeyDictionary()
        self.scalers, self.handles = (), []

    def install(self) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [register_module_forward_pre_hook(self._enter),
                        register_module_forward_hook(self._leave, with_kwargs=True, always_call=True),
                        register_optimizer_step_pre_hook(self._before_step),
                        register_optimizer_step_post_hook(self._after_step)]
        if not hasattr(torch.amp.GradScaler, "_certify_scalers"):
            scaler_init = torch.amp.GradScaler.__init__

            def init(scaler, *args, **kwargs):  # only to know which scalers exist
                scaler_init(scaler, *args, **kwargs)
                torch.amp.GradScaler._certify_scalers.add(scaler)

            torch.amp.GradScaler._certify_scalers = weakref.WeakSet()
            torch.amp.GradScaler.__init__ = init
        self.scalers = torch.amp.GradScaler._certify_scalers

    def remove(self) -> None:
        """The hooks taken out again (the bench times steps with and without them in one process)."""
        for handle in self.handles:
            handle.remove()

    # --- the model's inputs ----------------------------------------------------------------------

    def _enter(self, module, args) -> None:
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth == 0:
            self.local.outer = self._is_training_call(module)

    def _leave(self, module, args, kwargs, output) -> None:
        self.local.depth -= 1
        if self.local.depth == 0 and self.local.outer:
            self.inputs.append(digest.of_object([args, kwargs]))

    def _is_training_call(self, module) -> bool:
        import torch

        if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:  # eval, or a recompute in backward
            return False
        if module not in self.trainable:
            self.trainable[module] = any(p.requires_grad for p in module.parameters())
        return self.trainable[module]

    # --- the optimizer step ----------------------------------------------------------------------

    def _before_step(self, optimizer, args, kwargs) -> None:
        if self.row is not None:  # an optimizer stepping another inside its own step: one row
            return
        step = self.step + 1
        if self.kill_at is not None and step >= self.kill_at:
            self._write({"killed": step})
            os.fsync(self.file.fileno())
            os.killpg(os.getpgrp(), signal.SIGKILL)  # every rank, its launcher and its workers, unsaved
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.row = {"step": step, "samples": digest.of_object(self.inputs), "forwards": len(self.inputs),
                    **digest.rng_states(), "gradients": digest.of_tensors(p.grad for p in params),
                    "lr": [float(group["lr"]) for group in optimizer.param_groups], "optimizer_at": optimizer}
        self.inputs = []

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.row is None or self.row["optimizer_at"] is not optimizer:
            return
        row, self.row = self.row, None
        del row["optimizer_at"]
        row["optimizer"] = digest.of_object(optimizer.state_dict()["state"])
        row["params"] = digest.of_tensors(p for group in optimizer.param_groups for p in group["params"])
        scales = [s.get_scale() for s in self.scalers if s.is_enabled()]
        if scales:
            row["scale"] = scales
        self.step = row["step"]
        self._write(row)

    def _write(self, row: dict) -> None:
        if self.file is None:
            rank = _rank()
            self.folder.mkdir(parents=True, exist_ok=True)
            self.file = open(self.folder / f"rank{rank}.jsonl", "w")
            self.rank = rank
        self.file.write(json.dumps({"rank": self.rank, **row}) + "\n")
        self.file.flush()


def from_environment() -> Recorder | None:
    folder = os.environ.get("CERTIFY_RECORD")
    if not folder:
        return None
    kill_at = os.environ.get("CERTIFY_KILL_AT")
    return Recorder(folder, int(os.environ.get("CERTIFY_STEP_OFFSET", 0)), int(kill_at) if kill_at else None)
