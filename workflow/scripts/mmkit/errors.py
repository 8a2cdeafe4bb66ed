"""The errors a user can fix: scripts print them as a single line and exit non-zero (2; 3 for NaN/Inf)."""

import sys

# called after main() returns: the config loader logs which keys the job read
AT_SUCCESS = []


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
        print(f"preempted: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    for callback in AT_SUCCESS:
        callback()
