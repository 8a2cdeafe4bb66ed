"""A resume file whose weights are stored in half precision, optimizer and generator left intact.

What MiniMind's lm_checkpoint does since late 2025 to keep resume files small; the halfresume
ablation resumes from it to measure what the rounding of the weights costs.
"""

import argparse

import torch

from mmkit.checkpoint import RESUME_KEYS, cast_state_dict, load_file, save_atomic
from mmkit.errors import UserError, run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    state = load_file(args.resume, "resume file")
    if not isinstance(state, dict) or any(k not in state for k in RESUME_KEYS):
        raise UserError(f"resume file {args.resume} is not a resume dict with keys {RESUME_KEYS}")
    save_atomic({**state, "model": cast_state_dict(state["model"], torch.float16)}, args.out)


if __name__ == "__main__":
    run_cli(main)
