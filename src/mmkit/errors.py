"""The errors a user can fix: scripts print them as a single line and exit non-zero (2; 3 for NaN/Inf), and
Preempted, not an error: a job stopped by its scheduler after checkpointing exits 75 (EX_TEMPFAIL)."""

import argparse
import os
import sys

# called after main() returns: the config loader logs which keys the job read
AT_SUCCESS = []


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, except that a bad command line is one line and exit 2, as every other bad input
    (argparse prints the usage first: two lines, or more)."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message} (--help lists the options)\n")


class UserError(Exception):
    """Bad input (a config value, a token file, a checkpoint) described in one line."""

    exit_code = 2


class NonFiniteError(UserError):
    """Training met a NaN or Inf loss or gradient: its own exit status, so schedulers can tell it apart."""

    exit_code = 3


class Preempted(Exception):
    """Not an error: a scheduler asked the job to stop, and it checkpointed. Its own exit status (75,
    EX_TEMPFAIL: try again), so a retry or a requeue continues it."""

    exit_code = 75


def run_cli(main) -> None:
    """Run main(); turn a UserError into one line on stderr and exit status 2."""
    try:
        main()
    except Preempted as e:
        leave(e.exit_code, f"preempted: {e}")
    except UserError as e:
        leave(e.exit_code, f"error: {e}")
    record_exit(0, "done")
    for callback in AT_SUCCESS:
        callback()


def leave(code: int, line: str) -> None:
    print(line, file=sys.stderr)
    record_exit(code, line)
    sys.exit(code)


# torchrun.py's folder where each local rank leaves how it ended: the job exits 75 only if every rank did
RANK_EXITS = "MMKIT_RANK_EXITS"


def record_exit(code: int, line: str) -> None:
    folder = os.environ.get(RANK_EXITS)
    if folder:
        with open(os.path.join(folder, f"rank{os.environ.get('LOCAL_RANK', '0')}"), "w") as f:
            f.write(f"{code} {line}\n")
