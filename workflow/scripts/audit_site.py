"""The audit as a static site (snakemake site): index.html with the matrix, the crash counts, the controls and the
releases' table, a page per cell and per release environment (trainer_audit/site.py), written to --out.

  audit_site.py --cells results/audit/F/S/cell.json ... [--release-cells results/audit/releases/R/F/S/cell.json ...]
                --out results/site
"""

import argparse
import sys
from pathlib import Path

from mmkit.errors import run_cli
from trainer_audit.site import build


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="+", required=True)
    p.add_argument("--release-cells", nargs="*", default=[])
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    pages = build(args.cells, args.release_cells, args.out)
    print(f"site: {len(pages)} pages in {args.out}; open {args.out / 'index.html'}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
