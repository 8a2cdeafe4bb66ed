"""The command run three times, each in a session of its own, with the recorder loaded into every Python
process: straight; stopped by a SIGKILL of its whole process group before the update of step K + 1 (+ lose);
resumed, with the resume arguments added, from step K's checkpoint (with --again K2: killed again before
step K2 + 1 and resumed from K2's checkpoint, two resumes in a row). Then the verdict.

{run} in the command and the resume arguments is the run's own folder (the straight run's, or the one the
stopped and the resumed run share), {step} is K.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from . import verdict

SITE = Path(__file__).parent / "site"
MARK = ".certify"  # a folder certify made: its own files in it may be replaced
OWN = ("straight", "stopped", "resumed", "resumed.first", "repaired", "control", "runs", "straight.log",
       "stopped.log", "resumed.log", "resumed.first.log", "repaired.log", "control.log", "verdict.json",
       "verdict.md", "parting.svg")


class CannotJudge(Exception):
    """Why certify could not judge, in one line; LOG: the log whose last lines say more."""

    def __init__(self, why: str, log: Path | None = None):
        super().__init__(why)
        self.log = log


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def substitute(tokens: list, run: Path, step: int) -> list:
    return [t.replace("{run}", str(run)).replace("{step}", str(step)) for t in tokens]


def prepare(out: Path) -> None:
    """OUT ready for a certificate: new, empty, or one certify made (its own entries go, nothing else does)."""
    if out.exists() and any(out.iterdir()) and not (out / MARK).exists():
        raise CannotJudge(f"{out} holds files certify did not write: give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).touch()
    for name in OWN:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def execute(name: str, argv: list, env: dict, out: Path, timeout: float) -> int:
    """ARGV to its end, in a session of its own, output to OUT/NAME.log; whatever of its process group is
    left (DataLoader workers, ranks) is killed after it."""
    log = out / f"{name}.log"
    with open(log, "w") as f:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        except (FileNotFoundError, PermissionError) as e:
            raise CannotJudge(f"command not found: {argv[0]} ({e.strerror})") from None
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise CannotJudge(f"the {name} run took longer than {timeout:g} s (--timeout)", log) from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def missing_checkpoint(resume: list, run: Path, step: int) -> str | None:
    """The first path the resume arguments name through {step} that does not exist, if any."""
    for token in resume:
        if "{step}" in token:
            path = substitute([token], run, step)[0].split("=", 1)[-1]
            if os.sep in path and not Path(path).exists():
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
        first = verdict.first_difference(straight, rows, range(found["stop_after"] + 1, found["last_step"] + 1),
                                         found["not_compared"])
    if not pieces:
        piece = "none" if first is None else verdict.NAMES[first["piece"]]
        return {"restored": [], "why": f"the first difference is {piece}: a repair restores samples and RNG states"}
    return {"restored": pieces, "exact": first is None, "first": first}


def controlled(found: dict, straight: dict, run) -> dict:
    """{restored, first, caught} of the negative control, RUN(pieces) a resumed run with the repairs' PIECES put
    back and the optimizer state emptied before its first update: caught when the first difference is the
    optimizer state at step K + 1, so that the certificate would see a checkpoint that forgot it."""
    pieces = found.get("repair", {}).get("restored", [])  # then only the emptied optimizer is left to differ
    code, rows, _ = run(pieces)
    if code != 0 or not rows:
        return {"restored": pieces, "first": None, "caught": False, "why": f"the control run failed (exit {code})"}
    first = verdict.first_difference(straight, rows, range(found["stop_after"] + 1, found["last_step"] + 1),
                                     found["not_compared"])
    caught = first is not None and (first["step"], first["piece"]) == (found["stop_after"] + 1, "optimizer")
    return {"restored": pieces, "first": first, "caught": caught}


class Runs:
    """The command's runs, each in a session of its own, recorded under OUT/NAME, its files in OUT/runs/."""

    def __init__(self, out: Path, timeout: float, stop_after: int, resuming: list):
        self.out, self.timeout, self.stop_after, self.resuming = out, timeout, stop_after, resuming
        self.env = {**os.environ,
                    "PYTHONPATH": os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.checkpoint_copy = out / "runs" / "repair-base"

    def run(self, name: str, argv: list, folder: str, step: int | None = None, **settings) -> tuple:
        """(exit code, its certificate's rows, whether it was killed)."""
        env = {**self.env, "CERTIFY_RECORD": str(self.out / name), **{k: str(v) for k, v in settings.items()}}
        argv = substitute(argv, self.out / "runs" / folder, self.stop_after if step is None else step)
        return execute(name, argv, env, self.out, self.timeout), *verdict.read(self.out / name)

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
        return self.run(name, self.resuming, name, CERTIFY_STEP_OFFSET=self.stop_after, CERTIFY_KEEP_FINAL=1,
                        **settings)


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
            repair: bool = False, control: bool = False, again: int = 0, resume_command: list | None = None) -> dict:
    """The verdict on COMMAND's resume (verdict.judge's dict), with verdict.json, verdict.md and parting.svg
    written to OUT. REPAIR: where the first difference is samples or an RNG, resumed runs with the straight
    run's inputs or RNG states put back say whether they were all the checkpoint forgot. CONTROL: one more
    resumed run (with those repairs) whose optimizer state is emptied, which the verdict must name. AGAIN:
    the resumed run is killed again before step AGAIN + 1 and resumed from its own checkpoint of AGAIN (no
    repair or control then: each puts its pieces back once, after K). RESUME_COMMAND: the resumed runs run it
    instead of COMMAND (another launcher, another number of ranks), the resume arguments added to it.
    Raises CannotJudge."""
    check_options(command, resume_command, stop_after, lose, again, repair, control)
    resuming = (resume_command or command) + shlex.split(resume)
    out = out.resolve()
    prepare(out)
    runs = Runs(out, timeout, stop_after, resuming)
    straight, stopped, killed = straight_and_stopped(runs, command, resume, lose, again, repair)
    if repair or control:
        runs.keep_checkpoint()
    resumed = resumed_runs(runs, resume, again)
    found = verdict.judge(straight, stopped, resumed, killed, stop_after, other_world=resume_command is not None)
    if not found["deterministic"]:
        b = found["before_kill"]
        raise CannotJudge(f"the command does not repeat itself: its straight and stopped runs differ at step "
                          f"{b['step']}, rank {b['rank']} ({verdict.NAMES[b['piece']]}), before any stop")
    found["max_abs_dw"] = verdict.final_gap(out / "straight", out / "resumed", set(resumed))
    if repair:
        found["repair"] = repaired(found, straight, lambda pieces: runs.resumed_again("repaired", pieces))
    if control:
        found["control"] = controlled(found, straight, lambda pieces: runs.resumed_again(
            "control", pieces, CERTIFY_EMPTY_OPTIMIZER=1))
    found.update(command=command, resume=resume, lose=lose, again=again,
                 resume_command=shlex.join(resume_command) if resume_command else None)
    verdict.write_atomic(out / "verdict.json", json.dumps(found, indent=1) + "\n")
    verdict.write_atomic(out / "verdict.md", verdict.markdown(found, shlex.join(command), resume, lose))
    verdict.write_atomic(out / "parting.svg", verdict.svg(found, straight, resumed))
    return found


