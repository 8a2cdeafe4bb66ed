"""A framework's negative control: its own resume from a checkpoint whose optimizer state was emptied, with the
repairs its mid-epoch cell needed. The certificate must name the first step after the cut, or it would not
see a real fault.
"""

import argparse
import json
import tempfile
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.audit import SCENARIOS, STEPS, Runs, first_difference, read_certificate, version
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    for name in ("framework", "scenario", "adapter", "settings", "tokens", "cell", "out", "certificate"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    cell_dir, cut = Path(args.cell), SCENARIOS[args.scenario].cut
    repairs = json.loads((cell_dir / "cell.json").read_text())["repaired"]  # then only the emptied optimizer is left
    runs = Runs(args.framework, args.adapter, args.settings, args.tokens, args.scenario, cell_dir)
    with tempfile.TemporaryDirectory(prefix="control-") as tmp:
        certificate, _ = runs.resumed_again(Path(tmp), repair=repairs, drop_optimizer=True)
        write_text_atomic(args.certificate, (Path(tmp) / "certificate.jsonl").read_text())
    first = first_difference(read_certificate(cell_dir / "straight/certificate.jsonl"), certificate,
                             range(cut + 1, STEPS + 1))
    row = {"framework": args.framework, "version": version(args.framework), "scenario": args.scenario,
           "control": "optimizer state emptied", "repairs": repairs, "cut": cut,
           "first_step": first[0] if first else None, "first_state": first[1] if first else None,
           "caught": bool(first) and first[0] == cut + 1}
    write_text_atomic(args.out, json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    run_cli(main)
