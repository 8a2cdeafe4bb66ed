"""Copy a run's summary.md into README.md's results block (make readme), so the table is never typed."""

import argparse
from pathlib import Path

from mmkit.checkpoint import write_text_atomic
from mmkit.errors import run_cli
from mmkit.report import splice_readme


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("summary", help="results/summary.md of a default run")
    p.add_argument("readme", help="README.md to update in place")
    args = p.parse_args()
    write_text_atomic(args.readme, splice_readme(Path(args.readme).read_text(), Path(args.summary).read_text()))


if __name__ == "__main__":
    run_cli(main)
