"""Certificates compared: exact or not, and if not, the first step, rank and piece of state that differ.

A certificate is a folder of rank<R>.jsonl files, a row per optimizer step (certkit.recorder). The pieces
are compared in causal order, what a step reads before what it writes: the first one named is the cause,
the later ones its consequences. At the first differing step, the rank named is the one whose first
differing piece comes earliest (rank 1's RNG before rank 0's gradients, which the all-reduce carried over).

Exact means: at every step after the resumed run's start, on every rank, what the step computed from and
computed is equal: the parameters it starts from, the model's inputs, the gradients, the LR, the GradScaler's
scale, the optimizer state and the parameters after it. A global RNG state is what a step may draw from,
not what it computed: a step where only an RNG state differs (a draw that nothing trained used, such as one
more DataLoader iterator) is a warning naming that step; once anything computed differs, an RNG that
differs there is named as its cause.

Where the resumed run really started is found, not assumed: the parameters its first step starts from are
those the straight run's step j + 1 started from. A command that auto-resumes from its newest checkpoint,
older than K, starts from j < K and redoes K - j steps; its steps are compared from j + 1.
"""

import json
from pathlib import Path

from .recorder import PIECES

NAMES = {"missing": "the step itself (one run lacks it)", "params_in": "the parameters the step starts from",
         "samples": "samples (what the model received)",
         "rng_torch": "RNG (torch)", "rng_numpy": "RNG (numpy)", "rng_python": "RNG (Python)",
         "rng_cuda": "RNG (CUDA)", "gradients": "gradients", "scale": "GradScaler scale", "lr": "LR",
         "optimizer": "optimizer state", "params": "parameters"}
ORDER = ("missing",) + PIECES
FORMAT = 1  # verdict.json's format (verdict.schema.json beside this module): a new number, a changed meaning
RNG = tuple(p for p in PIECES if p.startswith("rng_"))  # what a step may draw from, not what it computed
# what each process has of its own: on another number of ranks a process gets other slices and draws
PER_PROCESS = ("samples", "rng_torch", "rng_numpy", "rng_python", "rng_cuda")
# certify --crash: what resuming a crash state gives (saves.classify), and which of those fail
OUTCOMES = ("exact", "lost work", "started over", "hard fail", "silent")
FAILING = OUTCOMES[1:]
REPAIRED = {"samples": "the straight run's model inputs (every forward after step K)",
            "rng": "the straight run's RNG states (at the first forward of step K + 1)"}


def read(folder) -> tuple[dict, dict]:
    """({rank: {step: row}}, {rank: the step it was killed at}) of a run's certificate folder."""
    rows, killed = {}, {}
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill of another process of the group
                continue
            if "killed" in row:
                killed[row["rank"]] = row["killed"]
            else:
                rows.setdefault(row["rank"], {})[row["step"]] = row
    return rows, killed


def steps_of(rows: dict) -> dict:
    return {rank: (min(by_step), max(by_step)) for rank, by_step in sorted(rows.items())}


def differing(a: dict | None, b: dict | None, ignore=()) -> list:
    if a is None or b is None:
        return ["missing"]
    return [p for p in PIECES if a.get(p) != b.get(p) and p not in ignore]


def differences(reference: dict, other: dict, steps, ignore=()):
    """{step, rank, piece, pieces: {rank: [pieces]}} of each step in STEPS where OTHER differs from REFERENCE
    on any rank (IGNORE: pieces not compared); the rank named is the one whose first piece comes earliest."""
    ranks = sorted(set(reference) | set(other))
    for step in steps:
        found = {r: differing(reference.get(r, {}).get(step), other.get(r, {}).get(step), ignore) for r in ranks}
        found = {r: pieces for r, pieces in found.items() if pieces}
        if found:
            rank = min(found, key=lambda r: (ORDER.index(found[r][0]), r))
            yield {"step": step, "rank": rank, "piece": found[rank][0], "pieces": found}


def computed(found: dict) -> bool:
    """Whether a step's differences reach what it computed (anything but an RNG state)."""
    return any(p not in RNG for pieces in found["pieces"].values() for p in pieces)


