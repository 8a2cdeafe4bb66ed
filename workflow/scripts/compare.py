"""Compare two weights files tensor by tensor: max |A - B| per tensor, and which differ.

Exit 0 when every tensor matches (exactly, or within --atol), 1 when some differ, 2 on bad input.
Works on a resume file too (its "model" entry is compared).
"""

import argparse
import math
import sys

from mmkit.checkpoint.files import compare_state_dicts, count_nonfinite, load_file
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

    a, b = weights_of(args.a), weights_of(args.b)
    diffs = compare_state_dicts(a, b)
    # NaN <= atol is False: a tensor with a NaN or Inf the other side lacks always differs
    differing = [k for k, d in diffs.items() if d is None or not d <= args.atol]
    if not args.quiet:
        for k, d in diffs.items():
            mark = "DIFF" if k in differing else "same"
            if d is None:
                what = "missing or other shape"
            elif math.isnan(d):
                what = f"non-finite values (A: {count_nonfinite(a[k])}, B: {count_nonfinite(b[k])})"
            else:
                what = f"{d:.3e}"
            print(f"{mark}  {what}  {k}")
    finite = [d for d in diffs.values() if d is not None and not math.isnan(d)]
    nonfinite = sum(d is not None and math.isnan(d) for d in diffs.values())
    worst = f"{max(finite, default=0.0):.3e}" + (f" over the finite ones; {nonfinite} hold NaN/Inf" if nonfinite else "")
    print(f"{len(differing)} of {len(diffs)} tensors differ; max |diff| {worst}")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    run_cli(main)
