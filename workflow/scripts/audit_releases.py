"""The audit across releases from its cells: releases.csv (one row per framework, release and scenario),
releases.md (the first release exact for each framework and scenario, then every release's verdicts) and
releases.png (releases across, scenarios down, a panel per framework)."""

import argparse
import json
from pathlib import Path

from mmkit.atomic import write_csv_atomic, write_text_atomic
from trainer_audit.audit import RELEASE_COLUMNS, release_label, release_order, releases_table, verdict
from mmkit.errors import run_cli
from mmkit.plots import plot_releases


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cells", nargs="+", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--plot", required=True)
    args = p.parse_args()
    rows = sorted((json.loads(Path(c).read_text()) for c in args.cells), key=release_order)
    write_csv_atomic(args.csv, RELEASE_COLUMNS, ({**r, "first_piece": r["first_state"]} for r in rows))
    write_text_atomic(args.table, releases_table(rows))
    panels = []
    for framework in dict.fromkeys(r["framework"] for r in rows):
        mine = [r for r in rows if r["framework"] == framework]
        scenarios = list(dict.fromkeys(r["scenario"] for r in mine))
        label = {id(r): release_label(r).replace(" (", "\n(") for r in mine}  # the package it goes through below
        releases = list(dict.fromkeys(label[id(r)] for r in mine))
        by = {(label[id(r)], r["scenario"]): r for r in mine}
        cells = [[by[rel, s] for rel in releases] for s in scenarios]
        text = [["skipped" if r["cause"].startswith("skipped") else verdict(r) for r in row] for row in cells]
        panels.append((framework, [[verdict(r) for r in row] for row in cells], text, scenarios, releases))
    plot_releases(panels, args.plot)


if __name__ == "__main__":
    run_cli(main)
