"""Saving and loading a resume, whichever form it takes: one file (world size 1, DDP) or, under FSDP2, a
directory of DCP shards (mmkit.sharded). The loop asks "save" and "load"; this module knows the files.

  save(live, path)            -> what to commit(): only then is it the real one (wait(): its bytes written;
                                 in_background: by a thread, from a snapshot, while training goes on)
  read(path)                  -> the resume's entries, each of its type, of this code's format
  resume(path, live, ...)     -> a new run continues from a resume: fingerprint, every entry checked, put back
  auto_resume(folder, live, ...) -> a restarted run continues from the newest checkpoint of its own
"""

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from . import fingerprint, resume as entries
from .ablations import ResumeOptions
from .atomic import sha256_file
from .checkpoint import host_snapshot, load_file, save_atomic
from .errors import UserError
from .failpoint import failpoint


def is_dir(path) -> bool:
    return Path(path).is_dir() or str(path).endswith(".dcp")


def _sharded():
    """mmkit.sharded, imported only for a directory: torch.distributed.checkpoint adds most of a second to
    the start of every process that would otherwise never touch it."""
    from . import sharded

    return sharded


def describe(path) -> str:
    return f"resume {'directory' if is_dir(path) else 'file'} {path}"


# --- saving ----------------------------------------------------------------------------------------


class PendingFile:
    """A resume file being saved (sharded.PendingSave: a directory's). commit(): it is on disk, on every rank.

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


def save(live: entries.TrainingState, path, in_background: bool = False):
    """The live state's resume to PATH, to commit(): the file (rank 0, after every rank finished the step), or
    under FSDP2 the directory (every rank its shards). IN_BACKGROUND: training goes on while it is written."""
    state, ranks = entries.resume_state(live), live.ranks
    if ranks.sharded:
        return _sharded().save_resume_dir(state, path, ranks, async_save=in_background)
    ranks.barrier()
    if not ranks.main:
        return PendingFile(ranks, path)
    # a file holds host tensors on every device, so the foreground and the background save write the same bytes
    on_host = all(t.device.type == "cpu" for t in tensors(state))
    if in_background or not on_host:
        if _SNAPSHOT.pending is not None:  # its write reads the buffers this snapshot refills
            _SNAPSHOT.pending.wait()
        state = host_snapshot(state, pin=not on_host, reuse=_SNAPSHOT.buffers)
    pending = PendingFile(ranks, path, state, in_background)
    _SNAPSHOT.pending = pending if in_background else None
    return pending


# one save in flight at most: the last snapshot's host storages, refilled by the next once its write is done
_SNAPSHOT = SimpleNamespace(buffers=[], pending=None)


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
        state = _sharded().read_resume_dir(path)
    else:
        state = entries.check_types(load_file(path, "resume file"), entries.NAMES, f"resume file {path}")
    return state


def identity(path) -> str:
    """What identifies the resume a run started from: the file, or a directory's resume.pth (which holds the
    sha256 of every shard file)."""
    return sha256_file(Path(path) / _sharded().META if is_dir(path) else path)


def checked_by_storage(path) -> tuple:
    """A directory's sharded entries are checked shard by shard as they load (mmkit.sharded.load_sharded),
    after the manifest's sha256 and the dtypes .metadata records (read)."""
    return tuple(e.name for e in entries.ENTRIES if e.sharded) if is_dir(path) else ()


def put(path, saved: dict, live: entries.TrainingState, skip=(), same_run: bool = False) -> None:
    """Every entry not in SKIP into LIVE: a directory's sharded entries straight from its shards."""
    if is_dir(path):
        _sharded().load_sharded(path, live.model, live.optimizer, live.ranks, entries.updates_of(saved),
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
    """PATH as a re-save's directory swap onto it left it, made whole (mmkit.sharded.recover), with a line."""
    done = _sharded().recover(path)
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
