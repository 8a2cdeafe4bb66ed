"""What the resume file holds: weight elements vs AdamW state elements and their ratio (--json), and each
entry of the resume table (mmkit.checkpoint.entries.ENTRIES) with its tensor elements in this file (--entries:
docs/checkpoints.md's table, filled by make readme)."""

import argparse
import json
import os

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint import manager
from mmkit.errors import run_cli
from mmkit.checkpoint.entries import ENTRIES

TIED = "lm_head.weight"  # the embedding under a second name: one tensor, counted once


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--entries", required=True, help="markdown: the resume table, entry by entry")
    args = p.parse_args()

    state = manager.read(args.resume)
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
    write_text_atomic(args.entries, entries_table(state, args.resume))
    print(json.dumps(result))


def entries_table(state: dict, path) -> str:
    rows = [f"Each entry of `{os.path.basename(path)}` ({state['step']} steps), from the resume table "
            "(`ENTRIES`, `mmkit/checkpoint/entries.py`):", "",
            "| entry | tensor elements | sealed by a sha256 | what it is |", "|---|---|---|---|"]
    for e in ENTRIES:
        # as --json counts them: a tied tensor (lm_head.weight, the embedding) is one storage in the file,
        # counted once; AdamW's 0-dim step counters are not counted
        elements = sum({(t.data_ptr(), t.numel()): t.numel() for t in manager.tensors(state[e.name])
                        if t.dim() >= 1}.values())
        rows.append(f"| `{e.name}` | {f'{elements:,}' if elements else '—'} | {'yes' if e.sealed else 'no'} | "
                    f"{e.about} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    run_cli(main)
