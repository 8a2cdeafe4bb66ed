"""The workflow's scripts started in a fraction of a second: forked from a server that imported torch and mmkit.

`python run.py` spends about 2.5 s of CPU importing torch, torch.distributed and mmkit before its first
line; the tests start such scripts hundreds of times, and the suite was mostly that. Here each start
forks a server process (multiprocessing's forkserver) that has done those imports once and never ran a
tensor operation (so no thread pool is forked). The child is still a process of its own, as
`python SCRIPT ARGS` would be: its own memory, pid, exit status and signals, its working directory and
environment, stdin /dev/null, stdout and stderr to the caller. What a fork cannot give, environment
variables that torch or OpenMP read once at import or at the first operation (ATEN_CPU_CAPABILITY,
OMP_NUM_THREADS, ...), falls back to a real `python SCRIPT`.

The tests that build the pipeline with Snakemake, and every torchrun launch, start fresh interpreters as
before: the bit-exact pairs of the pipeline are made by plain processes.
"""

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# imported by the server once, before any fork: what the scripts import, torch.distributed.checkpoint included,
# and torch._dynamo, which torch imports at a process's first optimizer call (torch/_compile.py: the optimizer's
# methods are wrapped in _disable_dynamo, which imports it then): 1.2 s of CPU, most of a forked run.py's time
PRELOAD = ["torch", "numpy", "yaml", "jsonschema", "torch.distributed.checkpoint", "torch._dynamo", "mmkit.config",
           "mmkit.checkpoint.manager", "mmkit.train", "mmkit.data", "mmkit.export", "mmkit.report", "mmkit.checkpoint.dcp",
           "mmkit.parallel"]
# read by torch, OpenMP or MKL when they are loaded or first used, not when a script runs: a fork would
# carry the server's values, so a start that sets them differently runs a fresh interpreter
READ_AT_LOAD = ("ATEN_", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_", "PYTORCH_", "PYTHON")

_context = None


def _server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _forkable(env: dict) -> bool:
    def at_load(e):
        return {k: v for k, v in e.items() if k.startswith(READ_AT_LOAD)}
    return at_load(env) == at_load(os.environ)


def _child(script: str, args: list, cwd: str, env: dict, stdout: str, stderr: str, status: str) -> None:
    """In the forked process: become `python SCRIPT ARGS` in CWD with ENV, writing to the two paths; the exit
    status it ends with also goes to the file STATUS (see Started.wait)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, stdout, os.O_WRONLY), (2, stderr, os.O_WRONLY)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).parent)  # as `python SCRIPT` puts the script's folder first
    code = 1  # an exception: multiprocessing's status for it
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        raise
    finally:
        Path(status).write_text(f"{code}\n")


class _Follow:
    """The lines of a file that a running process writes, as they come, until it has ended."""

    def __init__(self, path, ended):
        self._file, self._ended, self._partial = open(path), ended, ""

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while True:
            ended = self._ended()  # before reading: what it wrote before ending is read below
            self._partial += self._file.readline()
            if self._partial.endswith("\n") or (ended and self._partial):
                line, self._partial = self._partial, ""
                return line
            if ended:
                raise StopIteration
            time.sleep(0.02)

    def readlines(self) -> list:
        return list(self)

    def read(self) -> str:
        return "".join(self)

    def close(self) -> None:
        self._file.close()


class Started:
    """A started script, read like subprocess.Popen: pid, send_signal, wait, returncode, and stderr's lines
    as it writes them; stdout is read once it has ended (finish())."""

    def __init__(self, script, args, cwd=None, env=None):
        env = dict(os.environ if env is None else env)
        cwd, args = str(cwd or os.getcwd()), [str(a) for a in args]
        self._dir = tempfile.TemporaryDirectory(prefix="launch-")
        self._out, err = Path(self._dir.name) / "stdout", Path(self._dir.name) / "stderr"
        self._out.touch()
        err.touch()
        if _forkable(env):
            self._status = Path(self._dir.name) / "status"
            self._proc, self._process = None, _server().Process(target=_child, args=(str(script), args, cwd, env,
                                                                                     str(self._out), str(err),
                                                                                     str(self._status)))
            self._process.start()
            self.pid = self._process.pid
        else:
            with open(self._out, "wb") as out, open(err, "wb") as errors:
                self._proc = subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env,
                                              stdin=subprocess.DEVNULL, stdout=out, stderr=errors)
            self._process, self.pid = None, self._proc.pid
        self.stderr = _Follow(err, lambda: self.returncode is not None)

    def send_signal(self, sig) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended, and the fork server reaped it before exitcode was polled
                pass

    @property
    def returncode(self):
        return self._proc.poll() if self._process is None else self._process.exitcode

    def wait(self, timeout=None) -> int:
        if self._process is None:
            return self._proc.wait(timeout)
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self._process), timeout)
        # 255: the fork server's report of the status was lost (it happens under load, CPython issue #140867);
        # a script that ran to its end wrote the status it exits with
        if self._process.exitcode == 255 and self._status.exists():
            return int(self._status.read_text())
        return self._process.exitcode

    def finish(self) -> subprocess.CompletedProcess:
        """Wait, read stdout and stderr, and clean up: what subprocess.run(capture_output=True) returns."""
        code = self.wait()
        err = self.stderr.read()
        self.stderr.close()
        out = self._out.read_text()
        self._dir.cleanup()
        return subprocess.CompletedProcess(self.pid, code, out, err)


def run(script, *args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` to its end: returncode, stdout and stderr as text."""
    return Started(script, args, cwd, env).finish()
