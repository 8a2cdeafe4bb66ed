"""Shared fixtures: a copy of the workflow in a temporary directory and one tiny end-to-end run of it.

Tests run the real scripts in real processes, as a user would; the tiny overlay changes steps,
stop_at and every model dimension, so the bit-exact claim is checked off the default config too.
"""

import ast
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import launch
import numpy as np
import pytest
import torch
import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
SRC = REPO / "src"  # the lab's package (mmkit, trainer_audit), installed editable

TINY = {
    "steps": 12,
    "stop_at": 5,
    "batch_size": 4,
    "seq_len": 32,
    "model": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}

# the tiny overlay with checkpoints every 2 steps, for the builds that are interrupted (Snakemake killed, SLURM's
# preemptions) and then compared with the pristine build: only the files below may differ from it
CHECKPOINTED = {**TINY, "outdir": "results",
                "checkpoint": {"every": 2, "keep": 2, "keep_when_done": False, "async": False}}
# logs and timing: wall-clock; settings/: checkpoint.every differs on purpose; checkpoints/: none are left
NOT_COMPARED = ("logs/", "timing/", "checkpoints/", "settings/")


# make test's schedule (-n 3 --dist loadgroup --no-loadscope-reorder, which keeps the order below): a file that
# defines a fixture its tests share (module or session scope: a build, a cluster, a venv) is one unit of work
# that one worker runs; every other test is a unit of its own, handed to whichever worker is free, so that every
# worker stays busy to the end. The files that mostly wait (on SLURM's polling, on processes killed and
# restarted) go first, so that the other workers fill both cores meanwhile; the audit's build (snakemake
# --cores 2) next, to take the core the SLURM test leaves idle; then the other shared files, then the tests on
# their own.
#
# The units are made here, not by xdist_group marks: with pytest 9.2, xdist 3.8's loadgroup drops the marks
# (its group rides on each test's id, which pytest no longer lets it change: pytest-xdist#1386), and the
# controller that schedules collects nothing, so it reads which fixtures a file defines from its source
FIRST = ("test_slurm.py", "test_preemption.py", "test_audit.py")


@functools.cache
def shares_a_fixture(path: Path) -> bool:
    """Whether the test file at PATH defines a fixture of module or session scope."""
    def scope(decorator) -> str | None:
        return next((k.value.value for k in getattr(decorator, "keywords", ())
                     if k.arg == "scope" and isinstance(k.value, ast.Constant)), None)

    return any(scope(d) in ("module", "session") for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.FunctionDef) for d in node.decorator_list)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return file if shares_a_fixture(config.rootpath / file) else nodeid

    return SharedFilesTogether(config, log)


def run_order(item) -> int:
    first = next((i for i, f in enumerate(FIRST) if item.path.name == f), None)
    return first if first is not None else len(FIRST) + (not shares_a_fixture(item.path))


def pytest_sessionstart(session):
    """make test (MMKIT_TEST_RECORD set) records which tree it runs, for make mutants (tests/mutants.py)."""
    record = os.environ.get("MMKIT_TEST_RECORD")
    if record and not os.environ.get("PYTEST_XDIST_WORKER"):
        from outcomes import tree_digest

        Path(record).mkdir(exist_ok=True)
        for name in ("outcomes.jsonl", "pipeline", "pipeline.seconds"):
            (Path(record) / name).unlink(missing_ok=True)
        (Path(record) / "tree.sha256").write_text(tree_digest() + "\n")


# the SLURM cluster a test run started (tests/test_slurm.py) is stopped when the run ends, by the process that
# runs the session (xdist's controller, the parent of every worker), not by the worker whose tests used it
_SESSION = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
STOP_AT_SESSION_END = Path(tempfile.gettempdir()) / f"mmkit-stop-slurm-after-{_SESSION}"


def pytest_terminal_summary(terminalreporter):
    """make test's yardstick: how long this run took to build the tiny DAG (the pristine pipeline)."""
    record = os.environ.get("MMKIT_TEST_RECORD")
    seconds = Path(record) / "pipeline.seconds" if record else None
    if seconds and seconds.exists():
        terminalreporter.write_line(f"the tiny DAG's build in this run (the yardstick): {seconds.read_text().strip()} s")


def left_running(root: Path) -> dict:
    """{pid: name} of the processes working in a folder under ROOT, this process and its ancestors aside."""
    keep, pid = set(), os.getpid()
    while pid > 1:  # this process and its ancestors
        keep.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd").removesuffix(" (deleted)"))
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == root or root in cwd.parents:
            found[int(entry.name)] = name
    return found


