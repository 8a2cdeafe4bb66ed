"""A resume file whose weights are stored in half precision, optimizer and generator left intact.

What MiniMind's lm_checkpoint does since late 2025 to keep resume files small; the halfresume
ablation resumes from it to measure what the rounding of the weights costs.
"""

import argparse

import torch

from mmkit.checkpoint import manager
from mmkit.checkpoint.files import cast_state_dict, save_atomic
from mmkit.checkpoint.entries import seal
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    state = manager.read(args.resume)
    # the fingerprint says so: resuming from it is refused unless --allow-mismatch, as it is not bit-exact
    fingerprint = {**state["fingerprint"], "weights_dtype": "float16"}
    halved = {**state, "model": cast_state_dict(state["model"], torch.float16), "fingerprint": fingerprint}
    save_atomic(seal(halved), args.out)


if __name__ == "__main__":
    run_cli(main)
