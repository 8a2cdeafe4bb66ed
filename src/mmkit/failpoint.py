"""Fault injection for the tests: MMKIT_FAILPOINT=<name>:<rank>[:<signal>] sends that rank a signal at that point.

The signal is SIGKILL unless named (TERM, USR1); REFUSE instead makes that rank refuse what it is checking
there (a UserError), as a rank whose view of a file differs would. A SIGKILL is what preemption's last resort
and the OOM killer send: no handler runs, no file is closed. The tests use it to prove that a killed save leaves
the previous state intact and that the other ranks do not hang; a SIGTERM inside a save proves that the save
still finishes whole. MMKIT_FAILPOINT=slow=<seconds> makes every step that much longer on every rank, so that
a test can catch a tiny job running (on SLURM). Unset (always, outside the tests), it costs one dictionary
lookup.
"""

import os
import signal
import time

from .errors import UserError


def failpoint(name: str) -> None:
    """Signal this process here if MMKIT_FAILPOINT names this point and this rank (torchrun's RANK, else 0)."""
    point = os.environ.get("MMKIT_FAILPOINT")
    if point is None:
        return
    if point.startswith("slow=") and name.startswith("step"):
        time.sleep(float(point.removeprefix("slow=")))
        return
    at, _, sig = point.partition(f"{name}:{os.environ.get('RANK', '0')}")
    if at == "" and sig == ":REFUSE":
        raise UserError(f"failpoint {name}: refused on this rank")
    if at == "" and sig in ("", ":TERM", ":USR1"):
        os.kill(os.getpid(), getattr(signal, f"SIG{sig[1:]}") if sig else signal.SIGKILL)
