"""Compare two weights files tensor by tensor: max |A - B| per tensor, and which differ.

Exit 0 when every tensor matches (exactly, or within --atol), 1 when some differ, 2 on bad input.
Works on a resume file too (its "model" entry is compared).
"""

import argparse
import sys

from mmkit.checkpoint import compare_state_dicts, load_file
from mmkit.errors import UserError, run_cli


def weights_of(path):
    obj = load_file(path)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]  # a resume file
    if not isinstance(obj, dict) or not obj:
        raise UserError(f"{path} holds no state_dict")
    return obj


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--atol", type=float, default=0.0, help="largest |diff| still counted as equal")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    args = p.parse_args()

    diffs = compare_state_dicts(weights_of(args.a), weights_of(args.b))
    differing = [k for k, d in diffs.items() if d is None or not d <= args.atol]
    if not args.quiet:
        for k, d in diffs.items():
            mark = "DIFF" if k in differing else "same"
            print(f"{mark}  {'missing or other shape' if d is None else f'{d:.3e}'}  {k}")
    worst = max((d for d in diffs.values() if d is not None), default=0.0)
    print(f"{len(differing)} of {len(diffs)} tensors differ; max |diff| {worst:.3e}")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    run_cli(main)
