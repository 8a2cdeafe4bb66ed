"""The one door for checkpoints: a training job saves and loads its state through a CheckpointManager,
whichever form the resume takes (one file: world size 1, DDP; or under FSDP2 a directory of DCP shards,
mmkit.checkpoint.dcp) and whichever path it comes by.

  with CheckpointManager(live, cfg.checkpoint, folder, preemption) as checkpoints:
      checkpoints.load(expected, resume, options)  # --resume NAME, then the newest checkpoint of this run
      for step in train(...):
          checkpoints.after_step(step, last_step)  # periodic (checkpoint.every, or auto) and on a signal
      checkpoints.save(out, weights_only)          # the job's own output: its resume file, or its weights
  checkpoints.done()                               # its folder's checkpoints go (unless keep_when_done)

The manager holds the job's folder (mmkit.checkpoint.folder; none without --checkpoint-dir), the interval
(checkpoint.every: a number of steps, or auto: AutoInterval), background saves (checkpoint.async: one in
flight at most, `pending`, committed before the next begins and before older checkpoints go, and the host
buffers its snapshots reuse), and preemption: after a SIGTERM/SIGUSR1 it saves in the foreground and raises
errors.Preempted (exit 75), so a retry or a requeue continues from that checkpoint.

Below it, the functions the manager calls, which the workflow's other scripts call too:
  save(live, path)            -> what to commit(): only then is it the real one (wait(): its bytes written;
                                 in_background: by a thread, from a snapshot, while training goes on)
  read(path)                  -> the resume's entries, each of its type, of this code's format
  resume(path, live, ...)     -> a new run continues from a resume: fingerprint, every entry checked, put back
  auto_resume(folder, live, ...) -> a restarted run continues from the newest checkpoint of its own
"""

import contextlib
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from .. import fingerprint
from ..ablations import ResumeOptions
from ..atomic import sha256_file
from ..errors import Preempted, UserError
from ..failpoint import failpoint
from ..parallel import weights
from . import entries
from .files import host_snapshot, load_file, save_atomic
from .folder import CheckpointConfig, CheckpointDir


def is_dir(path) -> bool:
    return Path(path).is_dir() or str(path).endswith(".dcp")


def _dcp():
    """mmkit.checkpoint.dcp, imported only for a directory: torch.distributed.checkpoint adds most of a second
    to the start of every process that would otherwise never touch it."""
    from . import dcp

    return dcp


def describe(path) -> str:
    return f"resume {'directory' if is_dir(path) else 'file'} {path}"


# --- saving ----------------------------------------------------------------------------------------


