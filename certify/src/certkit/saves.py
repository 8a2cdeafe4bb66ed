"""certify --crash: a crash inside the save. The stopped run's processes record every file event under the
run's folder as it happens (fileevents.py, in the program's process: opens for writing, writes, fsyncs of files
and folders, renames, unlinks, mkdirs, and each torch.save and safetensors save_file whole, whose writers
bypass Python's open), each tagged with the optimizer steps done by then. Then every state a crash may leave is rebuilt and resumed
as the user resumes, under two failure models:

  process crash  the kill lands before each event; the event before it may be a write torn part-way. The
                 page cache survives: every other write made before the kill is on disk.
  power loss     crashstates' persistence model: data not fsynced may be lost or cut at a block boundary,
                 a directory entry whose folder was not fsynced may be undone.

States that leave the same bytes are resumed once. Each resume is classified against the straight run:

  exact          it resumed from the newest complete checkpoint, and every step after matches;
  lost work      it resumed from an older checkpoint than the newest complete one (how many steps);
  started over   it began from step 0 although a save had finished before the crash, without a word;
  hard fail      it exited non-zero (its last line): the job is down until a person cleans up;
  silent         it resumed and differs: the first step, rank and piece.

A checkpoint of step j is complete in a state when every file of its own that its save left (the bytes the
fault-free run had when that save ended) is there with those bytes: a file every save rewrites (a `latest`
pointer) names the newest checkpoint and is none's, unless a save has no other (one file, overwritten).
With one save recorded, no file is rewritten: K should be the second checkpoint or later.
Where the resume arguments name {step}, each state is resumed from
its newest complete checkpoint (from scratch, without them, where none is): what a person picks after a
look at the folder. Without {step} they are the command's own auto-resume, added as they are.
"""

import hashlib
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

from . import crashstates, outdir, runs, verdict
from .crashstates import BLOCK, Op, materialize
from .errors import CannotJudge
from .verdict import FAILING, OUTCOMES

MODELS = ("process crash", "power loss")
CUTS = 2  # a write cut at this many block boundaries under power loss (crashstates.variants): 0, half, all
# --- what the stopped run did, and what a crash may leave of it ------------------------------------------------


def read(folder: Path) -> list[Op]:
    """The recorded events of every process, merged in the order they were made (a line the kill cut off is
    no event)."""
    recordings = []
    for log in sorted(folder.glob("saves.*.jsonl")):
        blob, ops = log.with_suffix(".bin").read_bytes(), []
        for line in log.read_text().splitlines():
            try:
                row = json.loads(line)
                start, size = row.pop("data")
            except (ValueError, TypeError):
                continue
            if start + size <= len(blob):
                ops.append(Op(**row, data=blob[start:start + size]))
        recordings.append(ops)
    return crashstates.merged({}, recordings)


def key(tree: dict) -> str:
    return hashlib.sha256(repr(sorted((p, None if v is None else hashlib.sha256(v).hexdigest())
                                      for p, v in tree.items())).encode()).hexdigest()[:16]


def torn(data: bytes) -> int:
    """Where a kill inside a write cuts it: half way, at a block boundary where the write spans blocks."""
    return len(data) // 2 // BLOCK * BLOCK or len(data) // 2


def crash_points(ops: list[Op], models=MODELS):
    """(event index k, model, tree) of each state of MODELS: under process crash, the first k events done
    (and the k-th's write torn); under power loss, crashstates' variants after k events."""
    for k in range(len(ops) + 1) if MODELS[0] in models else ():
        if k and ops[k - 1].kind in ("fsync", "fsync_dir", "mark"):
            continue  # what a process crash leaves after an fsync is what it left before it
        yield k, MODELS[0], materialize({}, ops, lambda i, k=k: i < k)
        if k and ops[k - 1].kind == "write" and 0 < torn(ops[k - 1].data) < len(ops[k - 1].data):
            cut = torn(ops[k - 1].data)
            yield k, MODELS[0] + " (torn)", materialize({}, ops, lambda i, k=k, c=cut: c if i == k - 1 else i < k)
    if MODELS[1] in models:
        for k, _, tree in crashstates.crash_states(SimpleNamespace(ops=ops, initial={}), max_cuts=CUTS):
            yield k, MODELS[1], tree


def saves(ops: list[Op]) -> dict:
    """{step j: (index of its save's last event, {path: bytes} the save left)} for each step after which
    the run wrote files that changed the folder."""
    found, before = {}, {}
    for j in sorted({op.step for op in ops if op.step > 0}):
        last = max(i for i, op in enumerate(ops) if op.step == j)
        tree = materialize({}, ops, lambda i, last=last: i <= last)
        files = {p: v for p, v in tree.items() if v is not None and before.get(p) != v}
        if files:
            found[j] = (last, files)
        before = tree
    return found


