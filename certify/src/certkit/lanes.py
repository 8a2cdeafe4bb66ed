"""Runs side by side, compared as they go: the straight run in one lane, the stopped and then the resumed run
in the other; their certificates read while the recorders write them, and the runs ended at the first
difference once the verdict can no longer change.

How many lanes: --jobs N, or what the machine allows (default_jobs): two where the CPUs hold two runs'
threads, one on a machine with a GPU (two runs would share it) or for a command that launches processes of
its own (torchrun's fixed rendezvous port; the user says --jobs 2 where the command takes a free one).
"""

import os
import threading
from pathlib import Path

from . import diagnosis, progress, verdict

# commands that start several processes and may claim a fixed port (torchrun's default 29500) or a device
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "mpirun", "mpiexec", "srun", "torch.distributed.run",
             "torch.distributed.launch", "lightning")
EARLY_TRIES = 3  # looks at a parted verdict whose cause is not yet known before the runs are left to end


def gpu_visible(env=os.environ) -> bool:
    """Whether the runs would find a GPU: a CUDA or ROCm device node, not hidden by CUDA_VISIBLE_DEVICES=""."""
    if env.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/kfd"))


def threads_per_run(env=os.environ, cpus: int | None = None) -> int:
    """The threads one run computes on: OMP_NUM_THREADS, or torch's default of one per CPU."""
    try:
        return max(1, int(env.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return cpus or 1


def default_jobs(command: list, env=os.environ, cpus: int | None = None) -> tuple[int, str]:
    """(lanes, why) for COMMAND on this machine when --jobs is not given."""
    cpus = cpus or len(os.sched_getaffinity(0))
    if gpu_visible(env):
        return 1, "a GPU is visible (--jobs 2 runs two runs on it at once)"
    launcher = next((w for w in command if os.path.basename(w) in LAUNCHERS or w in LAUNCHERS), None)
    if launcher:
        return 1, f"{os.path.basename(launcher)} starts processes of its own, maybe on a fixed port (--jobs 2 if not)"
    threads = threads_per_run(env, cpus)
    lanes = max(1, min(2, cpus // threads))
    return lanes, f"{cpus} CPUs, {threads} thread{'s' * (threads != 1)} a run"


class Tail:
    """A run's certificate read as its recorders write it: the whole lines added since the last look."""

    def __init__(self, folder: Path):
        self.folder, self.offsets, self.rows, self.killed = folder, {}, {}, {}

    def read(self) -> tuple[dict, dict]:
        for path in sorted(self.folder.glob("rank*.jsonl")):
            rows, self.offsets[path] = progress.new_rows(path, self.offsets.get(path, 0))
            for row in rows:
                if "killed" in row:
                    self.killed[row["rank"]] = row["killed"]
                elif "step" in row:
                    self.rows.setdefault(row["rank"], {})[row["step"]] = row
        return self.rows, self.killed


def cut(straight: dict, resumed: dict, ended: int, kill_at: int) -> tuple[dict, dict]:
    """The rows a verdict ended at step ENDED is judged on: the straight run's through ENDED and the stopped
    run's steps (through KILL_AT - 1, which the determinism check compares), the resumed run's through ENDED."""
    return verdict.truncated(straight, max(ended, kill_at - 1)), verdict.truncated(resumed, ended)


def early_end(straight: dict, stopped: dict, killed: dict, resumed: dict, start: int, kill_at: int, stop_after: int,
              out: Path) -> int | None:
    """The step the runs may end at, the verdict known: where every rank has parted (verdict.parted) and the
    rows up to there already name a cause (diagnosis.diagnose on them); None otherwise, and the runs go on to
    the end, so that a cause only later steps show (batches skipped ahead: the straight run's later samples)
    is found. A function of the certificates and what the runs kept, so the verdict is the same whenever the
    runs were ended."""
    parted = verdict.parted(straight, stopped, resumed, start, kill_at)
    if parted is None:
        return None
    straight, resumed = cut(straight, resumed, parted, kill_at)
    found = verdict.judge(straight, stopped, resumed, killed, stop_after, resumed_from=start)
    if not found["deterministic"] or found["exact"]:
        return None
    why = diagnosis.diagnose(found, straight, resumed, out)
    return parted if why and any(c["class"] != "unknown" for c in why["causes"]) else None


class Stream(threading.Thread):
    """The resumed run compared with the straight run while both write: a line per look at the steps newly
    compared ("steps 5-9: equal so far"), the first difference the moment it shows; with EARLY, STOP set once
    the verdict and a cause are known (early_end)."""

    def __init__(self, out: Path, stop_after: int, kill_at: int, stop: threading.Event, early: bool, stream=None):
        super().__init__(name="certify-stream", daemon=True)
        self.k, self.kill_at, self.stop, self.early, self.stream = stop_after, kill_at, stop, early, stream
        self.out, self.tries = out, 0
        self.straight, self.stopped, self.resumed = (Tail(out / name) for name in ("straight", "stopped", "resumed"))
        self.said, self.first, self.done = stop_after, None, threading.Event()

    def run(self) -> None:
        try:
            while not self.done.wait(0.5) and not self.look():
                pass
        except Exception as e:  # noqa: BLE001  (the comparison as they go is progress; the verdict is judged after)
            progress.say(self.stream, f"the comparison as the runs go stopped ({type(e).__name__}: {e}); the "
                         "verdict is judged when they end")

    def finish(self) -> None:
        self.done.set()
        self.join()

    def look(self) -> bool:
        """One look at the certificates; True once the runs were told to stop."""
        straight, _ = self.straight.read()
        stopped, killed = self.stopped.read()
        resumed, _ = self.resumed.read()
        if not straight or not resumed or not killed or set(resumed) - set(straight):
            return False
        start = verdict.real_start(straight, resumed, self.k)
        resumed = verdict.relabelled(resumed, self.k, start)
        ignore = verdict.unseeded_rngs(straight, stopped)
        upto = min(min(max(straight[r]), max(resumed.get(r, {-1: None}))) for r in straight)
        steps = range(max(self.said, start) + 1, upto + 1)
        if self.first is None and steps:
            self.first = verdict.first_difference(straight, resumed, steps, ignore)
            equal = range(steps[0], self.first["step"] if self.first else steps[-1] + 1)
            if equal:
                progress.say(self.stream, f"step{'s' * (len(equal) > 1)} {equal[0]}"
                             + (f"-{equal[-1]}" if len(equal) > 1 else "") + ": equal so far")
            if self.first:
                progress.say(self.stream, f"step {self.first['step']}: {verdict.NAMES[self.first['piece']]} differ"
                             f" at rank {self.first['rank']}: the resume is not exact")
            self.said = steps[-1]
        if not self.early or self.first is None or self.tries >= EARLY_TRIES:
            return False
        if verdict.parted(straight, stopped, resumed, start, self.kill_at) is None:
            return False
        # what the runs kept may still be in writing at the first looks: a few tries, then the runs go on
        self.tries += 1
        if early_end(straight, stopped, killed, resumed, start, self.kill_at, self.k, self.out) is None:
            return False
        self.stop.set()
        return True