def first_difference(reference: dict, other: dict, steps, ignore=()) -> dict | None:
    """The first step in STEPS where what a step computed differs (differences' dict), or None; a step where
    only an RNG state differs is passed over (rng_warning names it)."""
    return next((found for found in differences(reference, other, steps, ignore) if computed(found)), None)


def rng_warning(reference: dict, other: dict, steps, ignore=()) -> dict | None:
    """The first step in STEPS where an RNG state differs while nothing computed does, or None."""
    return next((found for found in differences(reference, other, steps, ignore) if not computed(found)), None)


def real_start(straight: dict, leg: dict, offset: int) -> int:
    """The step j whose state a resumed run's LEG (labelled from OFFSET) really started from: its first step
    starts from the parameters the straight run's step j + 1 started from. OFFSET where they match, or where
    none does (a lossy restore: then the parameters it starts from differ, at OFFSET + 1); the match nearest
    to OFFSET where several do (an update that changed nothing)."""
    rank = min(leg)
    first = leg[rank][min(leg[rank])].get("params_in")
    reference = straight.get(rank, {})
    matches = [s - 1 for s, row in reference.items() if first is not None and row.get("params_in") == first]
    return min(matches, key=lambda j: (abs(j - offset), j)) if matches else offset


def relabelled(leg: dict, offset: int, start: int) -> dict:
    """LEG's rows numbered from START instead of OFFSET."""
    shift = start - offset
    return {r: {s + shift: {**row, "step": s + shift} for s, row in rows.items()} for r, rows in leg.items()}


def unseeded_rngs(straight: dict, stopped: dict) -> list:
    """The global RNGs a command never seeds: they differ between its straight and stopped run at step 1."""
    return sorted({p for p in RNG for r in straight
                   if 1 in stopped.get(r, {}) and straight[r][1].get(p) != stopped[r][1].get(p)})


def judge(straight: dict, stopped: dict, resumed: dict, killed: dict, stop_after: int,
          other_world: bool = False, resumed_from: int | None = None) -> dict:
    """The verdict on three runs' certificates: straight, stopped (killed before step KILLED's update) and
    resumed (from step STOP_AFTER's checkpoint; RESUMED_FROM: the step whose state it really started from,
    its rows numbered from there: real_start, relabelled). OTHER_WORLD: the resumed run is another command, which may
    run on another number of ranks: then it is compared on the ranks both runs have, in what the update
    computes from (gradients after any all-reduce, LR, optimizer state, parameters), not in what each process
    has of its own (PER_PROCESS)."""
    last = max(max(rows) for rows in straight.values())
    killed_at = min(killed.values())
    # a global RNG the command never seeds starts from the OS's entropy in every process: it differs between
    # two fresh runs from their first step. Left uncompared: if the command draws from it, what it drew
    # differs too (samples, gradients) and the runs are found not to repeat themselves.
    unseeded = unseeded_rngs(straight, stopped)
    before_kill = first_difference(straight, stopped, range(1, killed_at), unseeded)
    rescaled = other_world and set(resumed) != set(straight)
    compared = {r: rows for r, rows in straight.items() if r in resumed} if rescaled else straight
    if rescaled:
        unseeded = sorted(set(unseeded) | set(PER_PROCESS), key=PIECES.index)
    start = stop_after if resumed_from is None else resumed_from
    steps = range(start + 1, last + 1)
    first = first_difference(compared, resumed, steps, unseeded)
    extra = sorted({s for rows in resumed.values() for s in rows if s > last})
    if first is None and extra:
        first = {"step": extra[0], "rank": min(resumed), "piece": "missing", "pieces": {}}
    warning = rng_warning(compared, resumed, range(start + 1, first["step"] if first else last + 1), unseeded)
    started_over = start == 0 < stop_after
    # each rank's own first difference (a rank may part later than the first one): the JUnit report's cases
    by_rank = {r: first_difference({r: rows}, {r: resumed.get(r, {})}, steps, unseeded) for r, rows in compared.items()}
    return {"exact": first is None and not started_over, "deterministic": before_kill is None,
            "before_kill": before_kill, "first": first,
            "first_by_rank": {r: f and {"step": f["step"], "piece": f["piece"]} for r, f in sorted(by_rank.items())},
            "resumed_from": start, "started_over": started_over,
            "rng_warning": warning, "steps": {"straight": steps_of(straight), "stopped": steps_of(stopped),
                                      "resumed": steps_of(resumed)},
            "killed_at": killed, "stop_after": stop_after, "last_step": last, "not_compared": unseeded,
            "ranks": {"straight": len(set(stopped) | set(straight)), "resumed": len(resumed)} if rescaled else None}