def newest_complete(tree: dict, checkpoints: dict) -> int:
    """The newest step whose checkpoint TREE holds complete (0: none). A checkpoint is its save's own files:
    a file every save rewrites (a `latest` pointer, Lightning's last.ckpt) says which checkpoint is newest,
    it is not part of one, unless a save has no file of its own (one checkpoint file, overwritten)."""
    paths = [p for _, files in checkpoints.values() for p in files]
    shared = {p for p in paths if paths.count(p) > 1}

    def holds(j, files):
        own = {p: v for p, v in files.items() if p not in shared} or files
        later = [f for s, (_, f) in checkpoints.items() if s > j]
        return all(tree.get(p) == v or any(p in f and tree.get(p) == f[p] for f in later) for p, v in own.items())

    return max((j for j, (_, files) in checkpoints.items() if holds(j, files)), default=0)


def spread(items: list, most: int) -> list:
    """MOST of ITEMS, evenly spaced from first to last (all of them when there are no more)."""
    if most <= 0 or len(items) <= most:
        return items
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)] if most > 1 else items[:1]


def sampled(points: list, most: int) -> list:
    """MOST of the distinct states of POINTS, shared between the failure models (what one needs fewer of goes
    to the other) and spread evenly within each, in the order the save reaches them. Spread over all states at
    once, a save of many files would give power loss, which leaves hundreds of states, nearly all of them."""
    groups = {}
    for p in points:  # a state both models leave is its first model's
        model = next(m for m in MODELS if p["model"].startswith(m))
        if not any(p["state"] in g for g in groups.values()):
            groups.setdefault(model, []).append(p["state"])
    chosen, left = [], most
    for i, states in enumerate(sorted(groups.values(), key=len)):
        taken = spread(states, left // (len(groups) - i))
        chosen, left = chosen + taken, left - len(taken)
    return chosen


# --- the crash matrix ----------------------------------------------------------------------------------------------


def classify(code: int, rows: dict, start: int, newest: int, finished: int, found: dict | None, last: str) -> dict:
    """The outcome of one resume: exit CODE, its ROWS (from step START's state), the state's NEWEST complete
    checkpoint, the newest save FINISHED before the crash, FOUND its verdict (judge's dict)."""
    if code != 0:
        return {"outcome": "hard fail", "why": last}
    if not rows:
        return {"outcome": "silent", "why": "it exited 0 without an optimizer step"}
    exact_from_there = found["first"] is None
    if start == 0 and finished > 0:
        return {"outcome": "started over", "lost": finished, "exact_from_there": exact_from_there}
    if start < newest:
        return {"outcome": "lost work", "lost": newest - start, "exact_from_there": exact_from_there}
    if exact_from_there:
        return {"outcome": "exact"}
    first = found["first"]
    return {"outcome": "silent", "first": first,
            "why": f"first difference at step {first['step']}, rank {first['rank']}: {verdict.NAMES[first['piece']]}"}


def crash_matrix(r: "runs.Runs", base: list, resume: str, straight: dict, stopped: dict, killed: dict,
                 max_points: int, models=MODELS, jobs: int = 1) -> dict:
    """Every crash state of the stopped run's saves (at most MAX_POINTS distinct ones, spread evenly, JOBS
    resumed at once), rebuilt and resumed with BASE (the command) and the resume arguments: {points, counts, ...}."""
    out = r.out
    ops = read(out / "saves")
    checkpoints = saves(ops)
    if not checkpoints:
        raise CannotJudge("the stopped run wrote no file under {run} after an optimizer step: certify --crash "
                          "records the saves a command makes in its run's own folder", out / "stopped.log")
    points, trees = [], {}
    for k, model, tree in crash_points(ops, models):
        state = key(tree)
        trees.setdefault(state, tree)
        points.append({"event": k, "model": model, "state": state, "during": ops[k - 1].step if k else 0,
                       "what": describe(ops[k - 1]) if k else "before any"})
    tokens = shlex.split(resume)
    explicit = any(runs.STEP.search(t) for t in tokens)
    (out / "crash").mkdir(exist_ok=True)

    def resume_state(n: int, state: str) -> dict:
        newest = newest_complete(trees[state], checkpoints)
        template = base + (tokens if newest or not explicit else [])
        crashstates.write_tree(trees[state], out / "runs" / f"crash-{n:03d}")
        code, rows, _ = r.run(f"crash/{n:03d}", template, f"crash-{n:03d}", newest, CERTIFY_STEP_OFFSET=newest)
        rows, start = r.aligned(rows, newest) if rows else (rows, newest)
        found = verdict.judge(straight, stopped, rows, killed, max(newest, 1), resumed_from=start) if rows else None
        rebuilt = out / "rebuilt" / state
        return {"run": n, "newest_complete": newest, "resumed_from": start, "code": code, "rows": bool(rows),
                "found": found, "last_line": error_line(out / "crash" / f"{n:03d}.log"),
                "rebuild": f"python -m certkit.saves {shlex.quote(str(out))} {state} {rebuilt} && "
                           + shlex.join(runs.substitute(template, rebuilt, newest))}

    chosen = sampled(points, max_points)
    resumed = dict(zip(chosen, r.map(resume_state, list(enumerate(chosen)), jobs)))
    for p in points:
        if p["state"] not in resumed:
            p["outcome"] = "not resumed (--max-points)"
            continue
        s = resumed[p["state"]]
        finished = max((j for j, (last, _) in checkpoints.items() if last < p["event"]), default=0)
        p.update(newest_complete=s["newest_complete"], resumed_from=s["resumed_from"], run=s["run"],
                 **classify(s["code"], s["rows"], s["resumed_from"], s["newest_complete"], finished, s["found"],
                            s["last_line"]))
        if p["outcome"] != "exact":
            p["rebuild"] = s["rebuild"]
    counts = {model: {o: sum(p["model"].startswith(model) and p["outcome"] == o for p in points) for o in OUTCOMES}
              for model in models}
    return {"points": points, "counts": counts, "checkpoints": sorted(checkpoints), "events": len(ops),
            "states": len(trees), "resumed": len(resumed)}


def error_line(log: Path) -> str:
    """The exception a failed resume raised (its last `SomethingError: ...` line, with the `[rank1]: ` torchrun
    puts before a rank's lines: a launcher such as torchrun ends its output with a banner of its own), else
    its last line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    raised = [line.strip() for line in lines if re.match(r"\s*(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b", line)
              and "ChildFailedError" not in line]  # torchrun's own, after the rank's
    return raised[-1] if raised else runs.last_line(log)


def describe(op: Op) -> str:
    what = {"creat": f"create {op.path}", "write": f"write {len(op.data)} bytes", "trunc": "truncate",
            "fsync": "fsync", "rename": f"rename {op.path} -> {op.dest}", "unlink": f"unlink {op.path}",
            "mkdir": f"mkdir {op.path}", "rmdir": f"rmdir {op.path}", "fsync_dir": f"fsync dir {op.path or '.'}"}
    return what.get(op.kind, op.kind)


def certify_crash(command: list, resume: str, out: Path, stop_after: int, timeout: float = 3600,
                  max_points: int = 64, models=MODELS, jobs: int = 1) -> dict:
    """certify --crash: the straight run, the stopped run with its saves recorded (killed before step
    STOP_AFTER + 1), then the crash matrix; crash.json, crash.md and crash.svg written to OUT. Raises CannotJudge."""
    runs.check_options(command, None, stop_after, 0, 0, False, False)
    if max_points < 1:
        raise CannotJudge(f"--max-points must be at least 1 (got {max_points})")
    if jobs < 1:
        raise CannotJudge(f"--jobs must be at least 1 (got {jobs})")
    out = out.resolve()
    runs.prepare(out)
    r = runs.Runs(out, timeout, stop_after, command + shlex.split(resume))
    straight, stopped, killed = runs.straight_and_stopped(
        r, command, resume, 0, 0, False,
        saves={"CERTIFY_SAVES": out / "saves", "CERTIFY_SAVES_ROOT": out / "runs" / "resumed"})
    matrix = crash_matrix(r, command, resume, straight, stopped, killed, max_points, models, jobs)
    failing = sum(matrix["counts"][m][o] for m in models for o in FAILING)
    found = {"format": 1, "mode": "crash", "exact": failing == 0, "failing": failing, "command": command,
             "resume": resume, "stop_after": stop_after, "not_recorded": r.notes(), **matrix}
    outdir.publish(out, {"crash.json": json.dumps(found, indent=1) + "\n",
                         "crash.md": markdown(found, shlex.join(command)), "crash.svg": picture(found)})
    return found


# crash.svg's colour per outcome (its legend says which is which)
COLOURS = {"exact": "#4caf50", "lost work": "#ffb300", "started over": "#fb8c00", "hard fail": "#e53935",
           "silent": "#8e24aa", "not resumed (--max-points)": "#d0d0d0"}


def picture(matrix: dict) -> str:
    """crash.svg: crash point x failure model. A column per file event k (a crash after k events), grouped
    under the save it belongs to; a row per failure model (torn writes their own); a cell split in slices
    where a model leaves several states after the same event (power loss), each slice its point's outcome,
    which its tooltip names."""
    points, events = matrix["points"], matrix["events"]
    rows = list(dict.fromkeys(p["model"] for p in points))
    cell, left, top = 16, 170, 52
    width, height = left + cell * (events + 1) + 10, top + cell * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(width, 900)}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="4" y="14">certify --crash: a crash after each of {events} file events '
           f'({matrix["resumed"]} of {matrix["states"]} distinct states resumed)</text>']
    during, save = {p["event"]: p["during"] for p in points}, 0
    for k in range(1, events + 1):  # the save each event belongs to, named above its first event
        if during.get(k, save) != save:
            save = during[k]
            out.append(f'<text x="{left + k * cell}" y="{top - 18}">save after step {save}</text>'
                       f'<line x1="{left + k * cell}" y1="{top - 14}" x2="{left + k * cell}" y2="{top - 2}" '
                       'stroke="#666"/>')
        if k % 5 == 0:
            out.append(f'<text x="{left + k * cell + 2}" y="{top - 4}" font-size="9">{k}</text>')
    for i, model in enumerate(rows):
        y = top + i * cell
        out.append(f'<text x="4" y="{y + 12}">{model}</text>')
        for k in range(events + 1):
            here = [p for p in points if p["model"] == model and p["event"] == k]
            x = left + k * cell
            if not here:
                out.append(f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="#ffffff" '
                           'stroke="#ccc" stroke-width="0.5"/>')
            for j, p in enumerate(here):
                h = (cell - 1) / len(here)
                out.append(f'<rect x="{x}" y="{y + j * h:.2f}" width="{cell - 1}" height="{h:.2f}" '
                           f'fill="{COLOURS[p["outcome"]]}" stroke="#999" stroke-width="0.3">'
                           f'<title>after event {k} ({escape(p["what"])}), {model}: {p["outcome"]}</title></rect>')
    x, y = 4, top + cell * len(rows) + 18
    out.append('<g id="legend">')
    for outcome, colour in {**COLOURS, "no state of its own (as the event before, or no write to tear)": "#ffffff"}.items():
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}" stroke="#ccc"/>'
                   f'<text x="{x + 13}" y="{y}">{outcome}</text>')
        x += 22 + 6 * len(outcome)
    out.append("</g>\n</svg>")
    return "\n".join(out) + "\n"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown(matrix: dict, command: str) -> str:
    """crash.md: the counts per failure model, then every crash point that did not resume exactly."""
    lines = [f"# certify --crash: `{command}`", "",
             f"{matrix['events']} file events in the saves after steps {', '.join(map(str, matrix['checkpoints']))}; "
             f"{matrix['states']} distinct states on disk, {matrix['resumed']} resumed. The matrix as a picture: "
             "crash.svg.", "",
             "| failure model | " + " | ".join(OUTCOMES) + " |", "|---|" + "---|" * len(OUTCOMES)]
    for model, counts in matrix["counts"].items():
        lines.append(f"| {model} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    failing = [p for p in matrix["points"] if p.get("outcome") in FAILING]
    if failing:
        lines += ["", "| crash after event | in the save after step | model | outcome | detail | rebuild |",
                  "|---|---|---|---|---|---|"]
        for p in failing:
            detail = p.get("why") or (f"{p['lost']} steps lost" + (", exact from there" if p.get("exact_from_there")
                                                                    else ", and it differs from there"))
            detail = detail if len(detail) <= 160 else detail[:157] + "..."
            lines.append(f"| {p['event']}: {p['what']} | {p['during']} | {p['model']} | {p['outcome']} | "
                         f"{detail.replace('|', '/')} | `{p['rebuild'].replace('|', '/')}` |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """python -m certkit.saves OUT STATE DEST: the crash state STATE of certify --crash's OUT rebuilt in DEST
    (a folder that must not exist), to resume by hand."""
    import sys

    out, state, dest = (argv or sys.argv[1:])[:3]
    dest = Path(dest)
    if dest.exists():
        print(f"certify: {dest} exists: give a new folder", file=sys.stderr)
        return 2
    for _, _, tree in crash_points(read(Path(out) / "saves")):
        if key(tree) == state:
            crashstates.write_tree(tree, dest)
            print(dest)
            return 0
    print(f"certify: no crash state {state} in {out}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
