"""The signals a scheduler sends before it kills a job (SIGTERM; SLURM's --signal=USR1): noted at once, acted
on after a step (mmkit.checkpoint.manager checkpoints, then the job exits 75, errors.Preempted).

Imports nothing heavy: run.py installs it before torch, so a signal that arrives while torch is imported
or the ranks join their process group is noted too (its default action ends the process unsaved).
"""

import signal
import sys


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
