"""Fault injection for the tests: MMKIT_FAILPOINT=<name>:<rank> kills that rank with SIGKILL at that point.

A SIGKILL is what preemption and the OOM killer send: no handler runs, no file is closed. The tests
use it to prove that a killed save leaves the previous state intact and that the other ranks do not
hang. Unset (always, outside the tests), it costs one dictionary lookup.
"""

import os
import signal


def failpoint(name: str) -> None:
    """Kill this process here if MMKIT_FAILPOINT names this point and this rank (torchrun's RANK, else 0)."""
    if os.environ.get("MMKIT_FAILPOINT") == f"{name}:{os.environ.get('RANK', '0')}":
        os.kill(os.getpid(), signal.SIGKILL)
