"""The audit's matrix from its cells: matrix.csv (one row per framework and scenario), summary.md, matrix.png and
the report's section on it (report.md); the negative controls are those the control scenario's cells ran."""

import argparse
import json
from pathlib import Path

import torch

from mmkit.atomic import write_csv_atomic, write_text_atomic
from trainer_audit.audit import COLUMNS, fp16_as_trained, report_section, summary_table, verdict
from mmkit.errors import run_cli
from mmkit.plots import plot_audit


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cells", nargs="+", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--plot", required=True)
    p.add_argument("--report", required=True)
    args = p.parse_args()
    rows = [json.loads(Path(c).read_text()) for c in args.cells]
    controls = [r["control"] for r in rows if "control" in r]
    write_csv_atomic(args.csv, COLUMNS, rows)
    # the final parameters the recorder kept of each straight run: what fp16 really trained in
    finals = {(r["framework"], r["scenario"]): Path(c).parent / "certify" / "straight" / "rank0.final.pt"
              for r, c in zip(rows, args.cells) if r["scenario"] in ("fp16", "bf16", "mid_epoch")}
    straight = {key: torch.load(path, weights_only=True) for key, path in finals.items() if path.exists()}
    write_text_atomic(args.summary, summary_table(rows, controls, fp16_as_trained(straight)))
    write_text_atomic(args.report, report_section(rows, controls))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    by = {(r["framework"], r["scenario"]): verdict(r) for r in rows}
    plot_audit([[by[f, s] for s in scenarios] for f in frameworks], frameworks, scenarios, args.plot)


if __name__ == "__main__":
    run_cli(main)
