"""Surviving preemption: a job's own checkpoint folder, and the signals a scheduler sends before it kills.

A training job writes a resume file every checkpoint.every steps into its folder (step_000040.pth, or
step_000040.dcp under FSDP2), keeps the newest checkpoint.keep of its own, and on start continues from the
newest one that is of its own run. What it skipped there (another run's checkpoints, damaged ones) goes
once it has committed one of its own: never before, so that a folder is never left with none. On SIGTERM
or SIGUSR1 (what SLURM sends before it kills or requeues a job) it finishes the step it is in,
checkpoints, and exits with status 75 (errors.Preempted), so a retry or a requeue picks it up. The folder is never an output Snakemake knows of: a failed job's outputs are deleted, the
folder must survive exactly then.
"""

import math
import re
import shutil
import signal
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

NAME = re.compile(r"^step_(\d{6,})\.(pth|dcp)$")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int | str = 0  # steps between periodic checkpoints; 0 = only on a signal; "auto": AutoInterval
    keep: int = 2  # the newest this many stay
    keep_when_done: bool = False  # a finished job removes its folder unless this is set
    async_save: bool = False  # write it in the background while training goes on (checkpoint.async)
    overhead: float = 0.02  # every: auto keeps the checkpoints' stall at most this share of the training time


MARK = ".mmkit-made-this-folder"  # a folder a job created: once empty of its checkpoints, it may go


class CheckpointDir:
    """One training job's folder of periodic resume files. The folder may hold other files (the user named a
    folder they already had): the job only ever removes its own step_* entries and what its saves left, never
    follows a symlink, and removes the folder itself only if a job created it and nothing else is in it."""

    def __init__(self, path, cfg: CheckpointConfig):
        self.path, self.cfg = Path(path), cfg
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--checkpoint-dir {path} is a file, not a folder")
        self.auto = AutoInterval(cfg.overhead) if cfg.every == "auto" else None
        # the checkpoints auto-resume skipped (another run's, or damaged): never counted among the newest
        # `keep`, which are this run's own; they go once this run has committed a checkpoint of its own
        self.rejected: list[Path] = []

    def new_path(self, step: int, sharded: bool) -> Path:
        """Where the checkpoint after STEP goes (the folder is made on first use, and marked as made)."""
        if not self.path.is_dir():
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / MARK).touch()
        path = self.path / f"step_{step:06d}.{'dcp' if sharded else 'pth'}"
        self.rejected = [p for p in self.rejected if p != path]  # replaced by this run's own
        return path

    def due(self, step: int, last_step: int) -> bool:
        """A periodic checkpoint after STEP? Never after the last one: the job's own output follows. Under
        every: auto, rank 0's clock decides (mmkit.parallel.Ranks.any makes it every rank's)."""
        if step >= last_step:
            return False
        if self.auto:
            return self.auto.due(step)
        return self.cfg.every > 0 and step % self.cfg.every == 0

    def checkpoints(self) -> list[Path]:
        """The committed checkpoints, newest first (a .tmp is a save that never finished)."""
        if not self.path.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.path.iterdir() if (m := NAME.match(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    def unfinished(self) -> list[Path]:
        """What killed saves left behind (step_*.tmp, step_*.old): never a checkpoint."""
        if not self.path.is_dir():
            return []
        return [p for p in self.path.iterdir() if p.name.startswith("step_") and p.suffix in (".tmp", ".old")]

    def interrupted_swaps(self) -> list[Path]:
        """The names a re-save's directory swap left without its directory (a .tmp or .old beside nothing):
        mmkit.sharded.recover makes them whole before the leftovers go."""
        names = {p.with_suffix("") for p in self.unfinished() if p.name.endswith((".dcp.tmp", ".dcp.old"))}
        return sorted(n for n in names if not n.exists())

    def clear_unfinished(self) -> None:
        for p in self.unfinished():
            try:
                remove(p)
            except OSError as e:
                raise UserError(f"cannot remove {p}, left by a save that never finished: {e.strerror} "
                                f"(the checkpoint folder {self.path} must be writable)") from None

    def reject(self, path: Path) -> None:
        self.rejected.append(Path(path))

    def prune(self) -> None:
        """After a commit of this run's: the rejected checkpoints go, then all but the newest `keep` of the
        rest (this run's, and the older ones auto-resume did not need to look at)."""
        rejected = [p for p in self.rejected if p.exists()]
        if rejected:
            for p in rejected:
                remove(p)
            print(f"checkpoints: removed {len(rejected)} not of this run or damaged "
                  f"({', '.join(p.name for p in rejected)}), now that it has committed its own", file=sys.stderr)
        self.rejected = []
        for p in self.checkpoints()[self.cfg.keep:]:
            remove(p)

    def finish(self) -> None:
        """The job is done: its checkpoints go, unless checkpoint.keep_when_done, and the folder too if a job
        made it and nothing else is in it."""
        if self.cfg.keep_when_done or not self.path.is_dir():
            return
        own = self.checkpoints() + self.unfinished()
        for p in own:
            remove(p)
        left = [p.name for p in self.path.iterdir() if p.name != MARK]
        if (self.path / MARK).exists() and not left:
            (self.path / MARK).unlink()
            self.path.rmdir()
            print(f"checkpoints: removed {self.path} (the job is done)", file=sys.stderr)
        else:
            print(f"checkpoints: removed {len(own)} of this job's entries from {self.path} (the job is done; "
                  f"{len(left)} other entries left as they were)", file=sys.stderr)


def remove(p: Path) -> None:
    """A checkpoint or a save's leftover: a symlink is unlinked, never followed."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


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


class Preemption:
    """Notes a SIGTERM or SIGUSR1; the loop asks after each step. A second signal changes nothing, so a save
    under way finishes (it is atomic anyway: a SIGKILL during it leaves the previous checkpoint)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received, self.said = None, False
        for s in self.SIGNALS:
            signal.signal(s, self._note)

    def _note(self, signum, frame):
        # only a flag: a handler that prints could land inside another print and deadlock on its lock
        if self.received is None:
            self.received = signal.Signals(signum).name

    def requested(self, ranks) -> bool:
        """Whether any rank got a signal: all ranks stop after the same step."""
        if self.received and not self.said:
            self.said = True
            print(f"preemption: {self.received} received; checkpointing after this step", file=sys.stderr,
                  flush=True)
        return ranks.any(self.received is not None)
