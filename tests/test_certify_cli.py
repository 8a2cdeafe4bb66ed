"""certify's command line as a user meets it: its lock on --out, what a rerun deletes, the signals that stop it,
the processes it leaves (none, daemons included), its own failed writes, the spelling of its options, --help
and its progress.

Each certify is its real command line in a real process, on a small SGD script written as quick experiment
scripts are (tests/programs/linear_sgd.py). Each test puts a word of its own on the command line and looks
for what is left of its processes in /proc.
"""

import contextlib
import errno
import json
import os
import pty
import re
import resource
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, clean_env

CERTIFY = [sys.executable, "-m", "certkit"]  # the installed package (certify/), as `certify` runs it
SCRIPT = [sys.executable, str(REPO / "tests" / "programs" / "linear_sgd.py"), "--out", "{run}"]
RESUME = "--resume={run}/ckpt_{step:04d}.pt"
ENV = {**clean_env(), "OMP_NUM_THREADS": "1"}
VERDICT = ("verdict.json", "verdict.md", "parting.svg")
FOREVER = ["--steps", "1000000000", "--save_every", "1000000000"]  # a run that ends only when it is ended


def marked(*words) -> list:
    """The pids of the processes whose command line holds every one of WORDS, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if all(word.encode() in cmdline for word in words):
                found.append(int(entry))
    return found


def family(pid: int) -> list:
    """PID's descendants, by the parent ids in /proc/<pid>/stat."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            children.setdefault(int(stat[stat.rfind(b")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.fixture
def marker():
    """A word for this test's command lines; a process still holding it afterwards (a failed test's) is killed."""
    word = f"certify-cli-{uuid.uuid4().hex[:12]}"
    yield word
    for pid in marked(word):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def certify_argv(out, stop_after, command, *options, resume=RESUME) -> list:
    return [*CERTIFY, "--out", str(out), "--stop-after", str(stop_after), f"--resume={resume}", *options, "--",
            *map(str, command)]


def run(argv, **kwargs):
    return subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=ENV, timeout=600, **kwargs)


def errors(stderr: str) -> list:
    """certify's own lines on stderr (its progress lines begin `[certify] `)."""
    return [line for line in stderr.splitlines() if line.startswith("certify: ")]


def snapshot(folder) -> dict:
    """{path: (size, mtime_ns, bytes)} of every file and folder under FOLDER, FOLDER's own entry included."""
    found = {}
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        found[str(path)] = (st.st_size, st.st_mtime_ns, path.read_bytes() if path.is_file() else None)
    return found