class PendingFile:
    """A resume file being saved (dcp.PendingSave: a directory's). commit(): it is on disk, on every rank.

    In the background, rank 0's thread writes a snapshot (a host copy of every tensor, taken before save()
    returned) through the same atomic, durable save_atomic as the foreground save, so the bytes are the same
    and a kill during the write leaves the previous checkpoint. wait() only joins that thread."""

    def __init__(self, ranks, path, state=None, in_background=False):
        self.ranks, self.path, self.error, self.thread, self.cpu_seconds = ranks, path, None, None, 0.0
        if state is not None and in_background:
            self.thread = threading.Thread(target=self._write, args=(state,), name="checkpoint-writer", daemon=True)
            self.thread.start()
        elif state is not None:
            save_atomic(entries.seal(state), path)

    def _write(self, state) -> None:
        t0 = time.thread_time()
        try:
            save_atomic(entries.seal(state), self.path)
        except BaseException as e:  # raised in the loop's thread, at wait()
            self.error = e
        self.cpu_seconds = time.thread_time() - t0  # what it could take from training (every: auto's measure)

    def writing(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            if self.error is not None:
                raise self.error

    def commit(self) -> None:
        self.wait()
        self.ranks.barrier(after_save=True)  # no rank goes on before the file is committed


def save(live: entries.TrainingState, path, in_background: bool = False, buffers: list | None = None):
    """The live state's resume to PATH, to commit(): the file (rank 0, after every rank finished the step), or
    under FSDP2 the directory (every rank its shards). IN_BACKGROUND: training goes on while it is written.

    BUFFERS: the host storages of the previous snapshot, refilled by this one (a fresh 300 MB costs its page
    faults at every checkpoint); the caller has committed the save that read them (CheckpointManager.pending:
    one in flight at most)."""
    state, ranks = entries.resume_state(live), live.ranks
    if ranks.sharded:
        return _dcp().save_resume_dir(state, path, ranks, async_save=in_background)
    ranks.barrier()
    if not ranks.main:
        return PendingFile(ranks, path)
    # a file holds host tensors on every device, so the foreground and the background save write the same bytes
    on_host = all(t.device.type == "cpu" for t in tensors(state))
    if in_background or not on_host:
        state = host_snapshot(state, pin=not on_host, reuse=buffers)
    return PendingFile(ranks, path, state, in_background)


def tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors(v)


# --- reading ---------------------------------------------------------------------------------------


def read(path) -> dict:
    """A resume's entries, of this code's format, each of the right type (shards of a directory: verified,
    not loaded)."""
    if is_dir(path):
        state = _dcp().read_resume_dir(path)
    else:
        state = entries.check_types(load_file(path, "resume file"), entries.NAMES, f"resume file {path}")
    return state


def identity(path) -> str:
    """What identifies the resume a run started from: the file, or a directory's resume.pth (which holds the
    sha256 of every shard file)."""
    return sha256_file(Path(path) / _dcp().META if is_dir(path) else path)


def checked_by_storage(path) -> tuple:
    """A directory's sharded entries are checked shard by shard as they load (dcp.load_sharded), after the
    manifest's sha256 and the dtypes .metadata records (read)."""
    return tuple(e.name for e in entries.ENTRIES if e.sharded) if is_dir(path) else ()


def put(path, saved: dict, live: entries.TrainingState, skip=(), same_run: bool = False) -> None:
    """Every entry not in SKIP into LIVE: a directory's sharded entries straight from its shards."""
    if is_dir(path):
        _dcp().load_sharded(path, live.model, live.optimizer, live.ranks, entries.updates_of(saved),
                            load_optimizer="optimizer" not in skip)
        skip = tuple(skip) + checked_by_storage(path)
    entries.put(saved, live, skip, same_run)


# --- continuing ------------------------------------------------------------------------------------


def resume(path, live: entries.TrainingState, expected, options: ResumeOptions = ResumeOptions()) -> None:
    """A new run continues from the resume at PATH: its fingerprint compared, every entry checked against
    EXPECTED (mmkit.data.Expected), then put into LIVE, except what the OPTIONS' ablations throw away;
    each ablation then applies what it does instead (mmkit.ablations)."""
    swap = [Path(f"{path}{end}") for end in (".tmp", ".old")]
    if live.ranks.main and not Path(path).exists() and any(p.is_dir() for p in swap):
        recovered(path)  # a --save-resume onto this name, killed in its directory swap
    live.ranks.barrier()
    source = describe(path)
    if live.ranks.sharded and not is_dir(path):
        raise UserError(f"resume file {path} holds whole tensors; an fsdp2 run continues from a resume "
                        "directory (.dcp), or continue this file under ddp or on one rank")
    saved = read(path)
    fingerprint.check(saved["fingerprint"], live.fingerprint, source, options.allow_mismatch, options.reshard)
    drops = options.drops()
    for name in drops:
        print(f"resume: ignoring entry '{name}' of {path}", file=sys.stderr)
    entries.check(saved, entries.Checking(live, expected, f"resume file {path}"),
                  skip=drops + checked_by_storage(path))
    put(path, saved, live, skip=drops)
    for ablation in options.ablations:
        ablation.apply(live, saved, expected)
    # AdamW's counter as it now stands: behind the step after --no-optim, ahead of it after a rescale
    live.adamw_offset = live.step - live.skipped_steps - entries.adamw_updates(live.optimizer)
    live.origin = {"resume_sha256": identity(path), "ablations": options.flags()}


def recovered(path) -> None:
    """PATH as a re-save's directory swap onto it left it, made whole (dcp.recover), with a line."""
    done = _dcp().recover(path)
    if done:
        print(f"checkpoints: {done}", file=sys.stderr, flush=True)


def tidy(checkpoints) -> None:
    """Rank 0, before auto-resume reads a checkpoint folder: each interrupted swap finished or undone, then
    what killed saves left removed."""
    for name in checkpoints.interrupted_swaps():
        recovered(name)
    checkpoints.clear_unfinished()


def auto_resume(checkpoints, live: entries.TrainingState, expected) -> bool:
    """Continue from the newest checkpoint of this very run (its fingerprint and origin); True if one was found.

    A torn, damaged or foreign checkpoint is skipped with a warning naming it, and the next older one tried.
    Every rank takes rank 0's list and every verdict is agreed: a checkpoint one rank refuses, all skip.
    """
    ranks = live.ranks
    if ranks.main:
        tidy(checkpoints)
    for path in ranks.share(checkpoints.checkpoints()):
        refusal = None
        try:
            saved = read(path)
            fingerprint.check(saved["fingerprint"], live.fingerprint, f"checkpoint {path}")
            if saved["origin"] != live.origin:
                raise UserError(f"checkpoint {path} is of another run: origin {saved['origin']}, "
                                f"this run's {live.origin}")
            ctx = entries.Checking(live, expected, f"resume file {path}")
            entries.check(saved, ctx, skip=checked_by_storage(path))
            failpoint(f"verdict-{Path(path).name}")  # the tests make one rank refuse it here
        except UserError as e:
            refusal = e
        refused = ranks.any(refusal is not None)
        if not refused:
            try:
                put(path, saved, live, same_run=True)  # a directory's shards are checked as they load, alike
            except UserError as e:
                refusal, refused = e, True
        if refused:
            if ranks.main:
                print(f"warning: skipping checkpoint {path}: {refusal or 'refused by another rank'}",
                      file=sys.stderr, flush=True)
            checkpoints.reject(path)
            continue
        if ranks.main:
            print(f"resume: continuing from checkpoint {path} (step {saved['step']})", file=sys.stderr, flush=True)
        return True
    return False


class CheckpointManager:
    """A training job's every save and load (the module's docstring shows the calls, in order)."""

    def __init__(self, live, cfg: CheckpointConfig, folder=None, preemption=None):
        self.dir = CheckpointDir(folder, cfg) if folder else None
        self.cfg, self.live, self.ranks, self.preemption = cfg, live, live.ranks, preemption
        self.auto = AutoInterval(cfg.overhead) if self.dir and cfg.every == "auto" else None
        self.pending = None  # the one save in flight: a checkpoint still being written in the background
        self.buffers = []  # its snapshot's host storages, refilled by the next one once it is committed
        # when the step began, and whether a background write was in flight then (every: auto's measure)
        self.t_step, self.overlapped = time.perf_counter(), False

    # --- loading ----------------------------------------------------------------------------------

    def load(self, expected, source=None, options: ResumeOptions = ResumeOptions()) -> None:
        """Where the first step starts: from SOURCE (--resume: a resume file or directory, checked against
        EXPECTED and put back, the OPTIONS' ablations applied), then from the newest checkpoint of this very
        run in the folder, if it has one (a restart of a killed job)."""
        if source:
            resume(source, self.live, expected, options)
        # what the ablations shifted (the data position, the LR schedule) stays shifted after a restart
        expected.rewound_from(self.live.step, self.live.batches.position, options.restarts_schedule)
        if self.dir:
            auto_resume(self.dir, self.live, expected)

    # --- saving -----------------------------------------------------------------------------------

    def save(self, path, weights_only: bool = False) -> None:
        """The job's own output, committed on every rank when this returns: its resume at PATH (--stop-at), or
        WEIGHTS_ONLY the weights file (the model's state_dict, gathered from every rank's shards)."""
        if self.pending:  # a periodic checkpoint's background write: one save in flight at most
            self.commit()
        if weights_only:
            final = weights(self.live.model, self.ranks)
            if self.ranks.main:
                save_atomic(final, path)
            self.ranks.barrier()
        else:
            save(self.live, path, self.cfg.async_save, self.buffers).commit()

    def after_step(self, step: int, last_step: int) -> None:
        """A checkpoint after STEP if one is due or a signal came (then Preempted, once it is committed)."""
        if self.auto:
            self.auto.stepped(time.perf_counter() - self.t_step, self.overlapped)
        preempted = self.preemption.requested(self.ranks) and step < last_step
        if self.dir and (preempted or self.due(step, last_step)):
            path = self.checkpoint(step, in_background=self.cfg.async_save and not preempted)
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

    def checkpoint(self, step: int, in_background: bool) -> Path:
        """The checkpoint after STEP, into the job's folder."""
        t_save = time.perf_counter()
        if self.pending:  # the next snapshot refills the buffers the previous write reads: it waits for its commit
            self.commit()
        path = self.dir.new_path(step, self.ranks.sharded)
        self.pending = save(self.live, path, in_background, self.buffers)
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
