"""torchrun, as the training jobs start their ranks: preempted ranks end the job with exit 75.

  python torchrun.py --standalone --nproc-per-node 2 run.py ARGS   (torchrun's own arguments, unchanged)

Plain torchrun handles SIGTERM, SIGINT, SIGHUP and SIGQUIT: it passes the signal on to its ranks, waits for
them (--shutdown-timeout, 30 s by default) and exits 1. SIGUSR1, which SLURM sends before a time limit
(the profile's --signal=USR1@60), it does not handle at all: it dies of it, leaving its ranks behind. And
exit 1 says nothing of why the ranks stopped. So here torchrun also handles SIGUSR1 (its own
--signals-to-handle, whose help names SIGUSR1 "used in SLURM environments"), the ranks checkpoint after
their step and exit 75 (mmkit.errors.Preempted), and so does the job, as a one-process job would: a
Snakemake retry or a SLURM requeue continues it from the checkpoint. Only then: each rank leaves how it
ended in a folder of this launcher's (mmkit.errors.record_exit), and a rank that failed, or was killed
before it could say (inside its checkpoint, after the shutdown timeout), ends the job with its own status
and line, so that a real error is not retried forever.
"""

import os
import signal
import sys
import tempfile
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

from mmkit.errors import RANK_EXITS

SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's default, and SLURM's warning
PREEMPTED = 75  # EX_TEMPFAIL: what a preempted rank exits with


def local_ranks(argv: list) -> int:
    for i, arg in enumerate(argv):
        for flag in ("--nproc-per-node", "--nproc_per_node"):
            if arg == flag:
                return int(argv[i + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return 1


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rank-exits-") as folder:
        os.environ[RANK_EXITS] = folder  # each rank leaves there how it ended (mmkit.errors.record_exit)
        try:
            torchrun(["--signals-to-handle", SIGNALS, *sys.argv[1:]])  # a later --signals-to-handle still wins
        except SignalException as e:  # passed on to the ranks, which were given the shutdown timeout to end
            return verdict(f"{e.sigval.name} passed on to the ranks", Path(folder), local_ranks(sys.argv[1:]))
        except ChildFailedError as e:  # a rank got the signal itself (SLURM signals every process of the step)
            codes = {rank: f.exitcode for rank, f in e.failures.items()}
            return verdict(f"the ranks exited {', '.join(map(str, sorted(set(codes.values()))))}", Path(folder),
                           local_ranks(sys.argv[1:]), codes)
    return 0


def verdict(what: str, folder: Path, ranks: int, reported: dict | None = None) -> int:
    """75 if every rank ended preempted, its checkpoint committed (or finished: 0); else the first other rank's
    status and line. Once one rank has exited 75, torchrun sends the others SIGTERM: one still on its way
    out (past the commit every rank waits for before any exits 75) reports -15, and counts as preempted."""
    ended = {}
    for rank in range(ranks):
        path = folder / f"rank{rank}"
        if path.exists():
            code, _, line = path.read_text().strip().partition(" ")
            ended[rank] = (int(code), line)
        else:
            ended[rank] = ((reported or {}).get(rank, 1), "left no exit status: killed, or crashed outside the loop")
    preempted = any(code == PREEMPTED for code, _ in ended.values())
    failed = [(rank, code, line) for rank, (code, line) in ended.items()
              if code not in (0, PREEMPTED) and not (preempted and code == -signal.SIGTERM)]
    if not failed:
        code = PREEMPTED if preempted else 0
        print(f"torchrun: {what}; every rank {'preempted' if preempted else 'done'}: exit {code}", file=sys.stderr)
        return code
    rank, code, line = failed[0]
    code = code if code > 0 else 1
    print(f"torchrun: {what}; rank {rank} was not preempted ({line}): exit {code}", file=sys.stderr)
    return code

if __name__ == "__main__":
    sys.exit(main())
