"""torchrun, as the training jobs start their ranks: preempted ranks end the job with exit 75.

  python torchrun.py --standalone --nproc-per-node 2 run.py ARGS   (torchrun's own arguments, unchanged)

Plain torchrun handles SIGTERM, SIGINT, SIGHUP and SIGQUIT: it passes the signal on to its ranks, waits for
them (--shutdown-timeout, 30 s by default) and exits 1. SIGUSR1, which SLURM sends before a time limit
(the profile's --signal=USR1@60), it does not handle at all: it dies of it, leaving its ranks behind. And
exit 1 says nothing of why the ranks stopped. So here torchrun also handles SIGUSR1 (its own
--signals-to-handle, whose help names SIGUSR1 "used in SLURM environments"), the ranks checkpoint after
their step and exit 75 (mmkit.errors.Preempted), and so does the job, as a one-process job would: a
Snakemake retry or a SLURM requeue continues it from the checkpoint.
"""

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's default, and SLURM's warning
PREEMPTED = 75  # EX_TEMPFAIL: what a preempted rank exits with


def main() -> int:
    try:
        torchrun(["--signals-to-handle", SIGNALS, *sys.argv[1:]])  # a later --signals-to-handle still wins
    except SignalException as e:  # passed on to the ranks, which checkpointed within the shutdown timeout
        print(f"torchrun: {e.sigval.name} passed on to the ranks; exit {PREEMPTED}", file=sys.stderr)
        return PREEMPTED
    except ChildFailedError as e:  # a rank got the signal itself (SLURM signals every process of the step)
        codes = sorted({f.exitcode for f in e.failures.values()})
        print(f"torchrun: the ranks exited {', '.join(map(str, codes))}", file=sys.stderr)
        # once one rank has exited, torchrun sends the others SIGTERM: a rank still on its way out then
        # reports -15, after the checkpoint that every rank waits for before any exits 75
        return PREEMPTED if PREEMPTED in codes and set(codes) <= {PREEMPTED, -signal.SIGTERM} else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
