"""The pytest plugin that records how each test ended (pytest -p outcomes), and which tree a test run ran: what
make test leaves for make mutants (tests/mutants.py), so that the test run does not import the mutation tool.
"""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

OUTCOMES = "MMKIT_MUTANTS_OUTCOMES"  # where the plugin below writes one JSON line per test phase
# make test records here what it ran (tree.sha256), how each test ended (outcomes.jsonl, by the plugin below)
# and where its tiny pipeline is (pipeline): make mutants takes them as its baseline and its shared pipeline
# when the tree is the same, instead of building and running them again
TEST_RECORD = REPO / ".test-record"
RECORD = "MMKIT_TEST_RECORD"  # set by make test: conftest writes tree.sha256 and pipeline there
STOP = "MMKIT_MUTANTS_STOP"  # set: end the pytest run at the first assertion that catches the breakage


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """How each test ended, and on what exception where (one JSON line per phase, to $MMKIT_MUTANTS_OUTCOMES)."""
    report = (yield).get_result()
    path = os.environ.get(OUTCOMES)
    if not path or (report.when != "call" and report.passed):
        return
    exc = call.excinfo.type if call.excinfo else None
    assertion = (report.when == "call" and report.failed and exc is not None
                 and issubclass(exc, (AssertionError, pytest.fail.Exception)))
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash else str(report.longrepr or "")
    record = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
              "exception": exc.__name__ if exc else None, "assertion": assertion,
              "at": f"{os.path.relpath(crash.path)}:{crash.lineno}" if crash else None,
              "message": (message.strip().splitlines() or [""])[0][:150]}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if assertion and os.environ.get(STOP):
        item.session.shouldstop = "the breakage is caught"


def tracked_files() -> list:
    return subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()


def tree_digest() -> str:
    """The sha256 of every tracked (or untracked, not ignored) file's name and bytes: which code a test run ran."""
    h = hashlib.sha256()
    for f in sorted(tracked_files()):
        if (REPO / f).is_file():
            h.update(f.encode() + b"\0" + (REPO / f).read_bytes() + b"\0")
    return h.hexdigest()
