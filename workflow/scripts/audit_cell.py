"""One cell of the audit: certify on a framework's example script with the scenario's flags (straight, SIGKILLed
after the cut's checkpoint, resumed through the framework's own resume), with repairs, and for the
control scenario the negative control; in a crash scenario certify --crash, every crash state of the saves
resumed through the framework's auto-resume; the matrix row in cell.json.

  audit_cell.py --framework F --scenario S --script examples/X.py --settings audit.yaml --cell DIR
                [--own-preset presets/certify-own.yaml --jsonl train.jsonl --tokenizer tokenizer.json
                 --tokens train.npy]
                [--straight-from OTHER_CELL/certify]   # its straight run reused: the same command
                [--release versions.json]   # the audit across releases: run in release_env.py's venv
"""

import json
import sys
from pathlib import Path

import yaml

from certkit.errors import CannotJudge, ResumeFailed, StraightFailed
from certkit.runs import certify
from certkit.saves import certify_crash
from trainer_audit import audit
from mmkit.atomic import write_text_atomic
from mmkit.errors import OneLineParser, UserError, run_cli


def own_files(args, cell: Path) -> dict:
    """run.py's config for the scenario (and for its resume on fewer ranks), and its data: the first 32
    documents (8 batches an epoch) in MiniMind's format, or the tokens in windows on several ranks."""
    base, settings = (yaml.safe_load(Path(f).read_text()) for f in (args.own_preset, args.settings))
    scenario = audit.SCENARIOS[args.scenario]
    files = {"config": cell / "own.yaml", "resume_config": cell / "own-resumed.yaml"}

    def write_config(path: Path, ranks=None):
        write_text_atomic(path, yaml.safe_dump(audit.own_config(base, scenario, settings, ranks), sort_keys=False))

    write_config(files["config"])
    if scenario.resume_ranks:
        write_config(files["resume_config"], scenario.resume_ranks)
    if audit.own_format(scenario) == "windows":
        return {**files, "data": ["--tokens", args.tokens]}
    documents = Path(args.jsonl).read_text().splitlines()[:4 * audit.BATCHES_PER_EPOCH]
    write_text_atomic(cell / "own.jsonl", "\n".join(documents) + "\n")
    return {**files, "data": ["--jsonl", cell / "own.jsonl", "--tokenizer", args.tokenizer]}


def write_row(cell: Path, row: dict) -> None:
    write_text_atomic(cell / "cell.json", json.dumps(row, indent=1) + "\n")


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    for name in ("framework", "scenario", "script", "settings", "cell"):
        p.add_argument(f"--{name}", required=True)
    for name in ("own-preset", "jsonl", "tokenizer", "tokens", "release", "straight-from"):
        p.add_argument(f"--{name}")
    args = p.parse_args()
    release = json.loads(Path(args.release).read_text()) if args.release else None
    if release is None:
        audit.require(args.framework)
    cell, scenario = Path(args.cell), audit.SCENARIOS[args.scenario]

    def row_of(found):
        row = audit.row_of(args.framework, args.scenario, found)
        return audit.in_release(row, release) if release else row

    empty = {"deterministic": "", "exact": False, "first": None}
    if release and "skipped" in release:
        return write_row(cell, {**row_of(empty), "cause": f"skipped: {release['skipped']}"})
    if args.framework in dict(scenario.unsupported):
        return write_row(cell, audit.unsupported(row_of(empty)))
    own = own_files(args, cell) if args.framework == "own" else None
    python = release["python"] if release else sys.executable
    command, resume, resume_command = audit.command(args.framework, scenario, args.script, python, own)
    if scenario.crash:
        try:
            found = certify_crash([str(t) for t in command], resume, cell / "certify", scenario.crash,
                                  max_points=audit.CRASH_POINTS)
        except CannotJudge as e:
            raise UserError(f"{args.framework} {args.scenario}: {e}") from None
        return write_row(cell, audit.crash_row(args.framework, args.scenario, found))
    try:
        found = certify([str(t) for t in command], resume, cell / "certify", scenario.cut, scenario.lose,
                        repair=not scenario.again, again=scenario.again,
                        control=args.scenario == audit.CONTROL_SCENARIO and not release,
                        resume_command=[str(t) for t in resume_command] if resume_command else None,
                        straight_from=args.straight_from)
        row = row_of(found)
        if "control" in found:
            row["control"] = audit.control_of(args.framework, found)
    except ResumeFailed as e:  # the framework's resume failing is the cell's result, not the DAG's failure
        row = {**row_of(empty), "cause": str(e), "failed": True}
        print(f"audit: {e}", file=sys.stderr)
    except StraightFailed as e:
        if not release:
            raise UserError(f"{args.framework} {args.scenario}: {e}") from None
        row = {**row_of(empty), "cause": f"cannot run here: {e}", "failed": True}  # an old release on this torch
        print(f"audit: {e}", file=sys.stderr)
    except CannotJudge as e:
        raise UserError(f"{args.framework} {args.scenario}: {e}") from None
    write_row(cell, row)


if __name__ == "__main__":
    run_cli(main)
