"""A training job's own folder of checkpoints: where each goes, which are committed, which go when.

A job writes a resume file into it every checkpoint.every steps (step_000040.pth, or step_000040.dcp under
FSDP2), keeps the newest checkpoint.keep of its own, and on start continues from the newest one of its own
run (mmkit.checkpoint.manager.auto_resume). What it skipped there (another run's checkpoints, damaged ones) goes once it
has committed one of its own: never before, so that a folder is never left with none. The folder is never
an output Snakemake knows of: a failed job's outputs are deleted, the folder must survive exactly then.
When to save is mmkit.checkpoint.manager's to decide.
"""

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

NAME = re.compile(r"^step_(\d{6,})\.(pth|dcp)$")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int | str = 0  # steps between checkpoints; 0 = only on a signal; "auto": mmkit.checkpoint.manager measures
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
        for folder in (self.path, *self.path.parents):  # made at the first save: refused now, not steps later
            if folder.is_symlink() and not folder.exists():
                raise UserError(f"--checkpoint-dir {path}: {folder} is a symlink to {folder.readlink()}, which does "
                                "not exist")
            if folder.exists():
                if not folder.is_dir():
                    raise UserError(f"--checkpoint-dir {path}: {folder} is a file, not a folder")
                break
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
        mmkit.checkpoint.dcp.recover makes them whole before the leftovers go."""
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
