"""What certify says while it works, on stderr: a line as each run starts and as it ends (its exit, the steps
its certificate holds, its seconds), and meanwhile the steps its recorder has written (rank 0's certificate):
on a terminal one line redrawn in place, in a log a line at most every LOG_EVERY seconds.

Every such line begins PREFIX, so that certify's own one-line errors stay the only lines of stderr that
begin `certify: `; the verdict's line goes to stdout.
"""

import json
import shlex
import signal
import sys
import time
from pathlib import Path

PREFIX = "[certify] "
LOG_EVERY = 30.0
LONGEST_COMMAND = 160  # characters of the command shown as a run starts


def new_rows(path: Path, offset: int) -> tuple[list, int]:
    """The rows (JSON objects) of the whole lines a recorder wrote to PATH past OFFSET, and the offset after
    them: a line still being written waits for the next look, a line that is no object is skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    whole = data[:data.rfind(b"\n") + 1]
    rows = []
    for line in whole.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + len(whole)


class Watch:
    """One run's progress, from its start to its end."""

    def __init__(self, name: str, certificate: Path, argv: list, stream=None, redraw: bool = True):
        """REDRAW: on a terminal, one line redrawn in place (not while other runs write theirs: --jobs)."""
        self.stream = stream or sys.stderr
        self.tty = redraw and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = 0.5 if self.tty else 2.0  # seconds between looks at the certificate
        self.name, self.rows, self.offset, self.first, self.last = name, certificate / "rank0.jsonl", 0, None, None
        self.began = self.said = time.monotonic()
        self.drawn = False
        command = shlex.join(map(str, argv))
        if len(command) > LONGEST_COMMAND:
            command = command[:LONGEST_COMMAND - 3] + "..."
        self.say(f"{name} run started: {command}")

    def read(self) -> None:
        """The steps rank 0's recorder wrote since the last look."""
        rows, self.offset = new_rows(self.rows, self.offset)
        for row in rows:
            if isinstance(row.get("step"), int):
                self.first = row["step"] if self.first is None else self.first
                self.last = row["step"]

    def poll(self) -> None:
        before = self.last
        self.read()
        now = time.monotonic()
        if self.last is None or (self.last == before and not self.tty):
            return
        line = f"{self.name} run: step {self.last} ({now - self.began:.0f} s)"
        if self.tty:
            self.write("\r\x1b[K" + PREFIX + line)
            self.drawn = True
        elif now - self.said >= LOG_EVERY:
            self.say(line)

    def ended(self, code: int | None) -> None:
        """CODE: the run's exit status; None where certify ended it (--timeout, a signal to certify)."""
        self.read()
        steps = "no step" if self.last is None else f"steps {self.first}-{self.last}"
        self.say(f"{self.name} run ended: {how(code)}, {steps}, {time.monotonic() - self.began:.1f} s")

    def say(self, line: str) -> None:
        self.write(("\r\x1b[K" if self.drawn else "") + PREFIX + line + "\n")
        self.drawn, self.said = False, time.monotonic()

    def write(self, text: str) -> None:
        write(self.stream, text)


def say(stream, line: str) -> None:
    """A line of certify's own, not one run's (the runs compared as they go: lanes.Stream); STREAM: stderr."""
    write(stream or sys.stderr, PREFIX + line + "\n")


def write(stream, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed terminal: certify carries on without telling
        pass


def how(code: int | None) -> str:
    if code is None:
        return "stopped by certify"
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"