def parted(straight: dict, stopped: dict, resumed: dict, start: int, kill_at: int) -> int | None:
    """The step by which every rank of the resumed run has parted from the straight run, where each has (and
    the straight run got past the kill): the verdict's last step when the runs end at the first difference.
    A function of the certificates alone, so that the verdict is the same whenever the runs were ended."""
    if min(max(rows) for rows in straight.values()) < kill_at - 1:
        return None
    ignore, steps = unseeded_rngs(straight, stopped), range(start + 1, max(max(r) for r in straight.values()) + 1)
    each = [first_difference({r: rows}, {r: resumed.get(r, {})}, steps, ignore) for r, rows in straight.items()]
    return None if any(f is None or f["piece"] == "missing" for f in each) else max(f["step"] for f in each)


def truncated(rows: dict, last: int) -> dict:
    """ROWS up to step LAST."""
    return {r: {s: row for s, row in by_step.items() if s <= last} for r, by_step in rows.items()}


def final_gap(a, b, ranks=None) -> float | None:
    """max |Δw| between the final parameters two runs' recorders kept (rank<R>.final.pt, every rank of A, or
    RANKS), or None where a rank's are missing or differ in shape."""
    import torch

    gaps = []
    for path in sorted(Path(a).glob("rank*.final.pt")):
        if ranks is not None and int(path.name.split(".")[0].removeprefix("rank")) not in ranks:
            continue
        other = Path(b) / path.name
        if not other.exists():
            return None
        x, y = (torch.load(f, weights_only=True) for f in (path, other))
        if len(x) != len(y) or any(s.shape != t.shape for s, t in zip(x, y)):
            return None
        gaps += [float((s.double() - t.double()).abs().max()) if s.numel() else 0.0 for s, t in zip(x, y)]
    return max(gaps) if gaps else None


# --- what is written ----------------------------------------------------------------------------------


def real_start_note(v: dict) -> str | None:
    """Where the resumed run really started, where that is not step K's state."""
    j, k = v.get("resumed_from", v["stop_after"]), v["stop_after"]
    if j == k:
        return None
    if j == 0:
        return f"it started over from step 0's state (the initial weights), not step {k}'s: {k} steps redone"
    if j < k:
        return f"resumed from step {j}'s state, not {k}'s: {k - j} step{'s' * (k - j > 1)} redone"
    return f"resumed from step {j}'s state, not {k}'s: {j - k} step{'s' * (j - k > 1)} after the cut kept"


def headline(v: dict) -> str:
    note = real_start_note(v)
    where = f" ({note})" if note else ""
    f, start = v["first"], v.get("resumed_from", v["stop_after"])
    differs = f"first difference at step {f['step']}, rank {f['rank']}: {NAMES[f['piece']]}" if f else ""
    if v.get("started_over"):
        return f"**not resumed**: {note}" + (f"; then {differs}" if f else "; from there it matches the straight run")
    if v.get("rng_warning"):
        where += f"; warning: from step {v['rng_warning']['step']} only an RNG state differs, a draw nothing used"
    if not v["exact"]:
        return f"**not exact**: {differs}{where}"
    if v.get("ranks"):
        return (f"**exact**: the resumed run matches the straight run at every optimizer step "
                f"{start + 1}..{v['last_step']}, on the ranks both have, in what the update computes from{where}")
    return (f"**exact**: the resumed run matches the straight run at every optimizer step "
            f"{start + 1}..{v['last_step']}, on every rank, in everything the steps computed{where}")


def causes(v: dict) -> str | None:
    """The diagnosis in a few words: each cause's title, and where it was found (None when there is none)."""
    d = v.get("diagnosis")
    if not d:
        return None
    return "; ".join(c["title"] + (f" ({c['where']})" if c.get("where") else "") for c in d["causes"])


