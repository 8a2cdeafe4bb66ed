"""The command run three times, each in a session of its own, with the recorder loaded into every Python
process: straight; stopped by a SIGKILL of its whole process group before the update of step K + 1 (+ lose);
resumed, with the resume arguments added, from step K's checkpoint (with --again K2: killed again before
step K2 + 1 and resumed from K2's checkpoint, two resumes in a row). Then the verdict.

{run} in the command and the resume arguments is the run's own folder (the straight run's, or the one the
stopped and the resumed run share), {step} is K, with a format spec if it has one ({step:04d}: 0004).
"""

import concurrent.futures
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from . import diagnosis, lanes, outdir, processes, progress, verdict
from .errors import CannotJudge, ResumeFailed, StraightFailed

SITE = Path(__file__).parent / "site"
STRAIGHT = outdir.STRAIGHT  # the straight run's command, settings and time, beside its certificate
STEP = re.compile(r"\{step(?::([^{}]*))?\}")  # {step}, or {step:04d} as format() takes it


def last_line(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def substitute(tokens: list, run: Path, step: int) -> list:
    """TOKENS with {step} (or {step:SPEC}: {step:04d} gives 0004) made STEP, then {run} made RUN."""

    def numbered(match: re.Match) -> str:
        try:
            return format(step, match.group(1) or "")
        except ValueError as e:
            raise CannotJudge(f"{match.group(0)}: not a format for a step number ({e})") from None

    return [STEP.sub(numbered, t).replace("{run}", str(run)) for t in tokens]


def prepare(out: Path) -> None:
    """OUT ready for a certificate, locked for this process: new, empty, or one certify made, whose files
    that certify wrote and nobody changed since go (outdir.claim)."""
    outdir.claim(out)


class LogCopy:
    """A run's output, read from its pipe by a thread and written to its log by certify: so that a log that
    could not be written (a full disk) is known, not taken for a run that said nothing."""

    def __init__(self, pipe, file, log: Path):
        self.pipe, self.file, self.log, self.error = pipe, file, log, None
        self.thread = threading.Thread(target=self.copy, name=f"log {log.name}", daemon=True)
        self.thread.start()

    def copy(self) -> None:
        with self.file, contextlib.suppress(OSError):  # a read that fails: the pipe is gone
            while chunk := os.read(self.pipe.fileno(), 1 << 16):
                view = memoryview(chunk)
                while view and self.error is None:  # after a failed write, read on: the run must not block
                    try:
                        view = view[self.file.write(view):]
                    except OSError as e:
                        self.error = e

    def finish(self, patience: float = 10.0) -> CannotJudge | None:
        """Once every writer of the pipe is gone: the log written whole, or why it was not."""
        self.thread.join(patience)
        if not self.thread.is_alive():
            self.pipe.close()
        return None if self.error is None else outdir.cannot(self.log, self.error)


def execute(name: str, argv: list, env: dict, out: Path, timeout: float, beside: bool = False,
            stop: threading.Event | None = None) -> int | None:
    """ARGV to its end, in a session of its own, its output copied to OUT/NAME.log; then everything it
    started is ended and reaped: its process group (DataLoader workers, ranks) and every other descendant
    (a daemon that left the session comes to certify, its subreaper). What it wrote goes into OUT's manifest.
    BESIDE: other runs go on meanwhile (--jobs), so of the descendants only those whose environment holds
    this run's CERTIFY_RECORD are its own (Runs.map ends any other when the last run is done). STOP: once
    set, the run is ended (the verdict is known: lanes.Stream) and its exit status is None."""
    log, spared = out / f"{name}.log", set(processes.descendants(os.getpid()))  # not the run's: left alone
    owner = f"CERTIFY_RECORD={env['CERTIFY_RECORD']}".encode() if beside and "CERTIFY_RECORD" in env else None
    watch = progress.Watch(name, Path(env.get("CERTIFY_RECORD", out / name)), argv, redraw=not beside)
    proc = copy = code = None
    try:
        with processes.held():
            proc, copy = start(argv, env, log)
        code = wait(proc, watch, timeout, stop)
    except subprocess.TimeoutExpired:
        raise CannotJudge(f"the {name} run took longer than {timeout:g} s (--timeout)", log) from None
    finally:
        with processes.held():
            if proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            processes.end_descendants(spared, owner=owner)
            unwritten = copy and copy.finish()
            watch.ended(code)
            try:
                outdir.record(out)
            finally:
                if unwritten:
                    raise unwritten
    return code


def start(argv: list, env: dict, log: Path) -> tuple:
    """(the run's Popen, the copy of its output into LOG): no run starts whose log cannot be written."""
    try:
        file = open(log, "wb", buffering=0)
    except OSError as e:
        raise outdir.cannot(log, e) from None
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    except BaseException as e:
        file.close()
        if isinstance(e, (FileNotFoundError, PermissionError)):
            raise CannotJudge(f"command not found: {argv[0]} ({e.strerror})") from None
        raise
    return proc, LogCopy(proc.stdout, file, log)


def wait(proc, watch, timeout: float, stop: threading.Event | None = None) -> int | None:
    """PROC's exit status, its progress shown meanwhile; subprocess.TimeoutExpired after TIMEOUT seconds; None
    as soon as STOP is set."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(max(0.0, min(0.5 if stop else watch.every, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            if stop is not None and stop.is_set():
                return None
            watch.poll()


def missing_checkpoint(resume: list, run: Path, step: int) -> str | None:
    """The first path the resume arguments name through {step} that does not exist, if any."""
    for token in resume:
        if STEP.search(token):
            path = substitute([token], run, step)[0].split("=", 1)[-1]
            if os.sep in path and not Path(path).exists():
                return path
    return None


# the environment variables that name a folder of caches; what lies under one is shared by design
CACHE_VARIABLES = ("HF_DATASETS_CACHE", "HF_HOME", "TRANSFORMERS_CACHE", "TORCH_HOME", "XDG_CACHE_HOME",
                   "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def cache(path: str, env=os.environ) -> bool:
    """Whether PATH lies in a cache: a folder named *cache*, torch inductor's or triton's, or one that a cache
    variable of ENV names (HF_DATASETS_CACHE=/scratch/hf_datasets)."""
    named = any("cache" in part.lower() or part.startswith(("torchinductor_", ".triton")) for part in Path(path).parts)
    return named or any(env.get(v) and Path(path).is_relative_to(os.path.abspath(env[v])) for v in CACHE_VARIABLES)


def training_began(rows: dict, fallback: int) -> int:
    """When the first optimizer step of a run's ROWS ended, on the rank that got there first, by the clock file
    mtimes are stamped with (recorder.file_clock_ns); FALLBACK for rows that carry no time."""
    times = [by_step[min(by_step)].get("time_ns") for by_step in rows.values() if by_step]
    return min(times) if times and None not in times else fallback


def shared_read(reads: str, began: int, ended: int, env=os.environ, own=frozenset()) -> str | None:
    """The first path of a reads.<pid>.txt (lines "mtime<TAB>path") last written between BEGAN and ENDED, the
    straight run's training, outside a cache; None where there is none. What a run wrote before its first
    optimizer step (a tokenized dataset, a lock, a preprocessing cache) is the same for every run and passes:
    a checkpoint cannot be older than the first step it holds. So does what the reading run's own chain
    wrote and the straight run did not (OWN: paths, or folders ending in os.sep): while the straight run
    trains beside it (lanes), the stopped run's checkpoint is written in the same window (and a folder of its
    own, opened to fsync it, is its own too)."""
    for line in reads.splitlines():
        mtime, _, path = line.partition("\t")
        if mtime.isdigit() and began <= int(mtime) <= ended and not cache(path, env) \
                and path not in own and not (path + os.sep).startswith(tuple(p for p in own if p.endswith(os.sep))):
            return path
    return None


def repairable(piece: str) -> str | None:
    """What a repair restores by hand when PIECE differs first: the model's inputs, or the RNG states."""
    return "samples" if piece == "samples" else "rng" if piece.startswith("rng_") else None


