"""certify in a project's own test suite: the `certify_resume` fixture (a pytest plugin, loaded by pytest
wherever the package is installed) and the plain function behind it.

    def test_my_training_resumes_exactly(certify_resume):
        certify_resume(["python", "train.py", "--out", "{run}"], stop_after=3,
                       resume="--resume {run}/ckpt_{step:04d}.pt")

A resume that is not exact fails the test with the verdict's line as the assertion message (first step,
rank and piece); one certify cannot judge fails it with certify's one line. Importing this module imports
neither torch nor the rest of certify: it runs the command in a process of its own.
"""

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def certify_resume(command, stop_after: int, resume: str = "", out=None, options=(), timeout: float = 3600) -> dict:
    """Run certify on COMMAND (a list, or a string split as a shell would) with its verdict in OUT (in a new
    temporary folder if None); return the verdict (verdict.json) if exact, else raise AssertionError whose
    message is the verdict's line."""
    if isinstance(command, str):
        command = shlex.split(command)
    out = Path(tempfile.mkdtemp(prefix="certify-")) / "out" if out is None else Path(out)
    argv = [sys.executable, "-m", "certkit", "--out", str(out), "--stop-after", str(stop_after),
            f"--resume={resume}", *map(str, options), "--", *map(str, command)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode in (0, 1):
        verdict = json.loads((Path(out) / "verdict.json").read_text())
        if proc.returncode == 0:
            return verdict
        raise AssertionError(proc.stdout.strip())
    said = [line for line in proc.stderr.splitlines() if line.startswith("certify: ")]
    raise AssertionError(said[-1] if said else f"certify exited {proc.returncode}: {proc.stderr[-2000:]}")


@pytest.fixture(name="certify_resume")
def certify_resume_fixture(tmp_path):
    """certify_resume with its verdict in the test's own tmp_path (a new folder for each call)."""
    calls = []

    def run(command, stop_after: int, resume: str = "", options=(), timeout: float = 3600) -> dict:
        calls.append(None)
        return certify_resume(command, stop_after, resume, tmp_path / f"certify{len(calls)}", options, timeout)

    return run
