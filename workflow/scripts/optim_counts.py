"""Count what the resume file holds: weight elements vs AdamW state elements, and their ratio."""

import argparse
import json
import os

from mmkit.atomic import write_text_atomic
from mmkit import store
from mmkit.errors import run_cli

TIED = "lm_head.weight"  # the embedding under a second name: one tensor, counted once


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume", required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()

    state = store.read(args.resume)
    model_numel = sum(t.numel() for k, t in state["model"].items() if k != TIED)
    # per parameter: exp_avg and exp_avg_sq (one element each per weight) and a 0-dim step counter
    optimizer_numel = sum(
        t.numel() for per_param in state["optimizer"]["state"].values()
        for t in per_param.values() if t.dim() >= 1
    )
    result = {
        "step": state["step"],  # the optimizer state after this many steps (AdamW's own counters agree)
        "model_numel": model_numel,
        "optimizer_numel": optimizer_numel,
        "ratio": optimizer_numel / model_numel,
        "resume_bytes": os.path.getsize(args.resume),
    }
    write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