def repaired(found: dict, straight: dict, run) -> dict:
    """{restored, exact, first} of repair runs, RUN(pieces) each a resumed run with PIECES of the straight run
    put back by hand: while the first difference is a piece a repair restores and not restored yet, it is
    added and the run made again. Exact means those pieces were all the checkpoint forgot."""
    pieces, first = [], found["first"]
    while first is not None and repairable(first["piece"]) and repairable(first["piece"]) not in pieces:
        pieces.append(repairable(first["piece"]))
        code, rows, _ = run(pieces)
        if code != 0 or not rows:
            return {"restored": pieces, "exact": False, "first": None, "why": f"the repaired run failed (exit {code})"}
        first = verdict.first_difference(straight, rows, range(found["resumed_from"] + 1, found["last_step"] + 1),
                                         found["not_compared"])
    if not pieces:
        piece = "none" if first is None else verdict.NAMES[first["piece"]]
        return {"restored": [], "why": f"the first difference is {piece}: a repair restores samples and RNG states"}
    return {"restored": pieces, "exact": first is None, "first": first}


CHAIN = ("stopped", "resumed.first", "resumed")  # the runs that share the stopped run's folder, one after another
CONTROL_PIECE = "optimizer"  # what the negative control empties, and where the certificate must see it


def controlled(found: dict, straight: dict, run, unemptied: dict) -> dict:
    """{restored, first, caught, outcome, why} of the negative control, RUN(pieces) a resumed run with the repairs'
    PIECES put back and the optimizer state emptied before its first update. Caught when its optimizer state
    differs from the straight run's at its first step (K + 1), whatever differs before it in causal order (an
    RNG draw nothing used, say): the certificate sees a checkpoint that forgot the optimizer. Inconclusive,
    and not run, where UNEMPTIED (the same resume with the same repairs, not emptied) already differs by then:
    an emptied optimizer cannot show on its own. Inconclusive too where the control run fails."""
    pieces = found.get("repair", {}).get("restored", [])  # then only the emptied optimizer is left to differ
    start = found.get("resumed_from", found["stop_after"])
    step = start + 1
    already = verdict.first_difference(straight, unemptied, range(start + 1, step + 1), found["not_compared"])
    if already is not None:
        which = "repaired" if pieces else "resumed"
        return {"restored": pieces, "first": None, "caught": None, "outcome": "inconclusive",
                "why": f"the {which} run already differs at step {already['step']}, rank {already['rank']} "
                       f"({verdict.NAMES[already['piece']]}), where an emptied optimizer would show: "
                       + ("choose a --stop-after where the resume is exact" if pieces else
                          "repair first (--repair), or choose a --stop-after where the resume is exact")}
    code, rows, _ = run(pieces)
    if code != 0 or not rows:
        return {"restored": pieces, "first": None, "caught": None, "outcome": "inconclusive",
                "why": f"the control run failed (exit {code})"}
    first = verdict.first_difference(straight, rows, range(step, found["last_step"] + 1), found["not_compared"])
    caught = any(rows.get(r, {}).get(step, {}).get(CONTROL_PIECE) != straight[r][step][CONTROL_PIECE]
                 for r in rows if step in straight.get(r, {}))
    return {"restored": pieces, "first": first, "caught": caught, "outcome": "caught" if caught else "not caught"}


