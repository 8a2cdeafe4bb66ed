"""The one error type a user can fix: scripts print it as a single line and exit non-zero."""

import sys

# called after main() returns: the config loader logs which keys the job read
AT_SUCCESS = []


class UserError(Exception):
    """Bad input (a config value, a token file, a checkpoint) described in one line."""


def run_cli(main) -> None:
    """Run main(); turn a UserError into one line on stderr and exit status 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for callback in AT_SUCCESS:
        callback()
