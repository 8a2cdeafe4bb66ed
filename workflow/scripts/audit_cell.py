"""One cell of the audit: a framework's straight, stopped and resumed runs, each a new process (mmkit.audit.Runs),
compared step by step, and a repair run where they differ.

  audit_cell.py --framework F --scenario S --adapter audit_F.py --settings audit.yaml --tokens T
                --cell DIR --out DIR/cell.json
"""

import argparse
import json
import tempfile
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.audit import Runs, judge, read_certificate
from mmkit.checkpoint import load_file
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("framework", "scenario", "adapter", "settings", "tokens", "cell", "out"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    cell = Path(args.cell)
    runs = Runs(args.framework, args.adapter, args.settings, args.tokens, args.scenario, cell)
    with tempfile.TemporaryDirectory(prefix="audit-") as tmp:
        runs.straight_stopped_resumed(Path(tmp))
        row = judge(args.framework, args.scenario,
                    *(read_certificate(cell / d / "certificate.jsonl") for d in ("straight", "stopped", "resumed")),
                    *(load_file(cell / d / "weights.pt", "weights file") for d in ("straight", "resumed")),
                    lambda pieces: runs.resumed_again(Path(tmp) / "_".join(pieces), repair=pieces))
    write_text_atomic(args.out, json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    run_cli(main)