def sweep(session) -> None:
    """Ends what a test left running in the session's folders: the processes a killed xdist worker started in
    a session of their own (a SLURM DAG), which no test's `finally` ran to end (an INTERNALERROR ends the
    workers outright). Each is named: the run's output shows any leak, and the next run is not slowed by it."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's own, as its tmp_path fixtures use
    if factory is None:
        return
    root = factory.getbasetemp().resolve()
    found = left_running(root)
    for pid in found:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if found and reporter:
        reporter.write_line(f"ended {len(found)} processes left running under {root}: "
                            + ", ".join(f"{name} ({pid})" for pid, name in sorted(found.items())))


def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    sweep(session)
    if STOP_AT_SESSION_END.exists():
        subprocess.run([REPO / "cluster" / "stop.sh"], capture_output=True, timeout=120)
        STOP_AT_SESSION_END.unlink()


# make check: the quick tier, a developer's run after every change. `quick` marks the tests that run in-process
# and the one fastest real-process test per command line (run.py, certify, compare.py, the Snakefile's dry run);
# none of them may wait on the tiny pipeline's build, which alone takes longer than the tier's budget
BUILDS = {"pristine_pipeline", "pipeline", "tiny_run"}


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: make check's tier (in-process, or the fastest test of a command "
                                       "line); never on a test that needs the tiny pipeline's build")
    config.addinivalue_line("markers", "slow: make test-slow's tier: a framework's imports, a cluster, a browser, "
                                       "repeated full builds; make test leaves it out, CI runs both")


def pytest_collection_modifyitems(items):
    slow = [item.nodeid for item in items if item.get_closest_marker("quick") and BUILDS & set(item.fixturenames)]
    if slow:
        raise pytest.UsageError(f"marked quick but waits on the tiny pipeline's build: {', '.join(slow)}")
    items.sort(key=run_order)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (CI=true) a skipped test fails: nothing may pass there by not running."""
    report = (yield).get_result()
    if os.environ.get("CI") and report.skipped:
        report.outcome, report.longrepr = "failed", f"skipped in CI, where every test must run: {report.longrepr}"


def same_state_dict(a, b) -> bool:
    """The one test of "identical state_dicts": the same keys, and per key the same dtype, shape and bytes.

    Bytes, not torch.equal: torch.equal ignores dtype and says a NaN differs from itself.
    """
    return differences(a, b) == []


def differences(a, b) -> list:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [f"not both dicts: {type(a).__name__}, {type(b).__name__}"]
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(map(str, a.keys() ^ b.keys()))[:5]}"]
    diffs = []
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict) or isinstance(y, dict):
            diffs += [f"{k}.{d}" for d in differences(x, y)]
        elif not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            diffs += [] if type(x) is type(y) and x == y else [f"{k}: {x!r} vs {y!r}"]
        elif x.dtype != y.dtype or x.shape != y.shape:
            diffs.append(f"{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
        elif not torch.equal(*(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (x, y))):
            diffs.append(f"{k}: other values")
    return diffs


def assert_same_state_dict(a, b):
    diffs = differences(a, b)
    assert not diffs, f"{len(diffs)} entries differ: {diffs[:5]}"


def compare_builds(ours: Path, theirs: Path, not_compared=()) -> tuple[list, list]:
    """Every file of OURS (a build of `all`) against the same name in THEIRS: (the names compared, the names
    whose bytes differ or that THEIRS lacks). THEIRS may hold more (the shared pipeline gains files from
    other tests, report.html for one).

    Files under NOT_COMPARED prefixes are left out; report.md without its line of wall times (학습 시간),
    the one line no two builds share.
    """
    def content(path):
        if not path.is_file():
            return None
        lines = path.read_bytes().splitlines(keepends=True)
        return b"".join(ln for ln in lines if not (path.name == "report.md" and ln.startswith("학습 시간".encode())))

    names = sorted(str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file())
    names = [n for n in names if not n.startswith(tuple(not_compared))]
    return names, [n for n in names if content(ours / n) != content(theirs / n)]


def copy_workflow(dest: Path) -> Path:
    """The files a fresh clone has, without results or snakemake state (over whatever DEST holds)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml", "environment.yml", "presets", "examples"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest / name)
    for name in ("workflow", "src"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
                        dirs_exist_ok=True)
    return dest


def tiny_config(**overrides) -> dict:
    """The repository's config.yaml with the tiny overlay (and overrides) deep-merged in."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for layer in (TINY, overrides):
        for k, v in layer.items():
            cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    return cfg


def snakemake(workdir: Path, *args, configfiles=("config.yaml", "tiny.yaml"), check=True):
    # targets before --configfile, which takes every word after it
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args, "--configfile", *configfiles]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=clean_env(Path(workdir) / "src"))
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def clean_env(*first: Path) -> dict:
    """This environment, with this Python's folder first on PATH (rules call `python`), and the folders FIRST
    put first on PYTHONPATH, the rest kept (make mutants puts its broken copy of src/ there). A copy of the
    workflow (copy_workflow) passes its src/: its jobs then run the copy's package, the code under test, before
    the one this repository installs editable, as their code inputs say they do."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    if first:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, first), *filter(None, [env.get("PYTHONPATH")])])
    return env


def script_module(name: str):
    """workflow/scripts/NAME as a module of this process: a script is no package, so it is loaded from its file
    (its imports, mmkit's and certkit's, come from the installed packages)."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args, cwd=None, env=None):
    """Run workflow/scripts/NAME as a separate process (forked with torch imported: tests/launch.py); returns
    the CompletedProcess."""
    return launch.run(SCRIPTS / name, *args, cwd=cwd, env=env or clean_env())