def why(v: dict) -> str | None:
    """The diagnosis in one line, as the command prints it and a JUnit failure ends."""
    return causes(v) and f"why: {causes(v)}"


def why_section(v: dict) -> list:
    """verdict.md's "Why" section: each cause of the first difference with its evidence, where and fix."""
    d = v.get("diagnosis")
    if not d:
        return []
    lines = [f"## Why (step {d['step']}, rank {d['rank']})", ""]
    for c in d["causes"]:
        lines.append(f"- **{c['title']}**: {c['evidence']}.")
        if c.get("where"):
            lines.append(f"  Where: `{c['where']}`.")
        if c.get("fix"):
            lines.append(f"  Usual fix: {c['fix']}.")
    lines += ["", "Compared: " + "; ".join(d["compared"]) + ".", ""] if d["compared"] else [""]
    return lines


def warnings(v: dict) -> list:
    """verdict.md's lines on what is no difference but worth knowing: an RNG draw nothing used, what the
    recorders could not record."""
    lines, warning = [], v.get("rng_warning")
    if warning:
        what = "; ".join(f"rank {r}: " + ", ".join(NAMES[p] for p in pieces)
                         for r, pieces in sorted(warning["pieces"].items()))
        lines += [f"Warning: from step {warning['step']} the global RNG state differs ({what}) while nothing the "
                  "steps computed does: one run drew from it once more or less (one more DataLoader iterator, say) "
                  "and nothing trained used the draw. Not a difference in the model; a later draw from it would "
                  "show as one.", ""]
    for run, notes in sorted((v.get("not_recorded") or {}).items()):
        lines += [f"Not recorded in the {run} run: " + "; ".join(notes) + ".", ""]
    return lines


def final_parameters(v: dict) -> list:
    """verdict.md's lines on the final parameters: how far apart they ended, or why that was not measured."""
    if v.get("ended_early"):
        return [f"Final parameters: {v['ended_early']['why']}.", ""]
    if v.get("max_abs_dw") is not None:
        return [f"Final parameters, straight vs resumed: max |Δw| = {v['max_abs_dw']:.3g}.", ""]
    return []


