"""What ends a certify run without a verdict: CannotJudge (exit 2, one line why) and Interrupted (a signal)."""

from pathlib import Path


class CannotJudge(Exception):
    """Why certify could not judge, in one line; LOG: the log whose last lines say more."""

    def __init__(self, why: str, log: Path | None = None):
        super().__init__(why)
        self.log = log


class Interrupted(BaseException):
    """SIGTERM, SIGHUP or SIGINT came: a BaseException, as KeyboardInterrupt is, so that no `except Exception`
    on the way takes it for a failure of its own and carries on."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
