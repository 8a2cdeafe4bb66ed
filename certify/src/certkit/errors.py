"""What ends a certify run without a verdict: CannotJudge (exit 2, one line why), its kinds a caller tells apart
without reading the text (StraightFailed, ResumeFailed), and Interrupted (a signal)."""

from pathlib import Path


class CannotJudge(Exception):
    """Why certify could not judge, in one line; LOG: the log whose last lines say more."""

    def __init__(self, why: str, log: Path | None = None):
        super().__init__(why)
        self.log = log


class StraightFailed(CannotJudge):
    """The straight run exited non-zero: the command does not run here."""


class ResumeFailed(CannotJudge):
    """The resume did not run: it exited non-zero, made no optimizer step, or saved no checkpoint to go on from.
    For a framework's resume this is the answer (an audit cell's result), not certify's failure."""


class Interrupted(BaseException):
    """SIGTERM, SIGHUP or SIGINT came: a BaseException, as KeyboardInterrupt is, so that no `except Exception`
    on the way takes it for a failure of its own and carries on."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
