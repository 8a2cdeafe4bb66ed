"""Fill README.md's generated blocks from artifacts (make readme), so no table in it is typed.

  update_readme.py README.md results=results/summary.md bench=bench/targets.md
"""

import argparse
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.errors import UserError, run_cli
from mmkit.report import splice_readme


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("readme", help="README.md to update in place")
    p.add_argument("blocks", nargs="+", metavar="BLOCK=FILE", help="fill <!-- BLOCK:start/end --> with FILE")
    args = p.parse_args()
    text = Path(args.readme).read_text()
    for item in args.blocks:
        block, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise UserError(f"{item}: expected BLOCK=FILE with an existing FILE")
        text = splice_readme(text, Path(path).read_text(), block)
    write_text_atomic(args.readme, text)


if __name__ == "__main__":
    run_cli(main)