def markdown(v: dict, command: str, resume: str, lose: int) -> str:
    lines = [f"# Certificate of `{command}`", "", headline(v), ""]
    if not v["exact"]:
        f = v["first"]
        lines += [f"At step {f['step']}, differing pieces (causal order: parameters it starts from, samples, RNG, "
                  "gradients, LR, optimizer state, parameters):", ""]
        lines += [f"- rank {r}: " + ", ".join(NAMES[p] for p in pieces) for r, pieces in sorted(f["pieces"].items())]
        lines.append("")
        lines += why_section(v)
    lines += warnings(v)
    repair = v.get("repair")
    if repair and repair["restored"]:
        again, what = repair["first"], " and ".join(REPAIRED[p] for p in repair["restored"])
        lines += [f"Repair: resumed again with {what} put back by hand: " + (
            f"**exact**, so {'they were' if len(repair['restored']) > 1 else 'it was'} all the checkpoint forgot."
            if repair["exact"] else "still not exact" + (f", first at step {again['step']}, rank {again['rank']}: "
                                                        f"{NAMES[again['piece']]}" if again else f" ({repair['why']})")
            + "."), ""]
    elif repair and not v["exact"]:
        lines += [f"Repair: none tried ({repair['why']}).", ""]
    control = v.get("control")
    if control:
        with_repairs = f" (with {' and '.join(control['restored'])} repaired)" if control["restored"] else ""
        step = v.get("resumed_from", v["stop_after"]) + 1
        said = "Negative control: resumed again" + with_repairs + " with the optimizer state emptied before its first update"
        if control.get("outcome", "caught" if control["caught"] else "not caught") == "inconclusive":
            lines += [f"{said}: **inconclusive**: {control['why']}.", ""]
        else:
            seen = (f"first difference at step {control['first']['step']}, rank {control['first']['rank']}: "
                    f"{NAMES[control['first']['piece']]}" if control["first"] else "no difference")
            verdict = (f"its optimizer state differs at step {step} and the resumed run's does not, so it is "
                       "**caught**" if control["caught"] else "so it is **NOT caught**: the certificate does not see "
                       "a checkpoint that forgot the optimizer")
            lines += [f"{said}: {seen}; {verdict}.", ""]
    lines += final_parameters(v)
    killed = ", ".join(f"rank {r} at step {s}" for r, s in sorted(v["killed_at"].items()))
    lines += ["| run | optimizer steps, per rank |", "|---|---|"]
    for run in ("straight", "stopped", "resumed"):
        lines.append(f"| {run} | " + "; ".join(f"rank {r}: {a}..{b}" for r, (a, b) in v["steps"][run].items()) + " |")
    lines += ["", f"Stopped by SIGKILL before the update of step {v['stop_after'] + 1 + lose} "
              f"(`--stop-after {v['stop_after']}`{f' `--lose {lose}`' if lose else ''}; recorded: {killed}); "
              f"resumed with `{resume}` from step {v['stop_after']}'s checkpoint"
              + (f", killed again before the update of step {v['again'] + 1} and resumed from its own checkpoint of "
                 f"step {v['again']}" if v.get("again") else "") + ".", ""]
    if v.get("straight_from"):
        lines += [f"The straight run is the one certify ran for `{v['straight_from']}` (`--straight-from`): the same "
                  "command, reused.", ""]
    lines += ["![where the runs part](parting.svg)", ""]
    if v.get("ranks"):
        n = v["ranks"]
        lines += [f"Resumed on {n['resumed']} rank{'s' * (n['resumed'] > 1)} of {n['straight']} (`{v['resume_command']}`):"
                  f" compared on rank {', '.join(str(r) for r in sorted(v['steps']['resumed']))} in what the update "
                  "computes from (gradients after the all-reduce, LR, optimizer state, parameters); samples and "
                  "RNG states are each process's own there, and are not compared.", ""]
    elif v["not_compared"]:
        lines += ["Not compared: " + ", ".join(NAMES[p] for p in v["not_compared"]) + ", never seeded (it differs "
                  "between two fresh runs from their first step); what the command drew from it would show as "
                  "samples or gradients.", ""]
    return "\n".join(lines)


def svg(v: dict, straight: dict, resumed: dict) -> str:
    """Step x piece, one panel per rank: grey before the resumed run's start, green where the resumed run
    matches the straight run, red where what a step computed differs, amber where only an RNG state does,
    white where one run lacks the step; a piece never compared (an RNG never seeded) is hatched pale."""
    pieces = [p for p in PIECES if any(p in row for rows in straight.values() for row in rows.values())]
    last, cell, left, top = v["last_step"], 14, 190, 24
    start = v.get("resumed_from", v["stop_after"])
    ranks = sorted(set(straight) | set(resumed))
    panel_h = top + cell * len(pieces) + 12
    width, height = left + cell * last + 10, panel_h * len(ranks)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="11">']
    for i, rank in enumerate(ranks):
        y0 = i * panel_h
        out.append(f'<text x="4" y="{y0 + 14}">rank {rank}: optimizer step 1..{last}</text>')
        for j, piece in enumerate(pieces):
            y = y0 + top + j * cell
            label = NAMES[piece].removesuffix(" (what the model received)")
            if piece in v["not_compared"]:
                label += " (not compared)"
            out.append(f'<text x="4" y="{y + 11}">{label}</text>')
            for step in range(1, last + 1):
                a, b = straight.get(rank, {}).get(step), resumed.get(rank, {}).get(step)
                if step <= start or piece in v["not_compared"]:
                    colour = "#d0d0d0" if step <= start else "#f2f2f2"
                elif a is None or b is None:
                    colour = "#ffffff"
                elif a.get(piece) == b.get(piece):
                    colour = "#4caf50"
                else:
                    colour = "#ffb300" if piece in RNG and not differing(a, b, RNG + tuple(v["not_compared"])) \
                        else "#e53935"
                out.append(f'<rect x="{left + (step - 1) * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                           f'fill="{colour}" stroke="#999" stroke-width="0.3"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
