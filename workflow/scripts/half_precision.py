"""Save a weights file in half precision and measure what that did: file sizes and logit change.

Writes OUT.pth (every tensor cast, the tied embedding kept one tensor) and a JSON with
fp32_bytes, <half>_bytes and max_logit_diff on the first seq_len tokens of the validation set.
"""

import argparse
import json
import os

import torch

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint.files import cast_state_dict, load_model, load_weights, save_atomic
from mmkit.config import load_config, model_config
from mmkit.data import load_tokens
from mmkit.errors import run_cli
from mmkit.model import MiniMindForCausalLM
from mmkit.train import EVAL_THREADS, logits_on

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--weights", required=True, help="fp32 weights file (straight.pth)")
    p.add_argument("--val", required=True, help="validation tokens .npy")
    p.add_argument("--dtype", choices=DTYPES, required=True)
    p.add_argument("--out", required=True, help="half-precision weights file")
    p.add_argument("--json", required=True)
    args = p.parse_args()

    cfg = load_config(args.config)
    arch, seq_len = model_config(cfg), cfg.seq_len
    torch.set_num_threads(EVAL_THREADS)
    val = load_tokens(args.val, arch.vocab_size, seq_len, "validation tokens")
    fp32 = MiniMindForCausalLM(arch)
    sd = load_weights(args.weights, fp32)
    fp32.load_state_dict(sd)
    save_atomic(cast_state_dict(sd, DTYPES[args.dtype]), args.out)
    # load_model widens the half weights back into an fp32 model: only the rounding differs
    half = load_model(args.out, MiniMindForCausalLM(arch))

    window = val[:seq_len]
    diff = (logits_on(fp32, window) - logits_on(half, window)).abs().max().item()
    result = {
        "fp32_bytes": os.path.getsize(args.weights),
        f"{args.dtype}_bytes": os.path.getsize(args.out),
        "max_logit_diff": diff,
        "tokens": len(window),
    }
    write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
