"""certify/report.md, the report's section on the configured certify entries (a row each), and summary.md,
the same table for the README."""

import argparse
import json
from pathlib import Path

from certkit.outdir import write_atomic
from certkit.verdict import NAMES


def row(path: Path) -> str:
    v = json.loads(path.read_text())
    name, f = path.parent.name, v["first"]
    where = "" if v["exact"] else f"step {f['step']}, rank {f['rank']}: {NAMES[f['piece']]}"
    lose = f" (+{v['lose']} lost)" if v["lose"] else ""
    resume = f"`{v['resume']}`" if v["resume"] else "(nothing: it auto-resumes)"
    return (f"| {name} | {'exact' if v['exact'] else '**not exact**'} | {where} | {v['stop_after']}{lose} | "
            f"`{' '.join(v['command'])}` | {resume} |")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--verdicts", nargs="*", type=Path, default=[])
    p.add_argument("--report", required=True, type=Path)
    p.add_argument("--summary", required=True, type=Path)
    args = p.parse_args()
    table = ["| entry | verdict | first difference | stop after | command | resumed with |", "|---|---|---|---|---|---|",
             *(row(p) for p in args.verdicts)]
    write_atomic(args.summary, "\n".join(table) + "\n")
    write_atomic(args.report, "\n".join([
        "## 재개 인증 (certify: training commands killed and resumed)", "",
        "Each command run straight, SIGKILLed before the update of the step after its checkpoint (and the steps "
        "it loses), and resumed; the first optimizer step, rank and piece of state where the resumed run leaves "
        "the straight one. Each entry's verdict.md and parting.svg are in its folder.", "", *table]) + "\n")


if __name__ == "__main__":
    main()
