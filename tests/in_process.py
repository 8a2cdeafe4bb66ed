"""run.py's checks called in the test's own process, without starting one: the same code path up to the first
step (mmkit.train.configure, then run.py's prepare), so a check that refuses a resume file or a setting raises
the very UserError whose text run.py prints as its one `error:` line.

What only a real process shows, the exit status, that the line is the last one, that nothing is written, is
left to one real-process test per command line (test_bad_input, test_resume_contents); the many cases of
each check run here, at a fraction of a second each instead of a process start and a model build.
"""

import signal

import pytest
from conftest import script_module

from mmkit.errors import UserError
from mmkit.parallel import start
from mmkit.train import configure


def _load_run_py():
    """workflow/scripts/run.py as a module. Importing it installs the training job's SIGTERM/SIGUSR1 handlers
    (mmkit.preemption, first thing): this process is pytest's, so its own handlers are put back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        return script_module("run.py")
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


RUN_PY = _load_run_py()


def until_first_step(*argv):
    """`run.py ARGV` in this process, up to its first step: (live, plan, expected, last step)."""
    args = RUN_PY.parse_args([str(a) for a in argv])
    cfg, stop_at, device = configure(args.config, args.stop_at, args.options)
    ranks = start(cfg.parallel, device, args.rank_generators)
    try:
        return RUN_PY.prepare(args, cfg, stop_at, device, ranks)
    finally:
        ranks.close()


def refusal(*argv) -> str:
    """The line `run.py ARGV` refuses to start with (after its `error: `); fails if it would start, or if it
    would end in a traceback instead (any other exception: run.py's exit 1, not its one line and exit 2)."""
    try:
        until_first_step(*argv)
    except UserError as e:
        assert type(e) is UserError, f"{type(e).__name__}: run.py would exit {e.exit_code}, not 2"
        assert "\n" not in str(e), f"more than one line: {e}"
        return str(e)
    except Exception as e:  # noqa: BLE001 - what run.py would print as a traceback
        pytest.fail(f"run.py would end in a traceback, not one error line: {type(e).__name__}: {e}")
    pytest.fail("run.py would start: nothing refused it")
