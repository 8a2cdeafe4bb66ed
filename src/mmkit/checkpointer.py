"""The checkpoint policy of a training job, in one object the loop calls once after every step.

A Checkpointer holds the job's folder (mmkit.checkpoint_dir; none without --checkpoint-dir), the interval
(checkpoint.every: a number of steps, or auto: AutoInterval), background saves and their commit
(checkpoint.async: one in flight at most, committed before the next begins and before older checkpoints
go), and preemption: after a SIGTERM/SIGUSR1 it saves in the foreground and raises errors.Preempted
(exit 75), so a retry or a requeue continues from that checkpoint.

  with Checkpointer(folder, cfg.checkpoint, live, preemption) as checkpointer:
      checkpointer.resume_newest(expected)      # auto-resume: the newest checkpoint of this run, if any
      for step in train(...):
          checkpointer.after_step(step, last_step)
  ...                                           # the job's own outputs
  checkpointer.done()                           # its checkpoints go (unless checkpoint.keep_when_done)
"""

import contextlib
import math
import statistics
import sys
import time

from . import store
from .checkpoint_dir import CheckpointConfig, CheckpointDir
from .errors import Preempted


class Checkpointer:
    def __init__(self, folder, cfg: CheckpointConfig, live, preemption):
        self.dir = CheckpointDir(folder, cfg) if folder else None
        self.cfg, self.live, self.ranks, self.preemption = cfg, live, live.ranks, preemption
        self.auto = AutoInterval(cfg.overhead) if self.dir and cfg.every == "auto" else None
        self.pending = None  # a checkpoint still being written in the background: one at most
        # when the step began, and whether a background write was in flight then (every: auto's measure)
        self.t_step, self.overlapped = time.perf_counter(), False

    def resume_newest(self, expected) -> bool:
        """Auto-resume: continue from the newest checkpoint of this very run in the folder, if there is one."""
        return bool(self.dir) and store.auto_resume(self.dir, self.live, expected)

    def after_step(self, step: int, last_step: int) -> None:
        """A checkpoint after STEP if one is due or a signal came (then Preempted, once it is committed)."""
        if self.auto:
            self.auto.stepped(time.perf_counter() - self.t_step, self.overlapped)
        preempted = self.preemption.requested(self.ranks) and step < last_step
        if self.dir and (preempted or self.due(step, last_step)):
            path = self.save(step, in_background=self.cfg.async_save and not preempted)
        if preempted:  # its checkpoint was saved in the foreground and is committed
            raise Preempted(f"{self.preemption.received or 'a signal to another rank'} after step {step} of "
                            f"{last_step}: " + (f"continue from {path}" if self.dir else
                                                "no --checkpoint-dir, nothing saved"))
        self.t_step = time.perf_counter()
        self.overlapped = self.pending is not None and self.pending.writing()

    def due(self, step: int, last_step: int) -> bool:
        """A periodic checkpoint after STEP? Never after the last one: the job's own output follows. Under
        every: auto rank 0's clock decides for every rank."""
        if step >= last_step:
            return False
        if self.auto:
            return self.ranks.any(self.ranks.main and self.auto.due(step))
        return self.cfg.every > 0 and step % self.cfg.every == 0

    def save(self, step: int, in_background: bool):
        t_save = time.perf_counter()
        if self.pending:  # the next snapshot waits for the previous commit
            self.commit()
        path = self.dir.new_path(step, self.ranks.sharded)
        self.pending = store.save(self.live, path, in_background)
        if not in_background:
            self.commit()
        if self.ranks.main:
            print(f"checkpoint: {path}{' (writing in the background)' if in_background else ''}",
                  file=sys.stderr, flush=True)
        if self.auto:
            self.auto.saved(step, time.perf_counter() - t_save, self.pending)
        return path

    def commit(self) -> None:
        """The pending checkpoint made whole: only then may older ones go."""
        pending, self.pending = self.pending, None
        pending.commit()
        if self.ranks.main:
            self.dir.prune()

    def __enter__(self):
        return self

    def __exit__(self, error_type, error, traceback):
        if self.pending and error is None:
            self.commit()
        elif self.pending:  # a failed run lets its last checkpoint's write finish (atomic either way); its error first
            with contextlib.suppress(Exception):
                self.pending.wait()

    def done(self) -> None:
        """The job's outputs are written: its checkpoints go, unless checkpoint.keep_when_done."""
        if self.dir and self.ranks.main:
            self.dir.finish()


class AutoInterval:
    """checkpoint.every: auto, as CheckFreq (FAST'21) chooses it: from measured costs, the fewest steps
    between checkpoints that keep their cost at most OVERHEAD of the training time.

    A checkpoint costs its stall (the time the loop stands still for it: waiting for the previous commit,
    the snapshot, a foreground write) plus what its background write took from training: what it slowed
    the steps it overlapped (their time beyond the median step begun with no write in flight), or, where
    that is less, the CPU time the writer thread used (on a busy machine the slowdown is lost in the
    noise of the steps; the CPU the write used is not). The first checkpoint comes after the
    process's second step (its first warms up); each later one once the previous one's cost is measured
    (its write done) and ceil(mean cost / (OVERHEAD * median step)) steps have passed since it. Where
    checkpoints land changes no bit of the run: only how much a kill costs."""

    def __init__(self, overhead: float):
        self.overhead, self.every, self.last, self.costs = overhead, None, None, []
        # step seconds: of steps begun with no write in flight, and with one (since the last checkpoint)
        self.clean, self.overlapped = [], []
        self.steps, self.stall, self.pending = 0, None, None  # of the last checkpoint, while its cost is unknown

    def stepped(self, seconds: float, overlapped: bool) -> None:
        self.steps += 1
        if overlapped:
            self.overlapped.append(seconds)
            return
        if self.steps > 1:  # the process's first step warms up
            self.clean.append(seconds)
        if self.stall is not None:  # this step began with the last write done: its cost is known
            self._measured()

    def due(self, step: int) -> bool:
        if self.last is None:
            return self.steps >= 2
        return self.every is not None and self.stall is None and step - self.last >= self.every

    def saved(self, step: int, stall: float, pending=None) -> None:
        self.last, self.stall, self.pending, self.overlapped = step, stall, pending, []

    def _measured(self) -> None:
        step_time = statistics.median_high(self.clean)
        slowdown = sum(max(0.0, s - step_time) for s in self.overlapped)
        writer = getattr(self.pending, "cpu_seconds", 0.0)
        self.costs.append(self.stall + max(slowdown, writer))
        every = max(1, math.ceil(sum(self.costs) / len(self.costs) / (self.overhead * step_time)))
        if every != self.every:
            print(f"checkpoint: every auto = {every} steps (the last checkpoint stalled the loop "
                  f"{self.stall * 1000:.0f} ms, its write slowed {len(self.overlapped)} steps by "
                  f"{slowdown * 1000:.0f} ms and used {writer * 1000:.0f} ms of CPU; a step takes "
                  f"{step_time * 1000:.0f} ms; overhead {self.overhead:g})",
                  file=sys.stderr, flush=True)
        self.every, self.stall, self.pending = every, None, None