def wait_for(condition, what: str, limit: float = 300.0):
    """CONDITION's first true value, looked at every 50 ms; a failure naming WHAT if none comes in LIMIT s."""
    deadline = time.monotonic() + limit
    while not (found := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return found


@pytest.mark.quick
def test_help_says_what_run_and_step_are_with_a_format_spec_and_each_exit_status():
    """Catches: --help that leaves {run} and {step} unexplained or hides that {step} takes a format spec, that
    lists no exit status, or whose usage line lacks --timeout."""
    proc = run([*CERTIFY, "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--timeout" in proc.stdout.splitlines()[0]
    assert "{run}" in proc.stdout and re.search(r"\{step:0\d+d?\}", proc.stdout)
    status = proc.stdout[proc.stdout.index("exit status"):]
    for code in ("0", "1", "2", "128 + N"):
        assert re.search(rf"^\s+{re.escape(code)}\s+\w", status, re.M), code


def test_a_resume_value_of_its_own_word_beginning_with_dashes_and_a_padded_step_are_taken(tmp_path, marker):
    """Catches: --resume refusing a value of its own word that begins with -- (argparse: "expected one
    argument"); {step:04d} left as it is, or made 3 rather than 0003 (no such checkpoint); progress that does
    not say on stderr each run's start and end with its exit and steps, or that reaches stdout, whose one line
    is the verdict's."""
    out = tmp_path / "out"
    proc = run([*CERTIFY, "--out", out, "--stop-after", "3", "--resume", "--resume={run}/ckpt_{step:04d}.pt",
                "--", *SCRIPT, "--notes", marker])
    assert proc.returncode == 0 and json.loads((out / "verdict.json").read_text())["exact"], proc.stderr[-3000:]
    checkpoint = out / "runs" / "resumed" / "ckpt_0003.pt"
    assert f"resumed from {checkpoint} at step 3" in (out / "resumed.log").read_text()
    assert len(proc.stdout.splitlines()) == 1 and str(out / "verdict.md") in proc.stdout
    lines = proc.stderr.splitlines()
    assert errors(proc.stderr) == [] and all(line.startswith("[certify] ") for line in lines), proc.stderr
    # the script makes 6 steps; the stopped run is killed (SIGKILL) before step 4's update; the resume makes 4..6;
    # the straight run in a lane of its own, beside the other two (two lanes here: OMP_NUM_THREADS=1)
    assert "[certify] two lanes: " in lines[0] or len(os.sched_getaffinity(0)) < 2, proc.stderr
    for expected in (["straight run started", "straight run ended: exit 0, steps 1-6,"],
                     ["stopped run started", "stopped run ended: killed by SIGKILL, steps 1-3,",
                      "resumed run started", "resumed run ended: exit 0, steps 4-6,"]):
        where = [next((i for i, line in enumerate(lines) if says in line), None) for says in expected]
        assert None not in where and where == sorted(where), proc.stderr
    assert not marked(marker)


def test_a_padded_step_whose_checkpoint_was_never_saved_is_named_before_any_resume(tmp_path, marker):
    """Catches: the check for step K's checkpoint blind to {step:04d}: the resumed run would be started and fail
    on its own ("resume failed"), rather than certify naming the checkpoint the stopped run never saved."""
    out = tmp_path / "out"
    proc = run(certify_argv(out, 3, [*SCRIPT, "--save_every", "2", "--notes", marker]))
    said = errors(proc.stderr)
    assert proc.returncode == 2 and len(said) == 1, proc.stderr[-3000:]
    assert f"no checkpoint {out / 'runs' / 'resumed' / 'ckpt_0003.pt'}" in said[0]
    assert "resumed run started" not in proc.stderr and not (out / "resumed.log").exists()
    assert not marked(marker)


def test_a_second_certify_on_the_same_out_is_refused_touching_nothing_and_the_first_reaches_its_verdict(
        tmp_path, marker):
    """Catches: two certify runs on one --out at once (the second deletes the first's runs and certificates
    while they are being written), a refusal that changes or deletes a file there, a refusal of several lines
    or another exit status, a first run that the second disturbs. The first is frozen (SIGSTOP, with its run)
    while the second tries, so that it surely holds the folder then."""
    out = tmp_path / "out"
    argv = certify_argv(out, 3, [*SCRIPT, "--notes", marker])
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    frozen = []
    try:
        wait_for(lambda: "straight run started" in first.stderr.readline() or first.poll() is not None,
                 "the first certify starts its straight run")
        assert first.poll() is None, first.communicate()[1][-3000:]
        os.kill(first.pid, signal.SIGSTOP)
        frozen = [first.pid, *family(first.pid)]
        for pid in frozen[1:]:
            os.kill(pid, signal.SIGSTOP)
        before = snapshot(out)
        second = run(argv)
        after = snapshot(out)
        for pid in reversed(frozen):
            os.kill(pid, signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 2 and len(second.stderr.splitlines()) == 1, second.stderr
    assert second.stderr.startswith("certify: ") and f"pid {first.pid}" in second.stderr and str(out) in second.stderr
    assert after == before
    assert first.returncode == 0 and json.loads((out / "verdict.json").read_text())["exact"], stderr[-3000:]
    assert not marked(marker)


def test_a_daemon_that_each_run_double_forks_out_of_its_session_is_ended_with_the_run(tmp_path, marker):
    """Catches: a helper that forks twice and calls setsid (a daemon: no longer in the run's process group nor
    its session) left running after certify, one per run, or left a zombie of certify's; the runs' verdict
    changed by the ending of what they started."""
    out = tmp_path / "out"
    proc = run(certify_argv(out, 3, [*SCRIPT, "--uploader", marker], "--jobs", "1"))  # each run's own sweep
    assert proc.returncode == 0 and json.loads((out / "verdict.json").read_text())["exact"], proc.stderr[-3000:]
    for name in ("straight", "stopped", "resumed"):  # each run did start one
        assert f"uploader {marker} started" in (out / f"{name}.log").read_text()
    assert not marked(marker)


def test_a_run_that_times_out_is_ended_with_the_daemon_it_started(tmp_path, marker):
    """Catches: --timeout ending the run's process group but not the daemon the run double-forked out of it."""
    out = tmp_path / "out"
    proc = run(certify_argv(out, 3, [*SCRIPT, *FOREVER, "--uploader", marker], "--timeout", "10"))
    said = errors(proc.stderr)
    assert proc.returncode == 2 and len(said) == 1 and "--timeout" in said[0], proc.stderr[-3000:]
    assert f"uploader {marker} started" in (out / "straight.log").read_text()
    assert not marked(marker)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_certify_ends_the_run_and_all_it_started_and_says_so_in_one_line(tmp_path, marker, signum):
    """Catches: SIGTERM or SIGHUP leaving the training run going (it runs in a session of its own) or the daemon
    it started; Ctrl-C's traceback; a verdict, exit 2 or any other status than 128 + the signal's number."""
    out = tmp_path / "out"
    certify = subprocess.Popen(certify_argv(out, 3, [*SCRIPT, *FOREVER, "--uploader", marker]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(lambda: marked(marker, "import time") or certify.poll() is not None, "the run starts its daemon")
        assert certify.poll() is None, certify.communicate()[1][-3000:]
        certify.send_signal(signum)
        stdout, stderr = certify.communicate(timeout=120)
    finally:
        if certify.poll() is None:
            certify.kill()
            certify.wait()
    said = errors(stderr)
    assert certify.returncode == 128 + signum and len(said) == 1, stderr[-3000:]
    assert said[0].startswith(f"certify: interrupted by {signum.name}") and "Traceback" not in stderr
    assert stdout == "" and not [name for name in VERDICT if (out / name).exists()]
    assert not marked(marker)


def read_until(fd: int, enough, limit: float = 300.0) -> bytes:
    """What FD gives until ENOUGH(all of it so far) is true, or it ends; a failure if neither comes in LIMIT s."""
    seen, deadline = b"", time.monotonic() + limit
    while not enough(seen):
        assert time.monotonic() < deadline, f"never enough: {seen[-500:]!r}"
        if select.select([fd], [], [], 1.0)[0]:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # EIO: every writer of the terminal is gone
                chunk = b""
            if not chunk:
                break
            seen += chunk
    return seen


def test_on_a_terminal_the_steps_are_one_line_redrawn_in_place(tmp_path, marker):
    """Catches: progress on a terminal that never shows the steps, or scrolls a line per look, or leaves its
    redrawn line unfinished under the next line (here the one that says certify was interrupted). One lane:
    two runs side by side each say their steps as lines."""
    terminal, stderr = pty.openpty()
    certify = subprocess.Popen(certify_argv(tmp_path / "out", 3, [*SCRIPT, *FOREVER, "--notes", marker], "--jobs", "1"),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=ENV)
    os.close(stderr)
    try:
        seen = read_until(terminal, lambda seen: seen.count(b"straight run: step ") >= 2)
        certify.send_signal(signal.SIGTERM)
        seen += read_until(terminal, lambda seen: False)
        certify.wait(timeout=120)
    finally:
        os.close(terminal)
        if certify.poll() is None:
            certify.kill()
            certify.wait()
    text = seen.decode(errors="replace")
    first, second = (m.start() for m in list(re.finditer(r"straight run: step ", text))[:2])
    assert "\n" not in text[first:second] and text[first - len("\r\x1b[K[certify] "):first].startswith("\r\x1b[K")
    assert "\r\x1b[K[certify] straight run ended: stopped by certify" in text
    assert certify.returncode == 128 + signal.SIGTERM and "certify: interrupted by SIGTERM" in text
    assert not marked(marker)


def test_a_rerun_deletes_only_what_certify_wrote_and_refuses_a_file_it_did_not_write_or_that_changed(
        tmp_path, marker):
    """Catches: a rerun on certify's own --out that deletes whatever lies in its folders (a user's file put in
    runs/straight, a checkpoint changed since), or deletes some of it before refusing; a refusal that does not
    name the file; a manifest that refuses an untouched folder, so that it cannot be certified again."""
    out = tmp_path / "out"
    argv = certify_argv(out, 3, [*SCRIPT, "--notes", marker])
    first = run(argv)
    assert first.returncode == 0, first.stderr[-3000:]
    (out / "mine.md").write_text("the user's notes, beside certify's folders\n")
    for intruder in (out / "runs" / "straight" / "notes.txt", out / "runs" / "straight" / "ckpt_0002.pt"):
        with open(intruder, "ab") as f:  # a new file of the user's; then a checkpoint certify's run wrote, changed
            f.write(b"edited by hand\n")
        before = snapshot(out)
        refused = run(argv)
        said = errors(refused.stderr)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert str(intruder) in said[0] and snapshot(out) == before
        intruder.unlink()  # the user takes it away
    again = run(argv)
    assert again.returncode == 0 and json.loads((out / "verdict.json").read_text())["exact"], again.stderr[-3000:]
    assert (out / "mine.md").exists() and (out / "runs" / "straight" / "ckpt_0002.pt").exists()
    assert not marked(marker)


@pytest.mark.parametrize("case", ["out is a file", "out's parent is a file"])
def test_an_out_certify_cannot_write_is_one_line_and_exit_2_and_nothing_there_changes(tmp_path, marker, case):
    """Catches: --out naming a file, or a path through one, answered with a traceback and exit 1 (which means
    "not exact"), a run started all the same, or the file there changed."""
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's\n")
    out = mine if case == "out is a file" else mine / "out"
    before = snapshot(tmp_path)
    proc = run(certify_argv(out, 3, [*SCRIPT, "--notes", marker]))
    assert proc.returncode == 2 and proc.stderr.startswith(f"certify: cannot write {out}: "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and snapshot(tmp_path) == before
    assert not marked(marker)


def limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG rather than killing


@pytest.fixture
def small_disk(tmp_path):
    """(a folder on a 512 KiB tmpfs, None); where mounting one is not allowed, (a folder, a preexec_fn under
    which no file may grow past 256 KiB). Either way the runs' files fit (the largest is 16 KiB, all of them
    about 120 KiB) and the verdict's do not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)],
                                 capture_output=True).returncode == 0
    except OSError:  # no mount(8)
        mounted = False
    yield disk, (None if mounted else limit_file_size)
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_disk_that_fills_up_at_the_verdict_is_one_line_exit_2_and_leaves_no_verdict_and_no_tmp(small_disk, marker):
    """Catches: a full disk that ends certify with a traceback and exit 1 ("not exact"), a verdict.json.tmp left
    behind, or some of the verdict's files written and not the others. The script's notes (300 KB of its
    command line) are in verdict.json and verdict.md and in no file of the runs."""
    disk, preexec = small_disk
    out = disk / "out"
    notes = [f"--notes={marker}-" + "x" * 100_000 for _ in range(3)]
    proc = run(certify_argv(out, 3, [*SCRIPT, *notes]), preexec_fn=preexec)
    said = errors(proc.stderr)
    assert proc.returncode == 2 and len(said) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert said[0].startswith(f"certify: cannot write {out}{os.sep}")
    assert "resumed run ended: exit 0" in proc.stderr  # the runs fitted: what failed was the verdict
    assert not list(out.rglob("*.tmp")) and not [name for name in VERDICT if (out / name).exists()]
    assert not marked(marker)


def test_a_log_certify_cannot_write_is_named_not_taken_for_a_run_that_said_nothing(tmp_path, marker):
    """Catches: a run whose output could not go into its log (a full disk; here no file may grow past 256 KiB,
    RLIMIT_FSIZE) judged by what the log holds ("failed: (no output)", a cut last line) rather than certify
    saying it could not write the log."""
    out = tmp_path / "out"
    talker = [sys.executable, "-c", "import sys; print('x' * 400_000); print(sys.argv[1])", marker]
    proc = run(certify_argv(out, 3, talker), preexec_fn=limit_file_size)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert errors(proc.stderr) == [f"certify: cannot write {out / 'straight.log'}: {os.strerror(errno.EFBIG)}"]
    assert not marked(marker)
