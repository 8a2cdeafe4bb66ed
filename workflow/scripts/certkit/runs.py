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
    resuming = (resume_command or command) + shlex.split(resume)
    resume_args = shlex.split(resume)
    out = out.resolve()
    prepare(out)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    kill_at = stop_after + 1 + lose

    def run(name, argv, folder, step=stop_after, **settings):
        env = {**base, "CERTIFY_RECORD": str(out / name), **{k: str(v) for k, v in settings.items()}}
        code = execute(name, substitute(argv, out / "runs" / folder, step), env, out, timeout)
        return code, *verdict.read(out / name)

    keep = {"CERTIFY_KEEP_INPUTS": stop_after} if repair else {}  # the model's inputs after K: only for a repair
    code, straight, _ = run("straight", command, "straight", CERTIFY_KEEP_RNG=stop_after, CERTIFY_KEEP_FINAL=1, **keep)
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
    code, stopped, killed = run("stopped", command, "resumed", CERTIFY_KILL_AT=kill_at)
    if not killed:
        raise CannotJudge(f"the stopped run was not killed before step {kill_at}: it ended with exit {code}",
                          out / "stopped.log")
    path = missing_checkpoint(resume_args, out / "runs" / "resumed", stop_after)
    if path:
        raise CannotJudge(f"no checkpoint {path}: the stopped run saved none at step {stop_after} "
                          "(does the command save one there?)", out / "stopped.log")
    checkpoint_copy = out / "runs" / "repair-base"
    if repair or control:  # each resumes from the same checkpoint, whatever the resumed run then writes beside it
        shutil.copytree(out / "runs" / "resumed", checkpoint_copy, symlinks=True)
    first_leg = {}
    if again:  # the first resume, killed again after its own checkpoint of AGAIN
        code, first_leg, killed_again = run("resumed.first", resuming, "resumed",
                                            CERTIFY_STEP_OFFSET=stop_after, CERTIFY_KILL_AT=again + 1)
        if not killed_again:
            raise CannotJudge(f"resume failed: {last_line(out / 'resumed.first.log')}", out / "resumed.first.log")
        path = missing_checkpoint(resume_args, out / "runs" / "resumed", again)
        if path:
            raise CannotJudge(f"resume failed: the first resumed run saved no checkpoint {path}",
                              out / "resumed.first.log")
    code, resumed, _ = run("resumed", resuming, "resumed", again or stop_after,
                           CERTIFY_STEP_OFFSET=again or stop_after, CERTIFY_KEEP_FINAL=1)
    if code != 0:
        raise CannotJudge(f"resume failed: {last_line(out / 'resumed.log')}", out / "resumed.log")
    if not resumed:
        raise CannotJudge("resume failed: the resumed run made no optimizer step", out / "resumed.log")
    resumed = {rank: {**first_leg.get(rank, {}), **rows} for rank, rows in resumed.items()}  # both legs' steps
    found = verdict.judge(straight, stopped, resumed, killed, stop_after, other_world=resume_command is not None)
    if not found["deterministic"]:
        b = found["before_kill"]
        raise CannotJudge(f"the command does not repeat itself: its straight and stopped runs differ at step "
                          f"{b['step']}, rank {b['rank']} ({verdict.NAMES[b['piece']]}), before any stop")
    found["max_abs_dw"] = verdict.final_gap(out / "straight", out / "resumed", set(resumed))

    def resumed_again(name, pieces, **settings):
        """One more resumed run, from a copy of step K's checkpoint, with PIECES of the straight run put back."""
        shutil.rmtree(out / "runs" / name, ignore_errors=True)
        shutil.copytree(checkpoint_copy, out / "runs" / name, symlinks=True)
        if "rng" in pieces:
            settings["CERTIFY_RESTORE_RNG"] = out / "straight"
        if "samples" in pieces:
            settings["CERTIFY_REPLAY_INPUTS"] = out / "straight"
        return run(name, resuming, name, CERTIFY_STEP_OFFSET=stop_after, CERTIFY_KEEP_FINAL=1,
                   **settings)

    if repair:
        found["repair"] = repaired(found, straight, lambda pieces: resumed_again("repaired", pieces))
    if control:
        found["control"] = controlled(found, straight,
                                      lambda pieces: resumed_again("control", pieces, CERTIFY_EMPTY_OPTIMIZER=1))
    found.update(command=command, resume=resume, lose=lose, again=again,
                 resume_command=shlex.join(resume_command) if resume_command else None)
    verdict.write_atomic(out / "verdict.json", json.dumps(found, indent=1) + "\n")
    verdict.write_atomic(out / "verdict.md", verdict.markdown(found, shlex.join(command), resume, lose))
    verdict.write_atomic(out / "parting.svg", verdict.svg(found, straight, resumed))
    return found
