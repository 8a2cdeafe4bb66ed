"""Every process a run starts, ended with it, and the signals that stop certify.

A run lives in a session of its own, but what it starts may leave it: a helper that double-forks and calls
setsid (a daemon) outlives its parent and its process group. certify makes itself the child subreaper of
all it starts (Linux), so such an orphan is re-parented to certify rather than to init; after each run it
finds every descendant through /proc's parent ids, SIGKILLs it and reaps it, none left running and none
left a zombie. SIGTERM, SIGHUP and SIGINT raise errors.Interrupted in certify's main thread, except inside
held(), which acts on them once the processes are ended or the files renamed.
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

from .errors import Interrupted

PR_SET_CHILD_SUBREAPER = 36
STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_stops = {"held": 0, "came": None}
_counting = threading.Lock()  # held() is entered from the threads that run --jobs' resumes


def become_subreaper() -> bool:
    """Whether the orphans of what certify starts now come to certify instead of init."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parents() -> dict:
    """{pid: its parent's pid} of every process in /proc (none where there is no /proc)."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        line = f.read()
                except OSError:  # it ended meanwhile
                    continue
                fields = line[line.rfind(b")") + 2:].split()  # after the name, which may hold spaces and ')'
                found[int(entry)] = int(fields[1])
    return found


def descendants(root: int, spared=frozenset()) -> list:
    """ROOT's children, theirs and so on, leaving out SPARED and what descends from them."""
    children = {}
    for pid, parent in parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in spared:
                found.append(child)
                todo.append(child)
    return found


def owned_by(pid: int, marker: bytes) -> bool:
    """Whether process PID's environment holds MARKER (NAME=VALUE), which every process a run starts
    inherits: a daemon that left the run's session and process group is still known by it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def end_descendants(spared=frozenset(), patience: float = 30.0, owner: bytes | None = None) -> list:
    """Every descendant of this process but SPARED (with OWNER: only those whose environment holds it, the
    runs that go on beside one left alone) SIGKILLed and reaped: looked for again until /proc shows none (a
    killed parent's children come to certify as orphans); what is still there after PATIENCE seconds (a
    process stuck in the kernel) is returned."""
    me, deadline = os.getpid(), time.monotonic() + patience
    while True:
        found = [pid for pid in descendants(me, spared) if owner is None or owned_by(pid, owner)]
        if not found or time.monotonic() > deadline:
            return found
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in found:
            with contextlib.suppress(ChildProcessError):  # a grandchild: its parent reaps it, or dies first
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)


def stopped(signum, frame) -> None:
    if _stops["held"]:
        _stops["came"] = _stops["came"] or signum
        return
    raise Interrupted(signum)


def catch_stops() -> None:
    """SIGTERM, SIGHUP and SIGINT raise errors.Interrupted: certify then ends its run and says so."""
    for signum in STOPS:
        signal.signal(signum, stopped)


def ignore_stops() -> None:
    """Once interrupted: a second signal must not cut short the one line that says so."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def held():
    """A stop signal that comes inside takes effect at the end: a run's processes are ended and reaped
    whole, a verdict's files renamed together."""
    with _counting:
        _stops["held"] += 1
    try:
        yield
    finally:
        with _counting:
            _stops["held"] -= 1
            signum = _stops["came"] if not _stops["held"] else None
            _stops["came"] = None if signum else _stops["came"]
        if signum:
            raise Interrupted(signum)