def recorded_pipeline() -> str | None:
    """make test-slow (MMKIT_TEST_RECORD_FROM): the tiny pipeline make test built, where that run was of this
    very tree and its build finished; None otherwise (then this run builds its own)."""
    record = os.environ.get("MMKIT_TEST_RECORD_FROM")
    if not record:
        return None
    from outcomes import tree_digest

    try:
        same = (Path(record) / "tree.sha256").read_text().strip() == tree_digest()
        pipeline = Path((Path(record) / "pipeline").read_text().strip())
    except OSError:
        return None
    return str(pipeline) if same and (pipeline.parent / "pipeline.built").exists() else None


@pytest.fixture(scope="session")
def pristine_pipeline(tmp_path_factory) -> Path:
    """The whole DAG run once per test run, on the tiny overlay; returns its folder, which no test may change
    (copy it: the `pipeline` fixture does).

    Under pytest-xdist the workers share one build: the first to get here builds it in the session's folder
    that all workers share (the parent of each worker's basetemp), under a file lock; the others wait and
    find it done. MMKIT_SHARED_PIPELINE names one already built (by tests/mutants.py, with the unbroken code),
    and make test-slow takes make test's where it built this very tree (recorded_pipeline);
    with MMKIT_SHARED_PIPELINE_UPDATE="TARGET ..." a copy of it where those targets are brought up to date with
    the code under test instead (snakemake reruns the jobs leading to them whose code is newer: the broken
    file's).
    """
    shared = os.environ.get("MMKIT_SHARED_PIPELINE") or recorded_pipeline()
    if shared and os.environ.get("MMKIT_SHARED_PIPELINE_UPDATE"):
        work = tmp_path_factory.mktemp("updated") / "copy"
        shutil.copytree(shared, work, symlinks=True)
        copy_workflow(work)
        snakemake(work, *os.environ["MMKIT_SHARED_PIPELINE_UPDATE"].split())
        return work
    if shared:
        return Path(shared)
    base = tmp_path_factory.getbasetemp()
    # without xdist the parent is shared with other pytest runs: then the build is this run's own
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work, built, failed = root / "pipeline", root / "pipeline.built", root / "pipeline.failed"
    with FileLock(root / "pipeline.lock"):
        if failed.exists():
            raise AssertionError(failed.read_text())
        if not built.exists():
            copy_workflow(work)
            (work / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "outdir": "results"}))
            t0 = time.monotonic()
            try:
                snakemake(work)
            except AssertionError as e:
                failed.write_text(str(e))
                raise
            built.touch()
            if os.environ.get("MMKIT_TEST_RECORD"):
                (Path(os.environ["MMKIT_TEST_RECORD"]) / "pipeline").write_text(f"{work}\n")
                (Path(os.environ["MMKIT_TEST_RECORD"]) / "pipeline.seconds").write_text(
                    f"{time.monotonic() - t0:.0f}\n")
    return work


@pytest.fixture(scope="session")
def pipeline(pristine_pipeline, tmp_path_factory) -> Path:
    """This worker's copy of the tiny pipeline, which its tests may add to (dist/ targets, report.html);
    returns the results directory.

    The copy keeps mtimes and snakemake's records, so a job a test asks snakemake for reruns only if the code
    under test is newer than the build (tests/mutants.py's broken file is): copy_workflow puts that code in.
    """
    work = tmp_path_factory.mktemp("workflow") / "copy"
    shutil.copytree(pristine_pipeline, work, symlinks=True)
    copy_workflow(work)
    return work / "results"


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> dict:
    """What the checks of a resume file and a token file read, made by run.py alone in seconds, without waiting
    on the tiny pipeline: the tiny config (steps 12, stop_at 5), random tokens, the resume file of a run
    stopped at stop_at, and the weights of the run straight through (both runs at once)."""
    tmp = tmp_path_factory.mktemp("small_run")
    files = {"config": tmp / "config.yaml", "tokens": tmp / "train.npy", "resume": tmp / "resume.pth",
             "straight": tmp / "straight.pth"}
    files["config"].write_text(yaml.safe_dump(tiny_config()))
    np.save(files["tokens"], np.random.default_rng(0).integers(0, TINY["model"]["vocab_size"], 4096, dtype=np.uint16))
    common = ["--config", files["config"], "--tokens", files["tokens"]]
    runs = [launch.Started(SCRIPTS / "run.py", [*common, *args], env=clean_env())
            for args in (["--out", files["resume"], "--stop-at"], ["--out", files["straight"]])]
    for proc in (r.finish() for r in runs):
        assert proc.returncode == 0, proc.stderr[-2000:]
    return files


@pytest.fixture(scope="session")
def tiny_run(pipeline) -> dict:
    """Paths a direct run.py call needs: the resume job's settings (every training key and stop_at) and
    token files of the tiny pipeline."""
    return {
        "config": pipeline / "settings" / "resume.yaml",
        "tokens": pipeline / "data" / "train.npy",
        "val": pipeline / "data" / "val.npy",
        "resume": pipeline / "resume.pth",
    }
