"""Fill the generated blocks of README.md and docs/*.md from artifacts (make readme), so no table in them is typed.

  update_readme.py README.md docs/*.md results=results/summary.md bench=bench/targets.md

Each BLOCK must be in exactly one of the Markdown files named, once. Every check is made before any
file is written, so a bad argument leaves every file as it was; a file is rewritten (atomically) only
when one of its blocks changed.
"""

import argparse
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.errors import UserError, run_cli
from mmkit.report import splice_readme


def markers(block: str) -> tuple[str, str]:
    return f"<!-- {block}:start -->", f"<!-- {block}:end -->"


def holder(texts: dict[str, str], block: str) -> str:
    """The one file among TEXTS that holds BLOCK, once."""
    found = [path for path, text in texts.items() if any(m in text for m in markers(block))]
    if not found:
        raise UserError(f"block '{block}': no <!-- {block}:start --> in {', '.join(texts)}")
    if len(found) > 1:
        raise UserError(f"block '{block}' is in {' and '.join(found)}: a block must live in one file")
    text = texts[found[0]]
    if any(text.count(m) != 1 for m in markers(block)):
        raise UserError(f"{found[0]}: block '{block}' needs one <!-- {block}:start --> and one <!-- {block}:end -->")
    return found[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="+", metavar="FILE.md | BLOCK=FILE",
                   help="Markdown files to update in place, then BLOCK=FILE: fill <!-- BLOCK:start/end --> with FILE")
    args = p.parse_args()
    targets = [item for item in args.items if "=" not in item]
    blocks = [item.partition("=") for item in args.items if "=" in item]
    if not targets or not blocks:
        raise UserError("expected one or more Markdown files, then one or more BLOCK=FILE")
    names = [block for block, _, _ in blocks]
    if len(set(names)) < len(names):
        raise UserError(f"a block named twice: {' '.join(names)}")
    for path in targets:
        if not Path(path).is_file():
            raise UserError(f"{path}: no such Markdown file to fill")
    texts = {path: Path(path).read_text() for path in targets}
    new = dict(texts)
    for block, _, path in blocks:
        if not block or not Path(path).is_file():
            raise UserError(f"{block}={path}: expected BLOCK=FILE with an existing FILE")
        where = holder(new, block)
        new[where] = splice_readme(new[where], Path(path).read_text(), block)
    for path, text in new.items():
        if text != texts[path]:
            write_text_atomic(path, text)


if __name__ == "__main__":
    run_cli(main)
