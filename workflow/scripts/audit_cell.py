"""One cell of the audit: a framework's straight run against its resumed run, and a repair run where they differ.

  audit_cell.py --framework F --scenario S --adapter audit_F.py --settings audit.yaml --tokens T
                --straight DIR --stopped DIR --resumed DIR --out cell.json
"""

import argparse
import json
import tempfile
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.audit import judge, read_certificate, resumed_run
from mmkit.checkpoint import load_file
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("framework", "scenario", "adapter", "settings", "tokens", "straight", "stopped", "resumed", "out"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    straight, stopped, resumed = Path(args.straight), Path(args.stopped), Path(args.resumed)
    job = {"framework": args.framework, "adapter": args.adapter, "settings": args.settings, "tokens": args.tokens, "scenario": args.scenario,
           "checkpoint": str(stopped / "checkpoints"), "cut_state": str(straight / "cut_state.pt"),
           "reference": str(straight / "certificate.jsonl")}
    with tempfile.TemporaryDirectory(prefix="repair-") as tmp:
        row = judge(args.framework, args.scenario, *(read_certificate(d / "certificate.jsonl")
                                                     for d in (straight, stopped, resumed)),
                    load_file(straight / "weights.pt", "weights file"), load_file(resumed / "weights.pt", "weights file"),
                    lambda pieces: resumed_run(job, Path(tmp) / "_".join(pieces), repair=pieces))
    write_text_atomic(args.out, json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    run_cli(main)