class Runs:
    """The command's runs, each in a session of its own, recorded under OUT/NAME, its files in OUT/runs/."""

    def __init__(self, out: Path, timeout: float, stop_after: int, resuming: list):
        self.out, self.timeout, self.stop_after, self.resuming = out, timeout, stop_after, resuming
        self.env = {**os.environ,
                    "PYTHONPATH": os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.checkpoint_copy = out / "runs" / "repair-base"
        self.windows, self.straight, self.rows = {}, {}, {}  # rows: the repaired and control runs', aligned
        self.beside = None  # while Runs.map runs several at once: the event that stops them
        self.stop = threading.Event()  # set when the verdict is known not exact: the runs in flight end (lanes.Stream)
        self.deferred = None  # while the straight run runs beside them: the runs whose reads are judged after it

    def run(self, name: str, argv: list, folder: str, step: int | None = None, **settings) -> tuple:
        """(exit code, its certificate's rows, whether it was killed); the exit code None where certify ended it
        at the first difference (lanes.Stream). The straight run's command, settings and time go to
        straight.json, for a later certify to reuse (reuse_straight)."""
        settings = {k: str(v) for k, v in settings.items()}
        env = {**self.env, "CERTIFY_RECORD": str(self.out / name), **settings}
        template, argv = argv, substitute(argv, self.out / "runs" / folder, self.stop_after if step is None else step)
        began = time.time_ns()
        if self.beside is not None and self.beside.is_set():
            raise CannotJudge(f"the {name} run was not started: another run beside it failed")
        code = execute(name, argv, env, self.out, self.timeout, beside=self.beside is not None,
                       stop=self.stop if name in ("straight", "resumed") else None)
        self.windows[name] = (began, time.time_ns())
        if name == "straight":
            outdir.write_atomic(self.out / STRAIGHT, json.dumps(
                {"command": template, "settings": settings, "window": self.windows[name], "exit": code}) + "\n")
            outdir.record(self.out)
        elif self.deferred is not None:
            self.deferred.append(name)
        else:
            self.refuse_shared(name)
        return code, *verdict.read(self.out / name)

    def reuse_straight(self, source: Path, argv: list, **settings) -> tuple:
        """(exit code, rows, killed) of the straight run an earlier certify made in SOURCE (its --out), copied
        here, not run again: it must have run this very COMMAND with at least these SETTINGS (what it kept of
        its state), and be as that certify left it. CannotJudge otherwise, naming what differs."""
        said = f"--straight-from {source}"
        try:
            made = json.loads((source / STRAIGHT).read_text())
            command, kept, window, code = made["command"], made["settings"], made["window"], made["exit"]
        except (OSError, ValueError, KeyError, TypeError):
            raise CannotJudge(f"{said}: no straight run a certify made there ({STRAIGHT} missing or unreadable)") \
                from None
        if command != argv:
            raise CannotJudge(f"{said}: its straight run ran another command ({shlex.join(command)})")
        other = next((k for k, v in settings.items() if kept.get(k) != str(v)), None)
        if other is not None:
            raise CannotJudge(f"{said}: its straight run was recorded with {other}={kept.get(other)}, this one "
                              f"needs {settings[other]}")
        listed, now = outdir.read_manifest(source), outdir.entries(source)
        changed = next((n for n in sorted(now) if n.split("/")[0] in ("straight", "straight.log", STRAIGHT)
                        and listed.get(n, "absent") != now[n]), None)
        if changed is not None:
            raise CannotJudge(f"{said}: {source / changed} was changed since certify wrote it")
        try:
            shutil.copytree(source / "straight", self.out / "straight", symlinks=True)
            for name in ("straight.log", STRAIGHT):
                shutil.copy2(source / name, self.out / name)
        except OSError as e:
            raise outdir.cannot(self.out / "straight", e) from None
        finally:
            outdir.record(self.out)
        self.windows["straight"] = tuple(window)
        return code, *verdict.read(self.out / "straight")

    def map(self, fn, items: list, jobs: int) -> list:
        """[FN(*item) for item in ITEMS], JOBS of them at once, each FN making its runs (--jobs). The first
        error (a CannotJudge, a signal to certify) stops the rest: those not started never start, those in
        flight are ended; whatever a run started that is not known as its own is ended once all are done."""
        if jobs <= 1 or len(items) <= 1:
            return [fn(*item) for item in items]
        spared, self.beside = set(processes.descendants(os.getpid())), threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(jobs, thread_name_prefix="certify-run")
        futures = [pool.submit(fn, *item) for item in items]
        try:
            done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            for f in done:
                f.result()  # the first error, raised here
            return [f.result() for f in futures]
        except BaseException:
            self.beside.set()
            for f in futures:
                f.cancel()
            with processes.held():
                while not all(f.done() for f in futures):  # the runs in flight end as their processes do
                    processes.end_descendants(spared, patience=1.0)
                    time.sleep(0.05)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.beside = None
            with processes.held():
                processes.end_descendants(spared)

    def refuse_shared(self, name: str) -> None:
        """CannotJudge where run NAME read a file the straight run wrote after its first optimizer step: the
        runs share a checkpoint, so the resume may continue the straight run's training rather than its own,
        and each run overwrites the other's (shared_read)."""
        began = training_began(self.straight, self.windows["straight"][0])
        runs = self.out / "runs"  # the runs' own folders, but the straight run's
        folders = {str(f) + os.sep for f in runs.iterdir() if f.name != "straight"} if runs.is_dir() else set()
        own = self.written(*CHAIN) - self.written("straight") | folders
        for log in sorted((self.out / name).glob("reads.*.txt")):
            path = shared_read(log.read_text(errors="replace"), began, self.windows["straight"][1], own=own)
            if path is not None:
                raise CannotJudge(f"the {name} run read {path}, which the straight run wrote after its first "
                                  "optimizer step: the runs share a checkpoint, so a resume may continue the other "
                                  "run's training (give each run its own folder, with {run} in the command's paths)",
                                  self.out / f"{name}.log")

    def written(self, *names) -> set:
        """The paths runs NAMES wrote, as their recorders saw: opened for writing or renamed onto (the audit
        hook's writes.<pid>.txt) or saved by torch.save or save_file (watch.py's saves.<pid>.jsonl)."""
        paths = set()
        for name in names:
            for log in (self.out / name).glob("writes.*.txt"):
                paths.update(log.read_text(errors="replace").splitlines())
            for log in (self.out / name).glob("saves.*.jsonl"):
                for line in log.read_text(errors="replace").splitlines():
                    with contextlib.suppress(ValueError, AttributeError):
                        paths.add(json.loads(line).get("path"))
        return paths - {None, ""}

    def notes(self) -> dict:
        """{run: what its recorders could not record} (notes.<pid>.txt), for the runs that have any."""
        found = {}
        for name in self.windows:
            lines = {line for log in (self.out / name).glob("notes.*.txt") for line in log.read_text().splitlines()}
            if lines:
                found[name] = sorted(lines)
        return found

    def aligned(self, rows: dict, offset: int) -> tuple[dict, int]:
        """(ROWS numbered from the step whose state the run really started from, that step): verdict.real_start."""
        start = verdict.real_start(self.straight, rows, offset) if rows else offset
        return verdict.relabelled(rows, offset, start), start

    def keep_checkpoint(self) -> None:
        """A copy of step K's checkpoint: each repair resumes from it, whatever the resumed run then writes."""
        shutil.copytree(self.out / "runs" / "resumed", self.checkpoint_copy, symlinks=True)

    def resumed_again(self, name: str, pieces, **settings) -> tuple:
        """One more resumed run, from the copy of step K's checkpoint, with PIECES of the straight run put back."""
        shutil.rmtree(self.out / "runs" / name, ignore_errors=True)
        shutil.copytree(self.checkpoint_copy, self.out / "runs" / name, symlinks=True)
        if "rng" in pieces:
            settings["CERTIFY_RESTORE_RNG"] = self.out / "straight"
        if "samples" in pieces:
            settings["CERTIFY_REPLAY_INPUTS"] = self.out / "straight"
        code, rows, killed = self.run(name, self.resuming, name, CERTIFY_STEP_OFFSET=self.stop_after,
                                      CERTIFY_KEEP_FINAL=1, **settings)
        self.rows[name] = self.aligned(rows, self.stop_after)[0]
        return code, self.rows[name], killed


def check_options(command: list, resume_command, stop_after: int, lose: int, again: int, repair: bool,
                  control: bool) -> None:
    if stop_after < 1 or lose < 0:
        raise CannotJudge(f"--stop-after must be at least 1 and --lose at least 0 (got {stop_after}, {lose})")
    if again and again <= stop_after + lose:
        raise CannotJudge(f"--again {again}: the second kill must come after the first ({stop_after + 1 + lose})")
    if again and (repair or control):
        raise CannotJudge("--again resumes twice: --repair and --control put pieces back once, after K")
    if not command:
        raise CannotJudge("no command: certify [options] -- COMMAND ...")
    for argv in (command, resume_command or command):
        if shutil.which(argv[0]) is None:
            raise CannotJudge(f"command not found: {argv[0]}")


def certify(command: list, resume: str, out: Path, stop_after: int, lose: int = 0, timeout: float = 3600,
            repair: bool = False, control: bool = False, again: int = 0, resume_command: list | None = None,
            straight_from: Path | None = None, jobs: int | None = 1, full: bool = False) -> dict:
    """The verdict on COMMAND's resume (verdict.judge's dict), with verdict.json, verdict.md and parting.svg
    written to OUT. REPAIR: where the first difference is samples or an RNG, resumed runs with the straight
    run's inputs or RNG states put back say whether they were all the checkpoint forgot. CONTROL: one more
    resumed run (with those repairs) whose optimizer state is emptied, which the verdict must name. AGAIN:
    the resumed run is killed again before step AGAIN + 1 and resumed from its own checkpoint of AGAIN (no
    repair or control then: each puts its pieces back once, after K). RESUME_COMMAND: the resumed runs run it
    instead of COMMAND (another launcher, another number of ranks), the resume arguments added to it.
    STRAIGHT_FROM: the --out of an earlier certify of COMMAND, whose straight run is reused (Runs.reuse_straight).
    JOBS: 2 runs the straight run beside the stopped and the resumed run (lanes.py); None: what the machine
    allows (lanes.default_jobs). FULL: a verdict that is not exact is still judged to the end, with max |Δw|;
    otherwise the runs end once every rank has parted and the steps so far name a cause (lanes.early_end:
    the verdict is the same). Raises CannotJudge."""
    check_options(command, resume_command, stop_after, lose, again, repair, control)
    resuming = (resume_command or command) + shlex.split(resume)
    out = out.resolve()
    prepare(out)
    runs = Runs(out, timeout, stop_after, resuming)
    jobs, why = (jobs, "--jobs") if jobs else lanes.default_jobs(command)
    progress.say(None, ("two lanes: the straight run beside the stopped and resumed runs" if jobs > 1 and
                        not straight_from else "one lane: the runs one after another") + f" ({why})")
    kill_at = stop_after + 1 + lose
    early = not (full or repair or control or again or resume_command)
    stream = None if again or resume_command else lanes.Stream(out, stop_after, kill_at, runs.stop, early)
    straight, stopped, killed, legs = two_lanes(runs, command, resume, lose, again, repair, control,
                                                straight_from and Path(straight_from).resolve(), jobs, stream)
    resumed, start = aligned_legs(runs, *legs, again, lose)
    ended = lanes.early_end(straight, stopped, killed, resumed, start, kill_at, stop_after, out) if early else None
    if ended:
        straight, resumed = lanes.cut(straight, resumed, ended, kill_at)
    found = verdict.judge(straight, stopped, resumed, killed, stop_after, other_world=resume_command is not None,
                          resumed_from=start)
    if not found["deterministic"]:
        b = found["before_kill"]
        raise CannotJudge(f"the command does not repeat itself: its straight and stopped runs differ at step "
                          f"{b['step']}, rank {b['rank']} ({verdict.NAMES[b['piece']]}), before any stop")
    found["ended_early"] = ended and {
        "step": ended, "why": f"not exact, every rank had parted by step {ended} and the steps up to it name a cause: "
        "the straight and the resumed run were ended there, so max |Δw| is not measured (--full runs them to the end)"}
    found["max_abs_dw"] = None if ended else verdict.final_gap(out / "straight", out / "resumed", set(resumed))
    found["diagnosis"] = diagnosis.diagnose(found, straight, resumed, out)
    if repair:
        found["repair"] = repaired(found, straight, lambda pieces: runs.resumed_again("repaired", pieces))
    if control:
        repaired_run = runs.rows.get("repaired") if found.get("repair", {}).get("restored") else resumed
        found["control"] = controlled(found, straight, lambda pieces: runs.resumed_again(
            "control", pieces, CERTIFY_EMPTY_OPTIMIZER=1), repaired_run)
    found["not_recorded"] = runs.notes()
    found.update(format=verdict.FORMAT, command=command, resume=resume, lose=lose, again=again,
                 straight_from=str(Path(straight_from).resolve()) if straight_from else None,
                 resume_command=shlex.join(resume_command) if resume_command else None)
    outdir.publish(out, {"verdict.json": json.dumps(found, indent=1) + "\n",
                         "verdict.md": verdict.markdown(found, shlex.join(command), resume, lose),
                         "parting.svg": verdict.svg(found, straight, resumed)})
    return found


def two_lanes(runs: Runs, command: list, resume: str, lose: int, again: int, repair: bool, control: bool,
              straight_from: Path | None, jobs: int, stream) -> tuple:
    """(straight, stopped, killed, (first leg, resumed)): the straight run, and the stopped run then the resumed
    run(s); with JOBS > 1 the two lanes side by side, every check made in the order one after another makes
    them (the reads of the chain's runs judged once the straight run's window is known). STREAM compares the
    resumed run with the straight run as both go."""
    def chain() -> tuple:
        stopped, killed = stopped_run(runs, command, resume, lose, again)
        if repair or control:
            runs.keep_checkpoint()
        return stopped, killed, resumed_legs(runs, resume, again)

    keep = kept(runs.stop_after, repair)
    if stream:
        stream.start()
    try:
        if jobs <= 1 or straight_from is not None:
            straight = straight_run(runs, command, lose, again, keep, straight_from)
            return straight, *chain()
        runs.deferred, failed = [], []

        def deferring() -> tuple | None:
            try:
                return chain()
            except CannotJudge as e:  # raised once the reads of the runs before it are judged, as in one lane
                failed.append((len(runs.deferred), e))

        straight, legs = runs.map(lambda lane: lane(), [(functools.partial(straight_run, runs, command, lose, again,
                                                                           keep, straight_from),), (deferring,)], 2)
        for n, name in enumerate(runs.deferred + [None]):
            if failed and failed[0][0] == n:
                raise failed[0][1]
            if name:
                runs.refuse_shared(name)
        return straight, *legs
    finally:
        runs.deferred = None
        if stream:
            stream.finish()


def kept(stop_after: int, repair: bool) -> dict:
    """What the straight run keeps: its RNG states after K, its final weights, step K's digests and step K + 1's
    inputs and draws; with REPAIR its inputs after K."""
    keep = {"CERTIFY_KEEP_INPUTS": stop_after} if repair else {}  # the model's inputs after K: only for a repair
    keep.update(CERTIFY_KEEP_RNG=stop_after, CERTIFY_KEEP_FINAL=1, CERTIFY_DIGEST_AT=stop_after,
                **diagnosed(stop_after))
    return keep


def diagnosed(stop_after: int) -> dict:
    """What the straight and the resumed run keep of step K + 1 for a diagnosis (diagnosis.py): its model inputs
    and its draws from the global RNGs."""
    return {"CERTIFY_KEEP_INPUTS_AT": stop_after + 1, "CERTIFY_TRACE_AT": stop_after + 1}


def straight_and_stopped(runs: Runs, command: list, resume: str, lose: int, again: int, repair: bool,
                         saves: dict | None = None) -> tuple:
    """The straight run, then the stopped run (SAVES: its settings to record its file events, certify --crash):
    (straight, stopped, killed)."""
    straight = straight_run(runs, command, lose, again, kept(runs.stop_after, repair))
    return straight, *stopped_run(runs, command, resume, lose, again, saves)


def straight_run(runs: Runs, command: list, lose: int, again: int, keep: dict, straight_from: Path | None = None):
    """The straight run's certificate (KEEP: what it keeps; or STRAIGHT_FROM's straight run, reused), checked:
    it ran, it stepped, and it makes the steps the kills need."""
    out, stop_after = runs.out, runs.stop_after
    if straight_from is None:
        code, straight, _ = runs.run("straight", command, "straight", **keep)
    else:
        code, straight, _ = runs.reuse_straight(straight_from, command, **keep)
    if code not in (0, None):  # None: ended by certify, the verdict known (lanes.Stream)
        raise StraightFailed(f"the straight run failed (exit {code}): {last_line(out / 'straight.log')}",
                          out / "straight.log")
    runs.straight = straight
    if not straight:
        raise CannotJudge("the command made no optimizer step: certify records torch.optim optimizers in Python "
                          "processes started without -I or -E", out / "straight.log")
    last, kill_at = max(max(rows) for rows in straight.values()), stop_after + 1 + lose
    if code == 0 and max(kill_at, again + 1) > last:
        options = (f"--stop-after {stop_after}" + (f" --lose {lose}" if lose else "")
                   + (f" --again {again}" if again else ""))
        raise CannotJudge(f"{options}: the run makes {last} optimizer steps, so the kill before step "
                          f"{max(kill_at, again + 1)} would never come")
    return straight


def stopped_run(runs: Runs, command: list, resume: str, lose: int, again: int, saves: dict | None = None) -> tuple:
    """(stopped, killed): the stopped run, killed before step K + 1 + LOSE with its checkpoint of K on disk."""
    out, stop_after = runs.out, runs.stop_after
    kill_at = stop_after + 1 + lose
    code, stopped, killed = runs.run("stopped", command, "resumed", CERTIFY_KILL_AT=kill_at, **(saves or {}))
    if not killed:
        raise CannotJudge(f"the stopped run was not killed before step {kill_at}: it ended with exit {code}",
                          out / "stopped.log")
    path = missing_checkpoint(shlex.split(resume), out / "runs" / "resumed", stop_after)
    if path:
        raise CannotJudge(f"no checkpoint {path}: the stopped run saved none at step {stop_after} "
                          "(does the command save one there?)", out / "stopped.log")
    return stopped, killed


def resumed_legs(runs: Runs, resume: str, again: int) -> tuple:
    """(the first leg's rows, the resumed run's rows), as recorded: with AGAIN, the first resumed run killed
    again after its own checkpoint of AGAIN, and the second resumed from that; else no first leg."""
    out, stop_after, resuming = runs.out, runs.stop_after, runs.resuming
    first_leg = {}
    if again:
        code, first_leg, killed_again = runs.run("resumed.first", resuming, "resumed",
                                                 CERTIFY_STEP_OFFSET=stop_after, CERTIFY_KILL_AT=again + 1)
        if not killed_again:
            raise ResumeFailed(f"resume failed: {last_line(out / 'resumed.first.log')}", out / "resumed.first.log")
        path = missing_checkpoint(shlex.split(resume), out / "runs" / "resumed", again)
        if path:
            raise ResumeFailed(f"resume failed: the first resumed run saved no checkpoint {path}",
                              out / "resumed.first.log")
    code, resumed, _ = runs.run("resumed", resuming, "resumed", again or stop_after,
                                CERTIFY_STEP_OFFSET=again or stop_after, CERTIFY_KEEP_FINAL=1,
                                **({} if again else diagnosed(stop_after)))
    if code not in (0, None):
        raise ResumeFailed(f"resume failed: {last_line(out / 'resumed.log')}", out / "resumed.log")
    if not resumed:
        raise ResumeFailed("resume failed: the resumed run made no optimizer step", out / "resumed.log")
    return first_leg, resumed


def aligned_legs(runs: Runs, first_leg: dict, resumed: dict, again: int, lose: int = 0) -> tuple[dict, int]:
    """(the resumed run's certificate, numbered from the step whose state it really started from; that step).
    With AGAIN, both legs. A run that starts from a state the stopped run never reached read another run's
    checkpoint."""
    out, stop_after, start = runs.out, runs.stop_after, None
    if again:
        first_leg, start = runs.aligned(first_leg, stop_after)
    resumed, second = runs.aligned(resumed, again or stop_after)
    start = second if start is None else start
    if start > stop_after + lose:
        raise CannotJudge(f"the resumed run started from step {start}'s state, which the stopped run never reached "
                          f"(killed before step {stop_after + lose + 1}'s update): it read a checkpoint another run "
                          "wrote", out / "resumed.log")
    return {rank: {**first_leg.get(rank, {}), **rows} for rank, rows in resumed.items()}, start  # both legs