def straight_and_stopped(runs: Runs, command: list, resume: str, lose: int, again: int, repair: bool) -> tuple:
    """The straight run (its RNG states after K kept, and with REPAIR its inputs after K), then the stopped
    run, killed before step K + 1 + LOSE with its checkpoint of K on disk: (straight, stopped, killed)."""
    out, stop_after = runs.out, runs.stop_after
    kill_at = stop_after + 1 + lose
    keep = {"CERTIFY_KEEP_INPUTS": stop_after} if repair else {}  # the model's inputs after K: only for a repair
    code, straight, _ = runs.run("straight", command, "straight", CERTIFY_KEEP_RNG=stop_after, CERTIFY_KEEP_FINAL=1,
                                 **keep)
    if code != 0:
        raise CannotJudge(f"the straight run failed (exit {code}): {last_line(out / 'straight.log')}",
                          out / "straight.log")
    if not straight:
        raise CannotJudge("the command made no optimizer step: certify records torch.optim optimizers in Python "
                          "processes started without -I or -E", out / "straight.log")
    last = max(max(rows) for rows in straight.values())
    if max(kill_at, again + 1) > last:
        options = (f"--stop-after {stop_after}" + (f" --lose {lose}" if lose else "")
                   + (f" --again {again}" if again else ""))
        raise CannotJudge(f"{options}: the run makes {last} optimizer steps, so the kill before step "
                          f"{max(kill_at, again + 1)} would never come")
    code, stopped, killed = runs.run("stopped", command, "resumed", CERTIFY_KILL_AT=kill_at)
    if not killed:
        raise CannotJudge(f"the stopped run was not killed before step {kill_at}: it ended with exit {code}",
                          out / "stopped.log")
    path = missing_checkpoint(shlex.split(resume), out / "runs" / "resumed", stop_after)
    if path:
        raise CannotJudge(f"no checkpoint {path}: the stopped run saved none at step {stop_after} "
                          "(does the command save one there?)", out / "stopped.log")
    return straight, stopped, killed


def resumed_runs(runs: Runs, resume: str, again: int) -> dict:
    """The resumed run's certificate; with AGAIN, of both legs: the first killed again after its own
    checkpoint of AGAIN, the second resumed from that."""
    out, stop_after, resuming = runs.out, runs.stop_after, runs.resuming
    first_leg = {}
    if again:
        code, first_leg, killed_again = runs.run("resumed.first", resuming, "resumed",
                                                 CERTIFY_STEP_OFFSET=stop_after, CERTIFY_KILL_AT=again + 1)
        if not killed_again:
            raise CannotJudge(f"resume failed: {last_line(out / 'resumed.first.log')}", out / "resumed.first.log")
        path = missing_checkpoint(shlex.split(resume), out / "runs" / "resumed", again)
        if path:
            raise CannotJudge(f"resume failed: the first resumed run saved no checkpoint {path}",
                              out / "resumed.first.log")
    code, resumed, _ = runs.run("resumed", resuming, "resumed", again or stop_after,
                                CERTIFY_STEP_OFFSET=again or stop_after, CERTIFY_KEEP_FINAL=1)
    if code != 0:
        raise CannotJudge(f"resume failed: {last_line(out / 'resumed.log')}", out / "resumed.log")
    if not resumed:
        raise CannotJudge("resume failed: the resumed run made no optimizer step", out / "resumed.log")
    return {rank: {**first_leg.get(rank, {}), **rows} for rank, rows in resumed.items()}  # both legs' steps
